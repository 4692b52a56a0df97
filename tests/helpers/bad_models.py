"""Model directories that must be refused in one line (issue 12, bad input), made from a good fixture.

    broken_model_dir(good, tmp_path / "x", "no_config")   # no config.json
    broken_model_dir(good, tmp_path / "x", "bad_config")  # config.json is not JSON
    broken_model_dir(good, tmp_path / "x", "no_eos")      # a tokenizer with neither pad nor eos token
    broken_model_dir(good, tmp_path / "x", "no_pad")      # eos but no pad (accepted: eos pads)

`good` should be a Llama fixture directory: Qwen2 and GPT-2 tokenizers fall back to a default
<|endoftext|> eos when the tokenizer config names none, the generic backend Llama loads with does not.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

KINDS = ("no_config", "bad_config", "no_eos", "no_pad")


def broken_model_dir(good: Path, target: Path, kind: str) -> Path:
    """A copy of `good` broken as `kind` says (see the module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
    target = Path(target)
    shutil.copytree(good, target)
    if kind == "no_config":
        (target / "config.json").unlink()
    elif kind == "bad_config":
        (target / "config.json").write_text("{\"model_type\": \"llama\", ")
    else:
        path = target / "tokenizer_config.json"
        config = json.loads(path.read_text())
        config.pop("pad_token", None)
        if kind == "no_eos":
            config.pop("eos_token", None)
        path.write_text(json.dumps(config))
    return target
