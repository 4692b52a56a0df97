"""Pairwise items with a gold answer, written as `marl judges report --items` reads them: odd items put the
good candidate first, even ones second, so a judge that favours a position is caught."""

from __future__ import annotations

import json
from pathlib import Path


def write_items(path: Path, count: int) -> Path:
    """`count` items at `path` (JSONL): a clear, correct explanation against a vague one, gold the former."""
    lines = []
    for i in range(count):
        good, bad = f"A clear and correct explanation of topic {i}.", f"Topic {i} is a thing."
        candidates, gold = ([good, bad], 0) if i % 2 else ([bad, good], 1)
        lines.append(json.dumps({"id": f"q{i}", "prompt": f"Explain topic {i}.", "candidates": candidates,
                                 "gold": gold}))
    path.write_text("\n".join(lines) + "\n")
    return path
