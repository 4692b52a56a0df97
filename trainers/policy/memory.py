"""Whether a model's weights fit the memory left, asked before it is loaded: one line when they do not.

    check_model_fits("train.model", "runs/x/model", "float32", "cpu")    ModelTooLarge, or nothing
    check_fits(what, parameters, 4, "cpu", fix)   the same for a known count (a GGUF file's: trainers/policy/gguf.py)
    model_parameters(directory)      parameters from the safetensors headers (exact), else from config.json
    available_bytes("cpu")           MemAvailable of /proc/meminfo (psutil elsewhere); a GPU's free memory

The need is the weights alone (parameters x bytes of the dtype they are loaded in): the least any load
takes, so a refusal is never a false alarm (training adds gradients and optimizer state on top). A
machine where the memory left cannot be read is not refused. Nothing here imports torch except for a
GPU's free memory.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from common.files import read_user_text
from common.model_files import safetensors_shapes

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1}
GIB = 1 << 30
CONFIG_BYTES = 16 << 20  # a config.json is kilobytes; a bigger one is not read for an estimate


class ModelTooLarge(ValueError):
    """A model whose weights do not fit the memory left (one line: what it needs, what is left, what to do)."""


def available_bytes(device: str = "cpu") -> int | None:
    """Bytes of memory left for a new model on `device` (cpu: MemAvailable; cuda: the GPU's free memory);
    None when it cannot be read."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0]) if torch.cuda.is_available() else None
    if device != "cpu":
        return None  # mps shares the host's memory through the OS: no figure to trust
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def _safetensors_parameters(path: Path) -> int:
    """The elements of every tensor a safetensors file declares in its header (no weights are read; a header
    that claims terabytes, or a FIFO in the file's place, is a ValueError, not a read)."""
    return sum(math.prod(shape) for shape in safetensors_shapes(path).values())


def _config_parameters(config: dict) -> int | None:
    """A decoder's parameters estimated from its config.json sizes (embeddings, attention, MLP), or None."""
    hidden = config.get("hidden_size") or config.get("n_embd")
    layers = config.get("num_hidden_layers") or config.get("n_layer")
    vocab = config.get("vocab_size")
    if not all(isinstance(v, int) and v > 0 for v in (hidden, layers, vocab)):
        return None
    heads = config.get("num_attention_heads") or config.get("n_head") or 1
    kv = hidden * (config.get("num_key_value_heads") or heads) // heads
    ff = config.get("intermediate_size") or config.get("n_inner") or 4 * hidden
    mlp = (3 if config.get("model_type") not in ("gpt2",) else 2) * hidden * ff
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", True) else 2)
    return embeddings + layers * (2 * hidden * hidden + 2 * hidden * kv + mlp)


def model_parameters(directory: str | Path) -> int | None:
    """The parameters of a Hugging Face model directory: exact from its safetensors headers, else estimated
    from .bin sizes or config.json; None when nothing says."""
    directory = Path(directory)
    try:
        files = sorted(directory.glob("*.safetensors"))
        if files:
            return sum(_safetensors_parameters(path) for path in files)
        config = json.loads(read_user_text(directory / "config.json", max_bytes=CONFIG_BYTES))  # never a FIFO
    except (OSError, ValueError, KeyError, RecursionError):
        return None
    if not isinstance(config, dict):
        return None
    stored = DTYPE_BYTES.get(str(config.get("torch_dtype") or config.get("dtype") or "float32"), 4)
    binaries = list(directory.glob("pytorch_model*.bin"))
    if binaries:
        return sum(path.stat().st_size for path in binaries) // stored
    return _config_parameters(config)


def _gib(size: float) -> str:
    """A size in the unit that shows it best: GiB, MiB or kB."""
    if size >= GIB / 10:
        return f"{size / GIB:.1f} GiB"
    return f"{size / (1 << 20):.0f} MiB" if size >= 1 << 20 else f"{size / 1024:.0f} kB"


def check_fits(what: str, parameters: int | None, bytes_each: int, device: str, fix: str,
               copies: int = 1) -> None:
    """ModelTooLarge when `copies` x `parameters` x `bytes_each` is more than the memory left on `device`."""
    need = (parameters or 0) * bytes_each * copies
    have = available_bytes(device)
    if have is None or need <= have:
        return
    where = "free GPU memory" if device.startswith("cuda") else "memory available (MemAvailable)"
    raise ModelTooLarge(f"{what}: its weights need {_gib(need)} ({parameters:,} parameters x {bytes_each} bytes"
                        f"{f' x {copies} copies' if copies > 1 else ''}) but only {_gib(have)} of {where} is left; "
                        f"{fix}")


def check_model_fits(what: str, directory: str | Path, dtype: str = "float32", device: str = "cpu",
                     fix: str | None = None) -> None:
    """ModelTooLarge (one line) when the model in `directory`, loaded in `dtype`, does not fit `device`'s memory
    (and, on a GPU, when it does not fit the host's memory it is read through either)."""
    name = str(dtype).removeprefix("torch.")
    bytes_each = DTYPE_BYTES.get(name, 4)
    fix = fix or (f"use a smaller model{', a 16-bit dtype (train.dtype bfloat16)' if bytes_each > 2 else ''}, "
                  "or free memory (close other jobs)")
    parameters = model_parameters(directory)
    check_fits(what, parameters, bytes_each, device, fix)
    if device != "cpu":
        check_fits(what, parameters, bytes_each, "cpu", fix)

