"""The house of trainers/: settings resolved once into written classes, and features that plug in.

- no config class is generated at run time, and every `train` setting has a help text that
  `marl run --help` shows;
- no module below the job reads the scenario's `train` section (`spec.train`): it reads the
  `TrainConfig` it is given;
- nothing outside trainers/team/trainer.py assigns to a trainer's fields;
- a main-stage step with every feature off runs no feature's code.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import sys
from pathlib import Path

import pytest

from helpers.paths import ROOT
from marl.scenario.load import load_scenario
from trainers.config import resolve_config, settings_help

JOBS = {"trainers/config.py", "trainers/run.py", "trainers/checkpoint_eval.py"}  # the edge: jobs resolve the settings
SCANNED = ("common", "judges", "marl", "trainers", "bench")
FEATURES = ("trainers/continual.py", "trainers/stages/warmup.py", "trainers/stages/reflection.py",
            "trainers/stages/safety.py", "trainers/team/selfplay.py", "trainers/ray/", "trainers/engine/http.py")


def _sources(*folders: str):
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())


def _root_name(node) -> str | None:
    """The name an attribute or subscript chain starts from (`trainer` of `trainer.a.b[0]`)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def trainer_writes(tree) -> list[str]:
    """Every assignment (=, +=, annotated, setattr) into a chain that starts at a name `trainer`."""
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and node.args:
            targets = [ast.Attribute(value=node.args[0], attr="?")]
        for target in targets:
            for item in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(item, (ast.Attribute, ast.Subscript)) and _root_name(item) == "trainer":
                    found.append(ast.unparse(item))
    return found


def train_section_reads(tree) -> list[int]:
    """Lines that read `<x>.spec.train` (the scenario's train section)."""
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "train"
            and isinstance(node.value, ast.Attribute) and node.value.attr == "spec"]


def test_the_scanners_find_what_they_look_for():
    tree = ast.parse("trainer.player = p\ntrainer.totals['x'] += 1\nsetattr(trainer, 'a', 1)\nn = s.spec.train.lr\n"
                     "self.player = q\n")
    assert trainer_writes(tree) == ["trainer.player", "trainer.totals['x']", "trainer.?"]
    assert train_section_reads(tree) == [4]


def test_nothing_outside_the_trainer_module_assigns_to_a_trainers_fields():
    writes = [f"{path}: {target}" for path, tree in _sources(*SCANNED) if path != "trainers/team/trainer.py"
              for target in trainer_writes(tree)]
    assert writes == []


def test_no_module_below_the_job_reads_the_scenarios_train_section():
    reads = [f"{path}:{line}" for path, tree in _sources("common", "judges", "trainers")
             if path not in JOBS and not path.startswith("trainers/cli/") for line in train_section_reads(tree)]
    reads += [f"{path}:{line}" for path, tree in _sources("marl") if not path.startswith("marl/scenario/")
              for line in train_section_reads(tree)]  # the schema's own checks (marl/scenario) read it
    assert reads == []


def test_no_config_class_is_generated_at_run_time():
    from marl.scenario.spec import TrainKnobs, TrainSpec
    from trainers.config import TrainConfig
    from trainers.grpo.config import GRPOConfig

    generators = [f"{path}:{node.lineno}" for path, tree in _sources(*SCANNED) for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
                  in ("create_model", "make_dataclass")]
    assert generators == []
    for cls in (TrainKnobs, TrainSpec, GRPOConfig, TrainConfig):  # written where they are defined
        assert f"class {cls.__name__}" in inspect.getsource(cls)


def test_every_train_setting_has_a_help_text_and_marl_run_help_lists_it():
    from trainers.cli.main import main

    rows = settings_help()
    assert len(rows) > 60 and not [key for key, text in rows if text.startswith("(default")]
    assert {"train.group_size", "train.lora.r", "train.ray.max_staleness", "train.selfplay.strategy",
            "train.tracking.project", "train.warmup.rl_lr_scale"} <= {key for key, _ in rows}
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["run", "--help"])
    shown = out.getvalue()
    assert [key for key, _ in rows if f"  {key}\n" not in shown] == []


def test_settings_are_resolved_once_with_the_scenarios_choices():
    relay = resolve_config(load_scenario("relay", ["train.steps=7", "train.warmup.rl_steps=2"]))
    assert relay.selfplay is None and relay.stages.plan == (("warmup", 2), ("main", 7))
    assert relay.grpo.steps == 9 and relay.grpo.max_new_tokens == max(
        a.max_tokens for a in load_scenario("relay").spec.agents)
    poker = resolve_config(load_scenario("kuhn_poker"))
    assert poker.selfplay is not None  # competitive: self-play on by default
    assert resolve_config(load_scenario("kuhn_poker", ["train.selfplay.enabled=false"])).selfplay is None
    continual = resolve_config(load_scenario("relay", ["train.continual.kl=0.2", "train.warmup.rl_steps=2"]),
                               continual=True)
    assert "warmup" not in continual.stages.names and continual.grpo.beta == 0.2
    assert continual.grpo.steps == continual.stages.total_steps


def test_a_main_step_with_every_feature_off_runs_no_feature_code():
    from trainers.run import RunOptions, prepare
    from trainers.stages.loop import stage_step

    prepared = prepare(RunOptions("relay", ["train.prompts_per_step=2", "train.group_size=2", "tasks.count=20",
                                            "tasks.eval_count=4"]), log=lambda *_: None)
    assert prepared.features == () and prepared.trainer.selfplay is None
    called: set[str] = set()

    def profile(frame, event, arg):
        if event == "call":
            called.add(Path(frame.f_code.co_filename).resolve().as_posix())

    sys.setprofile(profile)
    try:
        metrics = stage_step(prepared.trainer, "main", 0, prepared.train_tasks)
    finally:
        sys.setprofile(None)
    assert metrics["train/step"] == 1
    root = ROOT.resolve().as_posix() + "/"
    ours = {path.removeprefix(root) for path in called if path.startswith(root)}
    assert "trainers/team/trainer.py" in ours and "trainers/grpo/learner.py" in ours  # the profile saw the step
    assert [path for path in ours if path.startswith(FEATURES)] == []
