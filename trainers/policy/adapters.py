"""LoRA adapters via peft: ONE frozen base model, one named adapter per trained policy.

With `train.lora` set, `build_actors` wraps the base in one `peft.PeftModel` and gives the 'shared'
policy and each 'own' agent an adapter of its own (named after the actor), all on the same base
weights in memory (no deep copy). An actor and its learner hold an `AdapterPolicy`, the pair
(peft model, adapter name): every forward through it first makes its adapter the only active one
(`set_adapter`), so a batched generate or a training forward for one actor runs with that actor's
adapter alone. Its `parameters()` and `state_dict()` are the adapter's only, so a learner's
optimizer, grad clipping, a self-play snapshot and a checkpoint see adapter weights and nothing else.

    reference_model(model, frozen_copy)    the KL reference: with LoRA the base with adapters disabled
                                           (`with peft_model.disable_adapter():`), else a frozen copy
    opponent_model(model, name, frozen_copy)   a frozen self-play opponent: with LoRA a frozen adapter
                                           on the same base (snapshots are adapter state dicts)
    load_adapter_dir(directory)            (peft model, tokenizer) of a saved adapter and its base
    export_merged(directory, out)          the adapter merged into its base, as a standalone model

A saved adapter directory is peft's own (`adapter_config.json`, `adapter_model.safetensors`, whose
`base_model_name_or_path` is the absolute base directory) plus `marl_base.json`: the base directory
and a fingerprint (sha256 of its config and weight files), so an adapter is never put on another base:
that is one line, `AdapterBaseError`, naming both. peft is imported inside functions only.
"""

from __future__ import annotations

import functools
import hashlib
import json
import zlib
from pathlib import Path

from common.files import read_user_text, write_directory_atomically
from common.model_files import adapter_folder_problem

ADAPTER_CONFIG = "adapter_config.json"
BASE_FILE = "marl_base.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin")
_FINGERPRINTS: dict[tuple, str] = {}  # (directory, (name, size, mtime) of its files) -> fingerprint


class AdapterBaseError(ValueError):
    """An adapter was trained on another base than the one given, its base is not there, or its folder's
    files cannot be used (a special file, pickle-only or truncated weights, an unreadable record)."""


def is_adapter_dir(path: str | Path) -> bool:
    """Whether `path` is a saved peft adapter directory (it has adapter_config.json)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def base_fingerprint(directory: str | Path) -> str:
    """sha256 of a model directory's config.json and weight files (computed once per process and file set)."""
    directory = Path(directory).resolve()
    files = sorted(p for p in directory.iterdir() if p.name == "config.json" or p.suffix in WEIGHT_SUFFIXES)
    key = (str(directory), tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files))
    if key not in _FINGERPRINTS:
        digest = hashlib.sha256()
        for path in files:
            digest.update(path.name.encode())
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        _FINGERPRINTS[key] = digest.hexdigest()
    return _FINGERPRINTS[key]


def lora_config(spec):
    """The `peft.LoraConfig` of a `train.lora` section (marl.scenario.spec.LoraSpec)."""
    from peft import LoraConfig

    targets = spec.target_modules if isinstance(spec.target_modules, str) else list(spec.target_modules)
    return LoraConfig(r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout, target_modules=targets,
                      task_type="CAUSAL_LM")


class AdapterBase:
    """One `PeftModel` over one frozen base model; adapters are added or loaded by name."""

    def __init__(self, base_model, base_dir: str | Path, tokenizer=None, *, seed: int = 0):
        self.base_dir, self.tokenizer, self.seed = Path(base_dir).resolve(), tokenizer, seed
        self.fingerprint = base_fingerprint(self.base_dir)
        for parameter in base_model.parameters():  # frozen: only adapters ever train
            parameter.requires_grad_(False)
        self.base_model, self.peft, self.active = base_model, None, None

    def add(self, name: str, spec_or_config, *, trainable: bool = True) -> AdapterPolicy:
        """A fresh adapter `name` (LoRA's B = 0: it starts as the base) from a LoraSpec or LoraConfig."""
        from peft import LoraConfig, get_peft_model

        import torch

        config = spec_or_config if isinstance(spec_or_config, LoraConfig) else lora_config(spec_or_config)
        config.base_model_name_or_path = str(self.base_dir)
        with torch.random.fork_rng(devices=[]):  # A's random init: the same for a seed and name in every process
            torch.manual_seed(self.seed * 1_000_003 + zlib.crc32(name.encode()))
            if self.peft is None:
                self.peft = get_peft_model(self.base_model, config, adapter_name=name)
            else:
                self.peft.add_adapter(name, config)
        self.active = None  # peft may have changed the active adapter
        return AdapterPolicy(self, name, trainable)

    def load(self, name: str, directory: str | Path, *, trainable: bool = True) -> AdapterPolicy:
        """The saved adapter in `directory` as adapter `name`; AdapterBaseError when it is for another base."""
        from peft import PeftModel

        directory = Path(directory)
        check_adapter_folder(directory)
        check_base(directory, self.base_dir, self.fingerprint)
        try:
            if self.peft is None:
                self.peft = PeftModel.from_pretrained(self.base_model, directory, adapter_name=name,
                                                      is_trainable=trainable)
            else:
                self.peft.load_adapter(directory, adapter_name=name, is_trainable=trainable)
        except (RuntimeError, ValueError, KeyError) as error:  # shapes or module names of another base
            raise AdapterBaseError(f"adapter {directory} does not fit the base {self.base_dir} "
                                   f"({' '.join(str(error).split())[:200]}); pass the base it was trained on") from None
        self.active = None
        return AdapterPolicy(self, name, trainable)

    def has(self, name: str) -> bool:
        """Whether an adapter of that name exists."""
        return self.peft is not None and name in self.peft.peft_config

    def activate(self, name: str, trainable: bool) -> None:
        """Make `name` the only active adapter (requires_grad on it alone, none when frozen)."""
        if self.active != (name, trainable):
            self.peft.set_adapter(name, inference_mode=not trainable)
            self.active = (name, trainable)


def check_base(adapter_dir: Path, base_dir: Path, fingerprint: str) -> None:
    """AdapterBaseError (one line naming both) when `adapter_dir` records another base than `base_dir`."""
    recorded = _recorded_base(adapter_dir)
    if recorded.get("base_fingerprint") not in (None, fingerprint):
        raise AdapterBaseError(
            f"adapter {adapter_dir} was trained on base {recorded.get('base_model_dir')} (fingerprint "
            f"{str(recorded['base_fingerprint'])[:12]}), not on {base_dir} (fingerprint {fingerprint[:12]}); "
            "use the base it was trained on (train.model for marl run and eval; --base DIR for marl serve, export "
            "and rollout)")


def check_adapter_folder(directory: Path) -> None:
    """AdapterBaseError (one line) when the adapter folder's files cannot be used: a FIFO or device among
    them, pickle-only weights (never unpickled) or a truncated adapter_model.safetensors."""
    if (problem := adapter_folder_problem(directory)) is not None:
        raise AdapterBaseError(f"adapter {problem}")


def _recorded_base(adapter_dir: Path) -> dict:
    """marl_base.json of a saved adapter, else what adapter_config.json names as its base ({} if nothing)."""
    for name in (BASE_FILE, ADAPTER_CONFIG):
        if not (adapter_dir / name).is_file():
            continue
        try:
            recorded = json.loads(read_user_text(adapter_dir / name, max_bytes=1 << 20))
        except (ValueError, RecursionError) as error:  # not JSON, not UTF-8, too large, a 5000-digit number
            reason = str(getattr(error, "reason", error)).split(";")[0]  # not Python's own tip on digit limits
            raise AdapterBaseError(f"adapter {adapter_dir}: {name} is unreadable ({reason[:200]}); save the adapter "
                                   "again") from None
        if not isinstance(recorded, dict):
            raise AdapterBaseError(f"adapter {adapter_dir}: {name} is not a JSON object; save the adapter again")
        if name == BASE_FILE:
            return recorded
        base = recorded.get("base_model_name_or_path")
        return {"base_model_dir": base} if isinstance(base, str) and base else {}
    return {}


class AdapterPolicy:
    """What an actor and its learner hold: (peft model, adapter name), used like the model itself.

    Calling it (or `forward`) activates its adapter first; `parameters`, `named_parameters`,
    `state_dict`, `load_state_dict` and `save_pretrained` are the adapter's only. Anything else
    (config, generation_config, device, ...) is the peft model's.
    """

    def __init__(self, owner: AdapterBase, name: str, trainable: bool = True):
        self.owner, self.name, self.trainable = owner, name, trainable
        base_forward = owner.base_model.forward

        @functools.wraps(base_forward)  # the base's signature: sampling reads its KV-cache keyword from it
        def forward(*args, **kwargs):
            owner.activate(name, self.trainable)
            return owner.peft(*args, **kwargs)

        self.forward = forward

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def __getattr__(self, attribute):  # only called for what this class does not define
        if attribute in ("owner", "name", "trainable"):
            raise AttributeError(attribute)
        return getattr(self.owner.peft, attribute)

    @property
    def peft_model(self):
        """The one peft model every adapter of this base lives in."""
        return self.owner.peft

    def named_parameters(self, *args, **kwargs):
        """(name, parameter) of this adapter's weights only (`...lora_A.<name>.weight` and the like)."""
        return ((n, p) for n, p in self.owner.peft.named_parameters() if _adapter_of(n) == self.name)

    def parameters(self, *args, **kwargs):
        """This adapter's weights only (what a learner's optimizer sees)."""
        return (p for _, p in self.named_parameters())

    def state_dict(self, *args, **kwargs) -> dict:
        """The adapter's state dict (peft's keys, without the adapter name)."""
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.owner.peft, adapter_name=self.name)

    def load_state_dict(self, state: dict, strict: bool = True):
        """Copy an adapter state dict (from `state_dict()`) into this adapter, in place."""
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.owner.peft, state, adapter_name=self.name)
        unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
        if strict and unexpected:
            raise RuntimeError(f"adapter {self.name}: unexpected keys {unexpected[:3]}")
        return result

    def eval(self) -> AdapterPolicy:
        """Eval mode (of the shared peft model: modes are per base, not per adapter)."""
        self.owner.peft.eval()
        return self

    def train(self, mode: bool = True) -> AdapterPolicy:
        """Train mode (of the shared peft model)."""
        self.owner.peft.train(mode)
        return self

    def save_pretrained(self, directory: str | Path, **kwargs) -> None:
        """peft's save_pretrained of this adapter alone, flat in `directory`, plus marl_base.json."""
        directory = Path(directory)
        self.owner.peft.save_pretrained(directory, selected_adapters=[self.name])
        nested = directory / self.name  # peft puts an adapter not named 'default' in a sub-folder
        if nested.is_dir():
            for path in nested.iterdir():
                path.replace(directory / path.name)
            nested.rmdir()
        (directory / BASE_FILE).write_text(json.dumps({
            "base_model_dir": str(self.owner.base_dir), "base_fingerprint": self.owner.fingerprint,
            "adapter": self.name}, indent=2))

    def check_saved_base(self, directory: str | Path) -> None:
        """AdapterBaseError when the adapter saved in `directory` was trained on another base than this one."""
        check_base(Path(directory), self.owner.base_dir, self.owner.fingerprint)


def _adapter_of(parameter_name: str) -> str | None:
    """The adapter a peft parameter belongs to (the part after `lora_*`), None for a base weight."""
    parts = parameter_name.split(".")
    return next((parts[i + 1] for i, part in enumerate(parts[:-1]) if part.startswith("lora_")), None)


class BaseReference:
    """The base model with every adapter disabled: the KL reference under LoRA (nothing copied)."""

    trainable = False

    def __init__(self, owner: AdapterBase):
        self.owner = owner

    def __call__(self, *args, **kwargs):
        with self.owner.peft.disable_adapter():
            return self.owner.peft(*args, **kwargs)

    def parameters(self):
        """The base's weights (frozen; read for their dtype)."""
        return self.owner.base_model.parameters()

    def state_dict(self) -> dict:
        """Nothing: the base is frozen, and it is the run's base model directory (marl_base.json)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore: the reference stays the frozen base (a warm-up trains adapters only)."""

    def eval(self) -> BaseReference:
        """A no-op (the base's mode is the peft model's)."""
        return self


def reference_model(model, frozen_copy):
    """The KL reference of a policy: with LoRA the base with adapters disabled, else `frozen_copy(model)`."""
    return BaseReference(model.owner) if isinstance(model, AdapterPolicy) else frozen_copy(model)


def opponent_model(model, name: str, frozen_copy):
    """A frozen self-play opponent: with LoRA adapter `name` on the same base holding `model`'s adapter
    weights (a snapshot then is an adapter state dict), else `frozen_copy(model)`."""
    if not isinstance(model, AdapterPolicy):
        return frozen_copy(model)
    owner = model.owner
    opponent = (AdapterPolicy(owner, name, trainable=False) if owner.has(name)
                else owner.add(name, owner.peft.peft_config[model.name], trainable=False))
    opponent.load_state_dict(model.state_dict())
    return opponent


def load_adapter_dir(directory: str | Path, base_dir: str | Path | None = None, name: str = "adapter"):
    """(AdapterPolicy, tokenizer) of a saved adapter on its base (the recorded one unless `base_dir`).

    AdapterBaseError when the base is not there or is another model than the adapter was trained on.
    """
    from trainers.policy.tinylm import load_policy

    directory = Path(directory)
    check_adapter_folder(directory)  # before any of its files is read
    base = Path(base_dir) if base_dir is not None else recorded_base_dir(directory)
    model, tokenizer = load_policy(base)
    if (directory / "tokenizer_config.json").is_file():  # a checkpoint saves the tokenizer next to the adapter
        tokenizer = _tokenizer(directory)
    return AdapterBase(model, base, tokenizer).load(name, directory, trainable=False).eval(), tokenizer


def recorded_base_dir(directory: Path) -> Path:
    """The base directory a saved adapter names; AdapterBaseError when it names none or it is not there."""
    recorded = _recorded_base(directory).get("base_model_dir")
    if recorded is not None and not isinstance(recorded, str):
        raise AdapterBaseError(f"adapter {directory}: {BASE_FILE} names base {str(recorded)[:80]!r}, not a directory "
                               "path; pass the base model directory with --base DIR")
    if not recorded:
        raise AdapterBaseError(f"adapter {directory} names no base model (no base_model_name_or_path in "
                               f"{ADAPTER_CONFIG}); pass the base model directory with --base DIR")
    if not (Path(recorded) / "config.json").is_file():
        raise AdapterBaseError(f"adapter {directory} was trained on base {recorded}, which is not there "
                               "(no config.json); pass that base model directory with --base DIR")
    return Path(recorded)


def _tokenizer(directory: Path):
    """The tokenizer saved next to an adapter, padded as load_policy pads (AdapterBaseError when it does not load)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
    except Exception as error:  # noqa: BLE001 - transformers raises many kinds; all mean "cannot load"
        raise AdapterBaseError(f"adapter {directory}: its tokenizer does not load ({type(error).__name__}: "
                               f"{' '.join(str(error).split())[:200]}); save the adapter's tokenizer again") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def export_merged(directory: str | Path, out: str | Path, base_dir: str | Path | None = None) -> Path:
    """Write the adapter in `directory` merged into its base as a standalone Hugging Face directory `out`."""
    policy, tokenizer = load_adapter_dir(directory, base_dir)
    merged = policy.owner.peft.merge_and_unload()

    def write(target: Path) -> None:
        merged.save_pretrained(target)
        tokenizer.save_pretrained(target)

    write_directory_atomically(Path(out), write)  # an existing `out` is replaced whole
    return Path(out)
