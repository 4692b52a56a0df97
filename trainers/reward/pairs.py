"""Preference pairs for reward-model training: a JSONL file of {prompt, chosen, rejected} lines.

    pairs = read_pairs("pairs.jsonl")            # PairsError "pairs.jsonl:7: ..." for the first bad line
    train, held_out = split_pairs(pairs, 0.1, seed=0)

Every line is one JSON object with three strings: `prompt`, `chosen` (the preferred answer) and
`rejected`. A line that is not JSON, lacks a key, holds a non-string, or whose chosen answer equals
its rejected one (a pair that teaches nothing and would be counted as a tie) is an error naming the
file and the line. Blank lines are skipped.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

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


def _parse_line(path: Path, number: int, line: str) -> PreferencePair:
    where = f"{path}:{number}"
    try:
        data = json.loads(line)
    except json.JSONDecodeError as error:
        raise PairsError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(data, dict):
        raise PairsError(f"{where}: expected a JSON object with {', '.join(KEYS)}")
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
    """Every pair of a JSONL file, in order; PairsError (FILE:LINE) for the first bad line or an empty file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PairsError(f"{path}: no such file; give a JSONL file of {{prompt, chosen, rejected}} lines") from None
    except (OSError, UnicodeDecodeError) as error:
        raise PairsError(f"{path}: cannot be read ({getattr(error, 'strerror', None) or error})") from None
    # split at newlines only: str.splitlines would also break at U+2028 and other separators JSON strings may hold
    pairs = [_parse_line(path, number, line.rstrip("\r")) for number, line in enumerate(text.split("\n"), start=1)
             if line.strip()]
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
