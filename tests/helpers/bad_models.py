"""Model directories that must be refused in one line (issue 12, bad input), made from a good fixture.

    broken_model_dir(good, tmp_path / "x", "no_config")   # no config.json
    broken_model_dir(good, tmp_path / "x", "bad_config")  # config.json is not JSON
    broken_model_dir(good, tmp_path / "x", "no_eos")      # a tokenizer with neither pad nor eos token
    broken_model_dir(good, tmp_path / "x", "no_pad")      # eos but no pad (accepted: eos pads)

Hostile folders (issue 31), each of which a loader would answer with a traceback, a hang or worse:

    truncated          model.safetensors cut to half its bytes
    pickle             model.safetensors replaced by a pytorch_model.bin whose unpickling would create the
                       file `pickle_marker(target)` (it must never appear: pickles are never loaded)
    config_mismatch    config.json's hidden_size doubled (the weights keep theirs)
    extra_layers       config.json's num_hidden_layers one more than the weights hold
    untied_head        config.json's tie_word_embeddings false: the model has an lm_head the weights lack
    failing_template   a chat template that raises when rendered (chat_template.jinja)
    no_tokenizer       every tokenizer file removed
    fifo               tokenizer.json replaced by a named pipe (reading it would wait forever)

`good` should be a Llama fixture directory: Qwen2 and GPT-2 tokenizers fall back to a default
<|endoftext|> eos when the tokenizer config names none, the generic backend Llama loads with does not.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

KINDS = ("no_config", "bad_config", "no_eos", "no_pad")
HOSTILE = ("truncated", "pickle", "config_mismatch", "extra_layers", "untied_head", "failing_template", "no_tokenizer",
           "fifo")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "tokenizer.model")


def pickle_marker(target: Path) -> Path:
    """The file a hostile folder's pickle would create if it were ever unpickled."""
    return Path(target).parent / f"{Path(target).name}.UNPICKLED"


class Touch:
    """Unpickled, creates `path`: what a malicious pytorch_model.bin does (a harmless stand-in for code)."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return Path.touch, (Path(self.path),)


def broken_model_dir(good: Path, target: Path, kind: str) -> Path:
    """A copy of `good` broken as `kind` says (see the module docstring)."""
    if kind not in KINDS + HOSTILE:
        raise ValueError(f"unknown kind {kind!r}; known: {', '.join(KINDS + HOSTILE)}")
    target = Path(target)
    shutil.copytree(good, target)
    if kind in HOSTILE:
        make_hostile(target, kind)
    elif kind == "no_config":
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


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update({key: change(data[key]) for key, change in changes.items()})
    path.write_text(json.dumps(data))


def make_hostile(target: Path, kind: str) -> None:
    """Break the copy `target` as the hostile `kind` says (module docstring)."""
    weights = target / "model.safetensors"
    if kind == "truncated":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
    elif kind == "pickle":
        weights.unlink()
        (target / "pytorch_model.bin").write_bytes(pickle.dumps({"model.embed_tokens.weight": Touch(
            pickle_marker(target))}))
    elif kind == "config_mismatch":
        _edit_json(target / "config.json", hidden_size=lambda size: 2 * size)
    elif kind == "untied_head":
        _edit_json(target / "config.json", tie_word_embeddings=lambda tied: False)
    elif kind == "extra_layers":
        config = json.loads((target / "config.json").read_text())
        config["num_hidden_layers"] += 1
        config.pop("layer_types", None)  # transformers checks it against num_hidden_layers
        (target / "config.json").write_text(json.dumps(config))
    elif kind == "failing_template":
        (target / "chat_template.jinja").write_text("{{ raise_exception('this template always fails') }}")
    elif kind == "no_tokenizer":
        for name in TOKENIZER_FILES:
            (target / name).unlink(missing_ok=True)
    else:
        (target / "tokenizer.json").unlink()
        os.mkfifo(target / "tokenizer.json")
