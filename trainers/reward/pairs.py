"""Preference pairs for reward-model training: a JSONL file of {prompt, chosen, rejected} lines.

    pairs = read_pairs("pairs.jsonl")            # PairsError "pairs.jsonl:7: ..." for the first bad line
    train, held_out = split_pairs(pairs, 0.1, seed=0)

Every line is one JSON object with three strings: `prompt`, `chosen` (the preferred answer) and
`rejected`. A line that is not JSON, lacks a key, holds a non-string, or whose chosen answer equals
its rejected one (a pair that teaches nothing and would be counted as a tie) is an error naming the
file and the line. Blank lines are skipped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from common.files import FileProblem, read_json_objects

KEYS = ("prompt", "chosen", "rejected")


class PairsError(ValueError):
    """A pairs file that cannot be used: FILE:LINE and what is wrong, in one line."""


@dataclass(frozen=True)
class PreferencePair:
    """One comparison: for `prompt`, `chosen` is preferred to `rejected`."""

    prompt: str
    chosen: str
    rejected: str
    line: int = 0  # where it came from (1-based), for messages


def _pair(path: Path, number: int, data: dict) -> PreferencePair:
    """The pair of one JSON object (line `number`); PairsError naming FILE:LINE when it is not one."""
    where = f"{path}:{number}"
    missing = [key for key in KEYS if key not in data]
    if missing:
        raise PairsError(f"{where}: missing {', '.join(repr(k) for k in missing)}; each line needs "
                         '{"prompt": ..., "chosen": ..., "rejected": ...}')
    wrong = [key for key in KEYS if not isinstance(data[key], str)]
    if wrong:
        raise PairsError(f"{where}: {', '.join(repr(k) for k in wrong)} must be a string, got "
                         f"{', '.join(type(data[k]).__name__ for k in wrong)}")
    if data["chosen"] == data["rejected"]:
        raise PairsError(f"{where}: 'chosen' equals 'rejected' (a pair must compare two different answers); "
                         "remove the line or fix one answer")
    return PreferencePair(data["prompt"], data["chosen"], data["rejected"], number)


def read_pairs(path: str | Path) -> list[PreferencePair]:
    """Every pair of a JSONL file, in order; PairsError (FILE:LINE) for the first bad line or an empty file.

    The file is read as every user file is (common.files.read_json_objects): a regular file (not a FIFO or
    a device), bounded in size, UTF-8, each line JSON bounded in nesting and digits."""
    path = Path(path)
    try:
        rows = read_json_objects(path, what=f"with {', '.join(KEYS)}")
    except FileProblem as problem:
        raise PairsError(str(problem)) from None
    pairs = [_pair(path, number, data) for number, data in rows]
    if not pairs:
        raise PairsError(f"{path}: no pairs (expected one JSON object per line with {', '.join(KEYS)})")
    return pairs


def split_pairs(pairs: list[PreferencePair], eval_fraction: float, seed: int = 0
                ) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(train, held_out): a seeded shuffle, `eval_fraction` of the pairs held out (at least 1 when the
    fraction is > 0 and at least 2 pairs exist; the training part always keeps one)."""
    if not 0 <= eval_fraction < 1:
        raise PairsError(f"--eval-fraction {eval_fraction}: expected a number in [0, 1), e.g. 0.1")
    order = list(pairs)
    random.Random(seed).shuffle(order)
    held = round(len(order) * eval_fraction)
    if eval_fraction > 0 and len(order) >= 2:
        held = min(max(held, 1), len(order) - 1)
    return order[held:], order[:held]
