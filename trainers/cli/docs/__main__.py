"""`python -m trainers.cli.docs [--check] [--root DIR]`: write (or check) the generated reference pages."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainers.cli.docs.generate import stale_pages, write_pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainers.cli.docs", description=__doc__)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[3],
                        help="the repository root (default: the one this module lives in)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages(args.root)
        for path in stale:
            print(f"{path}: stale; regenerate it with `make docs-gen` (python -m trainers.cli.docs)")
        return 1 if stale else 0
    for path in write_pages(args.root):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
