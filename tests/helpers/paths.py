"""Where things are in the repository, for tests in any room (tests/<package>/<room>/...)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""the repository root (the folder holding marl/, judges/, trainers/ and scenarios/)"""
SCENARIOS = ROOT / "scenarios"
BENCH = ROOT / "bench"
FIXTURES = ROOT / "tests" / "fixtures"
