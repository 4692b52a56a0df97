"""A model folder's files checked before any loader reads them: each problem is one line naming the
folder, the file and the fix (issue 31: no command answers a bad model folder with a traceback).

    model_folder_problem(path)       what is wrong with a Hugging Face model folder's files, or None
    adapter_folder_problem(path)     the same for a peft LoRA adapter folder
    safetensors_shapes(path)         name -> shape of every tensor a safetensors file declares (its header only)
    shape_problem(path)              a config.json whose model has other tensor shapes than the weights

Why each check, and why here rather than in the loaders' own errors:

    special files      a FIFO or /dev/zero named config.json or model.safetensors makes a loader wait or
                       read forever; every file of the folder must be a regular file (os.stat, no open),
                       and a settings or vocabulary file (read whole) at most 256 MiB
    pickle weights     only safetensors weights are ever loaded: a pytorch_model.bin (or *.pt, *.ckpt) is a
                       pickle, and unpickling one can run code. torch's weights_only unpickler would refuse
                       most, but a folder with pickle weights alone is refused here, unread
    safetensors        a file cut short or not safetensors at all: its header is read (bounded, as the
                       safetensors library bounds it) and checked against the file's size, so a truncated
                       copy is named as one instead of a deserialising error
    tokenizer          transformers 5 builds an empty tokenizer for a folder without tokenizer files, which
                       then encodes every prompt to nothing; a folder without any is refused
    config vs weights  config.json edited (hidden_size, vocab_size, num_hidden_layers): more layers than the
                       weights hold is refused from the names alone; otherwise the model it describes is built
                       on torch's meta device (no memory) and its tensor shapes compared with the headers', so
                       the mismatch is named, and a config claiming a huge model allocates nothing

Standard library only, except `shape_problem` (torch and transformers, imported when called). Used by
common.chat.check_model_dir and trainers.policy.loading (every command that loads a model: run, eval,
rollout, export, rm train), the reward-model judge, local judges, `marl serve`'s loader, the memory
check and `marl export`'s copies.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from pathlib import Path

from common.files import read_user_head, user_file_problem

SAVE_FIX = "pass a directory written by save_pretrained (config.json, weights, tokenizer)"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
NOT_WEIGHTS = ("training_args.bin",)  # a Trainer's pickled settings: never loaded, so not refused
TOKENIZER_VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                         "sentencepiece.bpe.model", "tiktoken.model")
SHARD_INDEX = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit on a header
MAX_INDEX_BYTES = 64 << 20
METADATA_SUFFIXES = (".json", ".jinja", ".txt")  # read whole by transformers (weights are memory-mapped)
MAX_METADATA_BYTES = 256 << 20  # the largest tokenizer.json (a 256k vocabulary) is about 35 MB
LAYER_KEY = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")  # model.layers.3., transformer.h.3., ...
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8,
               "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def _special_file_problem(directory: Path) -> str | None:
    """The first entry of the folder that is not a regular file or a folder (a FIFO, a device, a socket,
    a broken link), or a metadata file (JSON, a template, a vocabulary) too large to be one, in one line;
    nothing is opened."""
    for entry in sorted(os.scandir(directory), key=lambda entry: entry.name):
        if entry.is_dir():
            continue
        problem = user_file_problem(entry.path, "the model's own file (save_pretrained writes regular files)")
        if problem is not None:
            return f"{directory}: {entry.name} {problem}"
        size = entry.stat().st_size
        if entry.name.endswith(METADATA_SUFFIXES) and size > MAX_METADATA_BYTES:
            return (f"{directory}: {entry.name} is {size:,} bytes, over the {MAX_METADATA_BYTES:,} a model's "
                    "settings or vocabulary take; save the model again")
    return None


def safetensors_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, from a safetensors file's header; ValueError (the reason, in words, after the
    file's name) when the file is cut short or is not safetensors. No tensor data is read."""
    path = Path(path)
    size = path.stat().st_size
    if size < 8:
        raise ValueError(f"is {size} bytes, shorter than a safetensors header: the file is truncated")
    (length,) = struct.unpack("<Q", read_user_head(path, 8))
    if length > MAX_HEADER_BYTES:
        raise ValueError(f"declares a {length:,}-byte header (safetensors allows {MAX_HEADER_BYTES:,}): "
                         "not a safetensors file")
    if 8 + length > size:
        raise ValueError(f"is {size:,} bytes but its header alone needs {8 + length:,}: the file is truncated")
    try:
        header = json.loads(read_user_head(path, 8 + length)[8:].decode("utf-8"))
    except (ValueError, RecursionError):  # not UTF-8, not JSON, a 5000-digit number, nesting 10^5 deep
        raise ValueError("has a header that is not safetensors JSON: not a safetensors file") from None
    if not isinstance(header, dict):
        raise ValueError("has a header that is not a JSON object: not a safetensors file")
    shapes, end = {}, 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape, span = _entry(name, entry)
        shapes[name], end = shape, max(end, span)
    data = size - 8 - length
    if end > data:
        raise ValueError(f"is {size:,} bytes but its header says {8 + length + end:,}: the file is truncated")
    if end < data:
        raise ValueError(f"has {data - end:,} bytes after its last tensor: not a whole safetensors file")
    return shapes


def _entry(name: str, entry) -> tuple[tuple[int, ...], int]:
    """(shape, end offset) of one header entry; ValueError when it is malformed."""
    try:
        shape = tuple(entry["shape"])
        begin, end = entry["data_offsets"]
        width = DTYPE_BYTES.get(entry["dtype"])
        valid = all(type(n) is int and n >= 0 for n in (*shape, begin, end)) and begin <= end
    except (KeyError, TypeError, ValueError):
        valid = False
    if not valid or (width is not None and math.prod(shape) * width != end - begin):
        raise ValueError(f"has a malformed header entry for {name[:80]!r}: not a safetensors file")
    return shape, end


def _weights_problem(directory: Path, names: list[str], what: str) -> str | None:
    """Pickle-only, missing or damaged safetensors weights of a folder whose safetensors files are `names`."""
    if not names:
        if pickles := _pickles(directory):
            return (f"{directory}: its weights are pickle files ({', '.join(pickles[:3])}), which marl never loads "
                    "(unpickling a file can run code); convert them to safetensors where you trust them "
                    "(from_pretrained, then save_pretrained writes model.safetensors)")
        return f"{directory}: no weights (no *.safetensors file); {what}"
    for name in names:
        try:
            safetensors_shapes(directory / name)
        except (ValueError, OSError) as error:
            return f"{directory}: {name} {_reason(error)}; copy or save the model again"
    return None


def _pickles(directory: Path) -> list[str]:
    """The names of the folder's pickle weight files (pytorch_model.bin, *.pt, ...)."""
    return sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES and p.name not in NOT_WEIGHTS)


def _reason(error: Exception) -> str:
    """An error's words without the path a FileProblem puts first (the caller names the file)."""
    return getattr(error, "reason", None) or str(error)


def _shards_problem(directory: Path) -> str | None:
    """A shard index naming a file that is not a plain file name in the folder, or not there."""
    index = directory / SHARD_INDEX
    if not index.exists():
        return None
    try:
        if index.stat().st_size > MAX_INDEX_BYTES:
            raise ValueError(f"is larger than {MAX_INDEX_BYTES:,} bytes")
        weight_map = json.loads(read_user_head(index, MAX_INDEX_BYTES).decode("utf-8"))["weight_map"]
        shards = set(weight_map.values())
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError, OSError) as error:
        return f"{directory}: {SHARD_INDEX} is not a shard index ({_reason(error)[:120]}); copy or save the model again"
    for shard in sorted(shards, key=str):
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            return (f"{directory}: {SHARD_INDEX} names {str(shard)[:80]!r}, not a file of the folder; save the "
                    "model again")
        if not (directory / shard).is_file():
            return f"{directory}: {SHARD_INDEX} names {shard}, which is not there; copy the missing shard"
    return None


def model_folder_problem(path: str | Path, *, require_weights: bool = True) -> str | None:
    """What is wrong with a Hugging Face model folder's files (module docstring), in one line naming the
    folder and the fix; None when they look loadable. Reads file headers only, never weights.
    `require_weights=False` lets a folder without any weight file pass (its loader says so later: a
    check that runs before the memory check, which only needs config.json)."""
    directory = Path(path)
    try:
        return _folder_problem(directory, require_weights)
    except OSError as error:  # a name too long for the file system (pathlib's exists() raises it), EIO
        return f"{str(directory)[:200]}: cannot be read ({error.strerror or error}); {SAVE_FIX}"


def _folder_problem(directory: Path, require_weights: bool) -> str | None:
    """model_folder_problem's checks, in order (an OSError is its caller's one line)."""
    if not directory.is_dir():
        return f"{directory} is not a directory; {SAVE_FIX}"
    if not (directory / "config.json").exists():
        return f"{directory} is not a Hugging Face model directory (no config.json); {SAVE_FIX}"
    problem = _special_file_problem(directory)
    if problem is None:
        names = sorted(p.name for p in directory.glob("*.safetensors"))
        unweighted = not names and not require_weights and not _pickles(directory)
        problem = None if unweighted else _weights_problem(directory, names, SAVE_FIX) or _shards_problem(directory)
    if problem is None and not any((directory / name).is_file() for name in TOKENIZER_VOCAB_FILES):
        problem = (f"{directory}: no tokenizer (none of {', '.join(TOKENIZER_VOCAB_FILES[:4])}, ...); save the "
                   "tokenizer into it (tokenizer.save_pretrained(DIR)) or copy the base model's tokenizer files")
    return problem


def adapter_folder_problem(path: str | Path) -> str | None:
    """What is wrong with a peft adapter folder's files (special files, pickle or damaged weights), or None."""
    directory = Path(path)
    problem = _special_file_problem(directory)
    if problem is not None:
        return problem
    names = ["adapter_model.safetensors"] if (directory / "adapter_model.safetensors").exists() else []
    return _weights_problem(directory, names, "save the adapter again (save_pretrained)")


def _stored_shapes(directory: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Tensor name -> (shape, file) over the folder's safetensors files; {} when one is damaged (the folder
    check names it)."""
    stored = {}
    try:
        for file in sorted(directory.glob("*.safetensors")):
            stored.update({name: (shape, file.name) for name, shape in safetensors_shapes(file).items()})
    except (ValueError, OSError):
        return {}
    return stored


def _layers_problem(directory: Path, stored: dict) -> str | None:
    """One line when config.json declares more layers than the weights hold: checked before the model is
    built, since building a config's million layers (even on the meta device) takes minutes."""
    try:
        config = json.loads(read_user_head(directory / "config.json", MAX_INDEX_BYTES).decode("utf-8"))
        declared = config.get("num_hidden_layers", config.get("n_layer"))
    except (ValueError, RecursionError, OSError, AttributeError):
        return None  # the loader says what is wrong with it
    found = {match.group(1) for name in stored if (match := LAYER_KEY.search(name))}
    if type(declared) is not int or not found or declared <= len(found):
        return None
    return (f"{directory}: config.json does not match the weights: it declares {declared:,} layers "
            f"(num_hidden_layers) but the weights hold {len(found)}; use the config.json saved with these weights")


def shape_problem(path: str | Path) -> str | None:
    """One line when config.json describes a model whose tensors have other shapes than the weights declare
    (hidden_size or vocab_size edited) or more layers than they hold, else None; also None when the config
    builds no causal LM here (the loader then says why). The model is built on torch's meta device: it
    allocates nothing."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = Path(path)
    stored = _stored_shapes(directory)
    if not stored:
        return None  # no weights to compare with (the loader says so)
    if (problem := _layers_problem(directory, stored)) is not None:
        return problem
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory))
    except Exception:  # noqa: BLE001 - remote code, an unknown type, a config that builds nothing: the loader says
        return None
    prefix = f"{getattr(model, 'base_model_prefix', '')}."
    stored = {name.removeprefix(prefix): entry for name, entry in stored.items()}  # a base model's saved keys
    wrong = [(name, stored[key][0], stored[key][1], tuple(tensor.shape))
             for name, tensor in model.state_dict().items()
             if (key := name.removeprefix(prefix)) in stored and stored[key][0] != tuple(tensor.shape)]
    if not wrong:
        return None
    name, found, file, expected = wrong[0]
    more = f" (and {len(wrong) - 1} more tensors)" if len(wrong) > 1 else ""
    return (f"{directory}: config.json does not match the weights: {name} is {list(found)} in {file} but "
            f"config.json makes it {list(expected)}{more}; use the config.json saved with these weights")
