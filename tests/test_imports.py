"""Import hygiene: the torch-free layers must not pull in heavy libraries."""

import subprocess
import sys
from helpers.paths import ROOT

HEAVY = ("torch", "transformers", "wandb", "openai")


def _modules_after_import(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_light_layers_import_no_heavy_library():
    loaded = _modules_after_import("import common.files, common.imports, common.chat, marl, judges, trainers.grpo.safeguards, "
                                   "marl.addition, marl.types")
    assert not {name for name in loaded if name.split(".")[0] in HEAVY}


def test_scenarios_environments_and_verifiers_need_no_heavy_library():
    loaded = _modules_after_import("import marl.env, marl.scenario.load, marl.tools, marl.policies, judges.rules.registry, "
                                   "trainers.cli.main, trainers.cli.validate, trainers.cli.rollout, trainers.cli.credit; "
                                   "marl.make_env('relay')")
    assert not {name for name in loaded if name.split(".")[0] in HEAVY}


def test_judges_import_neither_marl_nor_trainers():
    loaded = _modules_after_import("import judges.rules.registry, judges.rules.basic, judges.rules.sql, judges.rules.code, judges.rules.sandbox")
    assert not {name for name in loaded if name.split(".")[0] in ("marl", "trainers")}


def test_the_check_detects_a_heavy_import():
    loaded = _modules_after_import("import trainers.grpo.learner")
    assert "torch" in loaded


def _importers(library: str) -> list[str]:
    import pathlib
    import re

    root = ROOT
    pattern = re.compile(rf"^\s*(import {library}\b|from {library}\b)", re.M)
    return sorted(str(p.relative_to(root)) for package in ("common", "marl", "judges", "trainers")
                  for p in (root / package).rglob("*.py") if pattern.search(p.read_text()))


def test_only_the_judge_backend_imports_openai():
    assert _importers("openai") == ["judges/model/openai_backend.py"]


def test_only_the_tracker_imports_wandb():
    assert _importers("wandb") == ["trainers/records/tracking.py"]
