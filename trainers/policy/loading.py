"""Where a policy lives and in what precision: device and dtype resolution, and loading a model there.

    resolve_device("auto")            "cuda" when torch sees one, else "mps", else "cpu"
    resolve_dtype("auto", device)     torch.bfloat16 on a GPU that has it, else torch.float32
    load_policy(path, device=, dtype=) any local Hugging Face causal LM, on that device in that dtype
    check_model_folder(path)          a folder that does not load: one line (ModelLoadError), before loading
    place_actors(actors, device, dtype) models already built (the team's actors) moved there, with
                                      their sampling generators remade on the same device and seed
    model_device(model)               the device of a model's weights (every tensor of a step follows it)
    place_autocast(actors, "auto", "cpu") float32 weights under bfloat16 autocast where the CPU computes
                                      bfloat16 natively (avx512_bf16, amx_bf16), else plain float32

The trainers never read `train.device` themselves: they put every tensor and generator on the device
of the model they were given, so a model built on the CPU in a test stays on the CPU whatever the
config says. A device or dtype the machine cannot do is a `PlacementError`: one line naming the
problem and the fix (the CLI prints it and exits 2, before any model is loaded).
"""

from __future__ import annotations

from pathlib import Path

import torch

from common.model_files import model_folder_problem, shape_problem
from marl.options import DEVICES, DTYPES

DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(ValueError, RuntimeError):
    """A model directory that does not load (one line). A ValueError and a RuntimeError, like
    PlacementError, so both `marl run` and `marl demo` print it and exit 2."""


class PlacementError(ValueError, RuntimeError):
    """A device or dtype this machine cannot do (one line: the problem and the fix).

    A ValueError for `marl run`'s error path and a RuntimeError for `marl demo`'s: both print it and exit 2.
    """


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def resolve_device(name: str = "auto", section: str = "train") -> str:
    """The device to run on: `auto` = cuda when torch sees one, else mps, else cpu; a named device must
    exist. Errors name the setting `{section}.device` (train for a scenario, grpo for the demo)."""
    if name not in DEVICES:
        raise PlacementError(f"{section}.device={name!r} is not one of {', '.join(DEVICES)}; use auto or cpu")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if _mps_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise PlacementError(f"{section}.device=cuda but torch sees no CUDA device; use cpu or auto")
    if name == "mps" and not _mps_available():
        raise PlacementError(f"{section}.device=mps but torch sees no MPS (Apple GPU) device; use cpu or auto")
    return name


def _supports_bfloat16(device: str) -> bool:
    """Whether the device computes in bfloat16: every CPU does (slowly); a GPU only when its hardware has it."""
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.cuda.is_bf16_supported()
    if kind == "mps":
        try:  # older macOS versions have no bfloat16 kernels
            torch.ones(1, dtype=torch.bfloat16, device="mps").sum().item()
        except (RuntimeError, TypeError):
            return False
    return True


def resolve_dtype(name: str, device: str, section: str = "train", purpose: str = "train") -> torch.dtype:
    """The weights' dtype on `device`: `auto` = bfloat16 on a GPU that supports it, else float32.

    float16 is refused on the CPU (no training kernels worth having and no loss scaling there), and
    bfloat16 on a GPU without it; logprobs and the loss are float32 whatever the weights are. Errors
    name the setting `{section}.dtype` and what cannot be done (`purpose`: train, evaluate).
    """
    if name not in DTYPES:
        raise PlacementError(f"{section}.dtype={name!r} is not one of {', '.join(DTYPES)}; use auto or float32")
    kind = torch.device(device).type
    if name == "auto":
        return torch.bfloat16 if kind in ("cuda", "mps") and _supports_bfloat16(device) else torch.float32
    if name == "float16" and kind == "cpu":
        raise PlacementError(f"{section}.dtype=float16 cannot {purpose} on the cpu (no half-precision kernels or "
                             f"loss scaling there); use float32 or bfloat16, or {section}.device=cuda")
    if name == "bfloat16" and not _supports_bfloat16(device):
        raise PlacementError(f"{section}.dtype=bfloat16 but this {kind} device has no bfloat16 support; "
                             "use float16 or float32")
    return DTYPE_NAMES[name]


def placement(device: str = "auto", dtype: str = "auto", *, section: str = "train",
              purpose: str = "train") -> tuple[str, torch.dtype]:
    """(device, dtype) from the `{section}.device` and `{section}.dtype` settings, checked (PlacementError)."""
    resolved = resolve_device(device, section)
    return resolved, resolve_dtype(dtype, resolved, section, purpose)


def _as_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPE_NAMES:
        raise PlacementError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_NAMES)}; use float32")
    return DTYPE_NAMES[dtype]


def load_policy(path: str | Path, *, device: str = "cpu", dtype: str | torch.dtype = "float32"):
    """Load any local Hugging Face causal LM directory: returns (model in eval mode on `device` in
    `dtype`, tokenizer with a pad token and left padding). `device` and `dtype` are resolved names
    (see `placement`); the defaults keep the CPU float32 model every test and the demo use.

    FileNotFoundError without config.json; ModelLoadError (one line naming the directory and the fix)
    for a folder that does not load: see `check_model_folder` and `load_model`."""
    from transformers import AutoTokenizer

    path = Path(path).resolve()  # absolute: peft records the base's name_or_path in saved adapters
    check_model_folder(path)
    tokenizer = _loaded(path, lambda: AutoTokenizer.from_pretrained(path))
    model = load_model(path, dtype).to(device)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model.eval(), tokenizer


def check_model_folder(path: str | Path) -> None:
    """FileNotFoundError when `path` has no config.json; ModelLoadError (one line) when its files cannot be
    loaded: a special file, pickle-only or truncated weights, no tokenizer, a config.json that does not
    match the weights (common/model_files.py). Reads headers only: nothing is unpickled or allocated."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a Hugging Face model directory (no config.json); "
                                "pass a directory written by save_pretrained")
    problem = model_folder_problem(path) or shape_problem(path)
    if problem is not None:
        raise ModelLoadError(problem)


def load_model(path: str | Path, dtype: str | torch.dtype = "float32", auto_class=None, *, new_head: bool = False,
               what: str = "a causal LM", **options):
    """The model of a folder `check_model_folder` passed, on the CPU in `dtype`, from its safetensors weights
    only (never a pickle); `auto_class` is the transformers Auto class (default: the causal LM), `options`
    go to its from_pretrained (num_labels=1). ModelLoadError (one line) when it does not load, or when the
    weights lack a tensor of the config's model (transformers would fill it with random numbers); with
    `new_head`, tensors outside the base model (a reward model's new scalar head) may be missing. `what`
    names the kind of model in the message."""
    from transformers import AutoModelForCausalLM

    auto_class = auto_class or AutoModelForCausalLM
    model, info = _loaded(path, lambda: auto_class.from_pretrained(
        path, dtype=_as_dtype(dtype), use_safetensors=True, output_loading_info=True, **options), what)
    backbone = f"{getattr(model, 'base_model_prefix', '')}."
    missing = sorted(key for key in info.get("missing_keys") or () if not new_head or key.startswith(backbone))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(f"{path}: config.json does not match the weights: its model has {missing[0]}{more}, "
                             "which the weights do not hold; use the config.json saved with these weights")
    return model


def _loaded(path: Path, load, what: str = "a causal LM"):
    """`load()`, with whatever transformers, safetensors or jinja raise as one ModelLoadError line (as `marl
    serve` answers a model that does not load); a PlacementError and a ModelLoadError pass as they are."""
    try:
        return load()
    except (ModelLoadError, PlacementError):
        raise
    except Exception as error:  # noqa: BLE001 - no weights, a broken config or tokenizer: one line, not a traceback
        reason = " ".join(str(error).split())[:200]
        raise ModelLoadError(f"{path} does not load as {what} ({type(error).__name__}: {reason}); pass a "
                             "directory written by save_pretrained (config.json, weights and tokenizer)") from None


def _same_device(a: torch.device, b: torch.device) -> bool:
    """`cuda` and `cuda:0` are one device (torch.device compares them unequal)."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def model_device(model) -> torch.device:
    """The device of a model's weights (the CPU for a model without parameters)."""
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def compute_dtype(model) -> torch.dtype:
    """The dtype the model computes in: its input embedding's (a LoRA adapter's own weights may be float32
    on a bfloat16 base), else its first parameter's."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(embeddings, "weight", None)
    return weight.dtype if weight is not None else next(model.parameters()).dtype


def set_attention(model, name: str = "auto", section: str = "train") -> None:
    """Switch a model's attention kernels to `name` (marl.options.ATTENTIONS; auto leaves them), or
    PlacementError in one line when this machine cannot run them (flash_attention_2 without flash-attn
    or CUDA). A LoRA AdapterPolicy switches its shared base."""
    if name == "auto":
        return
    target = getattr(getattr(model, "owner", None), "peft", model)  # an AdapterPolicy: its peft model
    if not hasattr(target, "set_attn_implementation"):
        target = getattr(target, "base_model", target)
    try:
        target.set_attn_implementation(name)
    except (ImportError, ValueError, RuntimeError, AttributeError) as error:
        reason = " ".join(str(error).split())[:160]
        raise PlacementError(f"{section}.attention={name}: this model or machine cannot use it ({reason}); use auto, "
                             "sdpa or eager") from None


def place_actors(actors: dict, device: str, dtype: str | torch.dtype, attention: str = "auto") -> None:
    """Move every model-backed actor's model to `device` in `dtype`, in place.

    A moved actor's sampling generator is remade on the new device from the same seed (nothing has been
    drawn from it yet when a run places its actors); a model already there is left untouched, so on the
    CPU in float32 this changes nothing. `attention` (train.attention) switches every model's kernels.
    """
    dtype = _as_dtype(dtype)
    for actor in actors.values():
        model = getattr(actor, "model", None)
        if model is None:
            continue
        set_attention(model, attention)
        if compute_dtype(model) != dtype:
            model.to(dtype=dtype)
        if not _same_device(model_device(model), torch.device(device)):
            model.to(device=device)
        generator = getattr(actor, "generator", None)
        if generator is not None and not _same_device(generator.device, model_device(model)):
            actor.generator = torch.Generator(device=model_device(model)).manual_seed(generator.initial_seed())


# -- bfloat16 autocast on CPUs that compute it natively ----------------------------------------------

AUTOCAST_MIN_PARAMETERS = 20_000_000
"""Below this a model keeps plain float32 under dtype auto: the embedded tiny model (1.6M parameters) and
test fixtures then compute the same numbers on every machine, and their small matmuls gain little."""
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_bf16_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> list[str]:
    """The CPU flags among NATIVE_BF16_FLAGS this machine has (none where /proc/cpuinfo is unreadable)."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return [flag for flag in NATIVE_BF16_FLAGS if flag in flags]


def autocast_choice(setting: str, device: str, parameters: int, flags: list[str] | None = None
                    ) -> tuple[torch.dtype | None, str]:
    """(bfloat16 or None, why): whether dtype `setting` runs a float32 CPU model of `parameters` under
    bfloat16 autocast. Only `auto` on a CPU whose hardware computes bfloat16 (avx512_bf16 or amx_bf16) does,
    for models of at least AUTOCAST_MIN_PARAMETERS; weights, optimizer state and the loss stay float32."""
    if setting != "auto" or torch.device(device).type != "cpu":
        return None, f"dtype {setting} on {device}"
    flags = cpu_bf16_flags() if flags is None else flags
    if not flags:
        return None, "float32: this CPU has no native bfloat16 (neither avx512_bf16 nor amx_bf16)"
    if parameters < AUTOCAST_MIN_PARAMETERS:
        return None, f"float32: a model of {parameters:,} parameters stays in exact float32 (autocast from " \
                     f"{AUTOCAST_MIN_PARAMETERS:,})"
    return torch.bfloat16, f"float32 weights under bfloat16 autocast: this CPU has {' and '.join(flags)}"


def transformers_model(model):
    """The transformers model inside `model`: itself, a peft model's base, or an AdapterPolicy's shared base
    (whose own parameters() are its adapter's alone)."""
    target = getattr(getattr(model, "owner", None), "peft", model)  # an AdapterPolicy: its peft model
    if hasattr(target, "peft_config") and hasattr(target, "get_base_model"):  # peft calls the model's forward
        target = target.get_base_model()
    return target


def enable_autocast(model, dtype: torch.dtype) -> None:
    """Run every forward of `model` (a transformers model, a peft model or an AdapterPolicy) under CPU
    autocast to `dtype`; backward follows the forward's dtypes.

    The innermost transformers model gets a subclass of its own class, of the same name, whose forward
    enters autocast: peft's wrappers, the sampler and the learner all pass through it, a deep copy (the
    KL reference) keeps it, and save_pretrained still records the original architecture's name."""
    target = transformers_model(model)
    plain = type(target)
    if getattr(plain, "marl_autocast", None) == dtype:
        return

    def forward(self, *args, **kwargs):
        with torch.autocast("cpu", dtype=dtype):
            return plain.forward(self, *args, **kwargs)

    target.__class__ = type(plain.__name__, (plain,), {"forward": forward, "marl_autocast": dtype,
                                                        "__qualname__": plain.__qualname__,
                                                        "__module__": plain.__module__})


def place_autocast(actors: dict, setting: str, device: str, log=print) -> torch.dtype | None:
    """Apply `autocast_choice` to every model-backed actor and log the choice once; returns the dtype."""
    models = [actor.model for actor in actors.values() if getattr(actor, "model", None) is not None]
    if not models:
        return None
    # the whole model's size decides (base and adapters), not what a LoRA learner trains
    parameters = max(sum(p.numel() for p in transformers_model(model).parameters()) for model in models)
    dtype, why = autocast_choice(setting, device, parameters)
    log(f"precision: {why}")
    for model in models if dtype is not None else ():
        enable_autocast(model, dtype)
    return dtype
