"""`marl rm train` as a user runs it, and a trained reward model as a scenario's judge: the W&B run read
back from disk, every bad input one line with exit 2 and nothing written."""

from __future__ import annotations

import json
import os

import pytest

from helpers.cli import one_error_line
from helpers.inprocess import marl_in_process

GOOD = {"prompt": "Task: 1+2=", "chosen": "ANSWER: 3. Checked twice.", "rejected": "ANSWER: 3."}


def write_pairs(path, rows) -> str:
    path.write_text("".join(row if isinstance(row, str) else json.dumps(row) + "\n" for row in rows))
    return str(path)


def many_pairs(count: int) -> list[dict]:
    return [{"prompt": f"Task: {i}+1=", "chosen": f"ANSWER: {i + 1}. It is checked.", "rejected": f"ANSWER: {i + 1}."}
            for i in range(count)]


# make test (--dist loadgroup): this module's tests run on one worker, so trained is built once
pytestmark = pytest.mark.xdist_group("cli_rm")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, real_model_dirs):
    """`marl rm train` run in this process with W&B offline: (reward model dir, stdout lines)."""
    import contextlib
    import io

    from trainers.cli.main import main

    root = tmp_path_factory.mktemp("rm_cli")
    pairs = write_pairs(root / "pairs.jsonl", many_pairs(60))
    out = root / "rm"
    printed = io.StringIO()
    environ = dict(os.environ)
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
    try:
        with contextlib.redirect_stdout(printed):
            status = main(["rm", "train", "--pairs", pairs, "--base", str(real_model_dirs["llama"]), "--out", str(out),
                           "--epochs", "2", "--lr", "1e-3", "--eval-fraction", "0.2", "--log-every", "5"])
    finally:
        os.environ.clear()
        os.environ.update(environ)
    assert status == 0, printed.getvalue()
    return out, printed.getvalue().splitlines()


def test_rm_train_writes_a_loadable_reward_model_with_its_record(trained):
    from transformers import AutoModelForSequenceClassification

    out, lines = trained
    record = json.loads((out / "marl_reward_model.json").read_text())
    assert record["train_pairs"] == 48 and record["held_out_pairs"] == 12 and len(record["epochs"]) == 2
    assert 0 <= record["held_out"]["accuracy"] <= 1 and record["settings"]["epochs"] == 2
    assert AutoModelForSequenceClassification.from_pretrained(out).config.num_labels == 1
    assert any(line.startswith("rm step 5/") for line in lines)  # progress output
    assert lines[-1].startswith(f"wrote {out}: held-out accuracy") and "s/epoch" in lines[-1]
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".rm.")]  # no temporary directory left


def test_rm_train_logs_a_wandb_run_in_the_model_directory(trained):
    from helpers.wandb_reader import read_offline_run

    out, _ = trained
    run, _ = read_offline_run(out / "wandb")
    steps = [row for row in run["history"] if "rm/loss" in row]
    assert [row["rm/step"] for row in steps] == list(range(1, len(steps) + 1)) and len(steps) == 12
    evals = [row for row in run["history"] if "rm/eval_accuracy" in row]
    assert [row["rm/epoch"] for row in evals] == [1, 2]
    assert {"name": "rm/*", "step_metric": "rm/step"} in run["metrics"]
    assert run["exit_code"] == 0


def test_the_reward_model_scores_a_scenario_as_its_judge(trained, tmp_path):
    from marl.env import make_env
    from marl.scenario.load import load_scenario

    out, _ = trained
    scenario_file = tmp_path / "rm_judged.yaml"
    scenario_file.write_text(f"""\
name: rm_judged
agents:
  - name: solver
tasks:
  inline:
    - prompt: "Task: 4+1="
      answer: "5"
judges:
  - {{name: rm, backend: reward_model, model: {out}}}
rewards:
  weights: {{outcome: 1.0, process: 0.0, format: 0.0}}
  outcome:
    - kind: rm
""")
    env = make_env(load_scenario(scenario_file))
    scores = {}
    for answer in ("ANSWER: 5.", "ANSWER: 5. It is checked."):
        env.reset(seed=0)
        _, rewards, *_ = env.step({"solver": answer})
        scores[answer] = rewards["solver"]
    assert all(0 < value < 1 for value in scores.values())
    assert scores["ANSWER: 5. It is checked."] > scores["ANSWER: 5."]  # the preference it was trained on


def test_a_scenario_naming_a_non_reward_model_fails_validation_with_its_location(real_model_dirs, tmp_path):
    scenario_file = tmp_path / "bad_rm.yaml"
    scenario_file.write_text(f"""\
name: bad_rm
agents:
  - name: solver
tasks:
  inline:
    - prompt: "1+1="
      answer: "2"
judges:
  - name: rm
    backend: reward_model
    model: {real_model_dirs['qwen2']}
rewards:
  outcome:
    - kind: rm
""")
    line = one_error_line(marl_in_process("validate", str(scenario_file)))
    assert line.startswith(f"{scenario_file}:11:5: judges.0.model:") and "not a reward model" in line


@pytest.mark.parametrize("rows, where", [
    ([GOOD, "{oops\n"], ":2: not valid JSON"),
    ([GOOD, {**GOOD, "rejected": GOOD["chosen"]}], ":2: 'chosen' equals 'rejected'"),
])
def test_a_bad_pairs_file_is_one_line_and_nothing_is_written(tmp_path, real_model_dirs, rows, where):
    pairs, out = write_pairs(tmp_path / "pairs.jsonl", rows), tmp_path / "rm"
    line = one_error_line(marl_in_process("rm", "train", "--pairs", pairs, "--base", str(real_model_dirs["qwen2"]),
                                   "--out", str(out)))
    assert line.startswith(f"marl: error: {pairs}") and where in line
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["pairs.jsonl"]


def test_an_existing_reward_model_is_kept_and_a_bad_base_refused(tmp_path, real_model_dirs):
    pairs = write_pairs(tmp_path / "pairs.jsonl", many_pairs(4))
    kept = tmp_path / "rm"
    kept.mkdir()
    (kept / "weights").write_text("earlier")
    line = one_error_line(marl_in_process("rm", "train", "--pairs", pairs, "--base", str(real_model_dirs["qwen2"]),
                                   "--out", str(kept)))
    assert "exists and is not empty" in line and "--overwrite" in line
    assert (kept / "weights").read_text() == "earlier"
    line = one_error_line(marl_in_process("rm", "train", "--pairs", pairs, "--base", str(tmp_path), "--out",
                                   str(tmp_path / "new")))
    assert "--base" in line and "no config.json" in line and not (tmp_path / "new").exists()


def test_a_calibrator_fitted_for_the_reward_model_binds_to_it_in_a_scenario(trained, tmp_path):
    import math

    from judges.model.factory import build_judge
    from judges.types import Candidate, Item

    out, _ = trained
    items = tmp_path / "gold.jsonl"
    items.write_text("".join(json.dumps({"id": str(i), "prompt": f"Task: {i}+1=", "gold": i % 2,
                                         "candidates": [f"ANSWER: {i + 1}.", f"ANSWER: {i + 1}. It is checked."]
                                         if i % 2 else [f"ANSWER: {i + 1}. It is checked.", f"ANSWER: {i + 1}."]})
                                 + "\n" for i in range(12)))
    result = marl_in_process("judges", "calibrate", "--reward-model", str(out), "--items", str(items), "--out",
                      str(tmp_path / "cal.json"), "--cache", str(tmp_path / "cache.sqlite"))
    # fitted on the scores the scenario uses: each answer's pointwise score against its gold label
    assert result.returncode == 0 and "on 24 gold answers, pointwise" in result.stdout, result.stderr
    judge = build_judge({"name": "rm", "backend": "reward_model", "model": str(out), "calibration": "cal.json"},
                        base_dir=tmp_path)
    raw = build_judge({"name": "rm", "backend": "reward_model", "model": str(out)})
    candidate = [Candidate("ANSWER: 9. It is checked.")]
    calibrated, plain = judge.score(Item(prompt="Task: 8+1="), candidate)[0], raw.score(Item(prompt="Task: 8+1="), candidate)[0]
    assert calibrated.details["raw_score"] == pytest.approx(plain.score)
    assert calibrated.ok and not math.isclose(calibrated.score, plain.score)
    assert calibrated.score > plain.score  # the longer answer is gold's better one every time: sharpened towards 1
    other = tmp_path / "other_rm"  # a calibrator is bound to the weights it was fitted for
    import shutil

    shutil.copytree(out, other)
    from safetensors.torch import load_file, save_file

    weights = load_file(other / "model.safetensors")
    save_file({k: v + 0.01 if k.startswith("score") else v for k, v in weights.items()}, other / "model.safetensors")
    with pytest.raises(ValueError, match="refuses to calibrate judge 'reward_model"):
        build_judge({"name": "rm", "backend": "reward_model", "model": str(other), "calibration": str(tmp_path / "cal.json")})


@pytest.mark.slow  # a short marl run: a few seconds of RL
def test_marl_run_trains_against_the_reward_model(trained, real_model_dirs, tmp_path):
    """The classic pipeline's last stage: RL whose reward is the trained reward model's score."""
    from trainers.run import RunOptions, run_scenario

    out, _ = trained
    scenario_file = tmp_path / "rm_rl.yaml"
    tasks = "".join(f'    - {{prompt: "Task: {i}+1=", answer: "{i + 1}"}}\n' for i in range(12))
    scenario_file.write_text(f"""\
name: rm_rl
agents:
  - {{name: solver, observation: "{{prompt}}", max_tokens: 6}}
tasks:
  eval_count: 4
  inline:
{tasks}judges:
  - {{name: rm, backend: reward_model, model: {out}}}
rewards:
  weights: {{outcome: 1.0, process: 0.0, format: 0.0}}
  outcome:
    - kind: rm
train:
  model: {real_model_dirs['qwen2']}
  stages: [main]
  steps: 2
  prompts_per_step: 2
  group_size: 2
""")
    summary = run_scenario(RunOptions(str(scenario_file), [], out=str(tmp_path / "run"), tracker="none"),
                           log=lambda line: None)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rewards = [row["train/reward"] for row in rows if "train/reward" in row]
    assert len(rewards) == 2 and all(0 < value < 1 for value in rewards)  # sigmoid scores, never masked
    assert summary["masked_episodes"] == 0


@pytest.mark.parametrize("damage", ["tokenizer", "weights"])
def test_judges_commands_refuse_a_damaged_reward_model_in_one_line(trained, tmp_path, damage):
    import shutil

    damaged = tmp_path / "rm"
    shutil.copytree(trained[0], damaged)
    if damage == "tokenizer":
        from trainers.policy.tokenizer import build_bpe_tokenizer

        build_bpe_tokenizer(["another corpus", "other merges"], 300).save_pretrained(damaged)
    else:
        (damaged / "model.safetensors").unlink()
    out = tmp_path / "reports" / "report.json"
    for command in ("report", "calibrate"):
        line = one_error_line(marl_in_process("judges", command, "--reward-model", str(damaged), "--items",
                                       "examples/judge_items.jsonl", "--out", str(out)))
        assert line.startswith(f"marl: error: --reward-model {damaged}: ")
        assert ("differ from the tokenizer" if damage == "tokenizer" else "no weight file") in line
    assert not out.parent.exists()  # nothing created


def test_a_reward_model_judge_runs_where_its_device_says(trained, tmp_path):
    import torch

    from judges.model.factory import build_judge
    from judges.model.reward_model import RewardModelError

    out, _ = trained
    judge = build_judge({"name": "rm", "backend": "reward_model", "model": str(out), "device": "auto"})
    expected = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert judge.model.device == expected and next(judge.model.model.parameters()).device.type == expected
    if not torch.cuda.is_available():  # a device the machine lacks: one line naming the setting
        with pytest.raises(RewardModelError, match=r"judges\[\]\.device=cuda but torch sees no such device"):
            build_judge({"name": "rm", "backend": "reward_model", "model": str(out), "device": "cuda"})
    scenario_file = tmp_path / "device.yaml"
    scenario_file.write_text('name: device\nagents:\n  - name: solver\ntasks:\n  inline:\n    - {prompt: "1+1=", answer: "2"}\n'
                             'judges:\n  - {name: j, model: gpt-4.1-mini, device: cuda}\n'
                             'rewards:\n  outcome:\n    - kind: j\n')
    line = one_error_line(marl_in_process("validate", str(scenario_file)))
    assert line.startswith(f"{scenario_file}:8:") and "applies to reward_model judges only" in line


def test_zero_epochs_is_the_untrained_baseline_in_one_line(tmp_path, real_model_dirs):
    pairs, out = write_pairs(tmp_path / "pairs.jsonl", many_pairs(20)), tmp_path / "rm0"
    result = marl_in_process("rm", "train", "--pairs", pairs, "--base", str(real_model_dirs["qwen2"]), "--out", str(out),
                             "--epochs", "0", "--eval-fraction", "0.2", "--tracker", "none")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith(f"wrote {out}: untrained (0 epochs: the base with its seeded "
                                                     "head); held-out accuracy ")
    record = json.loads((out / "marl_reward_model.json").read_text())
    assert record["steps"] == 0 and record["settings"]["epochs"] == 0
    line = one_error_line(marl_in_process("rm", "train", "--pairs", pairs, "--base", str(real_model_dirs["qwen2"]),
                                          "--out", str(tmp_path / "neg"), "--epochs", "-1"))
    assert "--epochs -1: expected 0 or more" in line
