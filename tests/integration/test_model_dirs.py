"""Model directories on the command line (issue 12, item 8): `marl rollout --policy DIR` plays a model,
`train.model` given relative is read from the working directory, and a directory that does not load is
one line and exit 2 before anything plays or trains. The commands run in this process (helpers.inprocess);
`train.model` relative to the working directory is the helper's `cwd`."""

import json
import os

import pytest

from helpers.bad_models import broken_model_dir
from helpers.cli import one_error_line
from helpers.inprocess import marl_in_process as _marl
from helpers.paths import ROOT


def test_rollout_plays_a_model_directory(real_model_dirs):
    result = _marl("rollout", "relay", "--policy", str(real_model_dirs["qwen2"]), "--episodes", "2")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 2 and summary["policy"] == str(real_model_dirs["qwen2"])
    assert " says " in result.stdout  # the transcripts are printed


def test_a_model_directory_plays_greedily_with_its_agents_styles(real_model_dirs):
    from marl.scenario.load import load_scenario
    from trainers.cli.rollout import ModelPolicy, is_model_directory
    from trainers.policy.prompts import TurnStyle

    scenario = load_scenario("relay", ["agents.0.role=You are left.", "agents.1.chat_template=none"])
    policy = ModelPolicy.load(str(real_model_dirs["llama"]), scenario)
    assert policy.actor.styles["left"] == TurnStyle("You are left.", "auto") and policy.max_tokens["left"] == 4
    assert policy("left", "1+2=", None) == policy("left", "1+2=", None)  # greedy: the same text twice
    assert is_model_directory(str(real_model_dirs["llama"])) and is_model_directory("./models/x")
    assert not is_model_directory("expert") and not is_model_directory("policies:solver")


@pytest.mark.parametrize("kind, expected", [
    ("no_config", "is not a Hugging Face model directory (no config.json)"),
    ("bad_config", ": the config.json does not load ("),
    ("no_eos", ": the tokenizer has neither a pad token nor an eos token"),
])
def test_rollout_refuses_a_model_directory_that_does_not_load(real_model_dirs, tmp_path, kind, expected):
    directory = broken_model_dir(real_model_dirs["llama"], tmp_path / kind, kind)
    line = one_error_line(_marl("rollout", "relay", "--policy", str(directory), "--episodes", "1"))
    assert line.startswith(f"marl: error: --policy {directory}") and expected in line


def test_run_refuses_a_broken_train_model_before_training(real_model_dirs, tmp_path):
    broken_model_dir(real_model_dirs["llama"], tmp_path / "broken", "bad_config")
    line = one_error_line(_marl("run", "relay", "--set", "train.model=broken", "--out", str(tmp_path / "run"), cwd=tmp_path))
    assert "train.model: broken: the config.json does not load" in line and str(tmp_path) in line
    assert not (tmp_path / "run").exists()


def test_a_relative_train_model_is_read_from_the_working_directory(real_model_dirs, tmp_path, monkeypatch):
    import shutil

    from marl.scenario.load import load_scenario
    from trainers.run import RunError, base_model_dir

    shutil.copytree(real_model_dirs["gpt2"], tmp_path / "models" / "gpt2")
    scenario = load_scenario("relay", ["train.model=models/gpt2"])
    monkeypatch.chdir(tmp_path)
    assert base_model_dir(scenario, None).resolve() == (tmp_path / "models" / "gpt2").resolve()
    monkeypatch.chdir(ROOT)  # the scenario's folder and the repository do not have it
    with pytest.raises(RunError, match="train.model: models/gpt2 is not a directory"):
        base_model_dir(scenario, None)


def test_run_help_says_where_a_relative_model_is_read_from():
    result = _marl("run", "--help")
    assert result.returncode == 0
    assert "a relative DIR is read from the working directory" in " ".join(result.stdout.split())


@pytest.mark.parametrize("command", [["run", "relay", "--set", "train.model=noweights", "--tracker", "none"],
                                     ["demo", "--model", "noweights", "--steps", "2", "--tracker", "none"]])
def test_a_model_directory_without_weights_is_one_line(real_model_dirs, tmp_path, command):
    """config.json and tokenizer but no weights file: one line naming the directory, exit 2, no traceback."""
    (tmp_path / "noweights").mkdir()
    for name in os.listdir(real_model_dirs["qwen2"]):
        if name.endswith(".json") or name.endswith(".txt"):
            (tmp_path / "noweights" / name).write_bytes((real_model_dirs["qwen2"] / name).read_bytes())
    line = one_error_line(_marl(*command, "--out", str(tmp_path / "out"), cwd=tmp_path))
    assert f"{tmp_path / 'noweights'}: no weights (no *.safetensors file)" in line and "save_pretrained" in line


def test_demo_refuses_a_tokenizer_without_pad_or_eos_and_leaves_no_run_directory(real_model_dirs, tmp_path, capsys):
    from trainers.cli.main import main

    broken = broken_model_dir(real_model_dirs["llama"], tmp_path / "no_eos", "no_eos")
    out = tmp_path / "out"
    assert main(["demo", "--model", str(broken), "--steps", "1", "--tracker", "none", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert (f"train.model: {broken}: the tokenizer has neither a pad token nor an eos token; set "
            "tokenizer.eos_token (and optionally pad_token) and save the tokenizer again") in err
    assert not out.exists()  # refused before the run directory was made


def test_a_demo_whose_model_fails_to_load_leaves_no_empty_run_directory(real_model_dirs, tmp_path, capsys):
    from trainers.cli.main import main

    noweights = tmp_path / "noweights"
    noweights.mkdir()
    for name in os.listdir(real_model_dirs["qwen2"]):
        if name.endswith(".json") or name.endswith(".txt"):
            (noweights / name).write_bytes((real_model_dirs["qwen2"] / name).read_bytes())
    out = tmp_path / "out"
    assert main(["demo", "--model", str(noweights), "--steps", "1", "--tracker", "none", "--out", str(out)]) == 2
    assert "noweights: no weights (no *.safetensors file)" in capsys.readouterr().err
    assert not out.exists()
