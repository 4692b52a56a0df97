"""`marl judges report --verdict logprobs` over a real endpoint on 127.0.0.1: accuracy against gold with its CI
and a plain at-chance statement; one-line errors for a reply without logprobs and for a split label."""

import json
import math
import re

import pytest
import yaml

from helpers.cli import one_error_line
from helpers.inprocess import marl_in_process
from helpers.judge_server import JudgeServer

GOOD = "A clear and correct explanation of topic {i}."


@pytest.fixture(scope="module")
def items(tmp_path_factory):
    path = tmp_path_factory.mktemp("verdict") / "items.jsonl"
    lines = []
    for i in range(30):
        good, bad = GOOD.format(i=i), f"Topic {i} is a thing."
        candidates, gold = ([good, bad], 0) if i % 2 else ([bad, good], 1)
        lines.append(json.dumps({"id": f"q{i}", "prompt": f"Explain topic {i}.", "candidates": candidates,
                                 "gold": gold}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _one_token(p_first: float) -> tuple:
    """A JudgeServer behaviour: the reply "A" or "B", with P(A) = p_first and P(B) the rest."""
    table = {"A": math.log(p_first), " B": math.log(1 - p_first)}
    return ("ok", "A" if p_first >= 0.5 else " B", [("A" if p_first >= 0.5 else " B", table)])


def _first_is_clear(body) -> bool:
    """Whether the answer shown as A is the clear one (what a judge that reads the answers would see)."""
    first = re.search(r"\[The Start of Assistant A's Answer\]\n(.*?)\n\[The End", body["messages"][-1]["content"], re.S)
    return bool(first) and "clear and correct" in first.group(1)


def _report(server, items, tmp_path, *extra):
    out, markdown = tmp_path / "report.json", tmp_path / "report.md"
    result = marl_in_process("judges", "report", "--base-url", server.url, "--model", "small", "--verdict", "logprobs",
                             "--items", str(items), "--out", str(out), "--markdown", str(markdown), "--per-kind", "2",
                             "--retries", "0", "--cache", str(tmp_path / "cache.sqlite"), *extra)
    return result, out, markdown


def test_a_judge_that_always_says_a_is_at_chance_and_the_report_says_so_first(items, tmp_path):
    with JudgeServer(default=_one_token(0.7)) as server:  # P(A) = 0.7 whatever the answers: a position, no judge
        result, out, markdown = _report(server, items, tmp_path)
        asked = server.bodies[0]
    assert result.returncode in (0, 1), result.stderr
    assert (asked["max_tokens"], asked["logprobs"], asked["top_logprobs"]) == (1, True, 20)
    accuracy = json.loads(out.read_text())["accuracy"]
    assert accuracy["n"] == accuracy["n_gold"] == 30 and accuracy["ties"] == 30  # both orders cancel: 0.5 each
    assert accuracy["estimate"] == 0.5 and accuracy["ci_low"] < 0.5 < accuracy["ci_high"]
    assert accuracy["method"] == "Wilson score" and accuracy["at_chance"] is True
    assert accuracy["statement"].startswith("at chance: the CI includes 0.5")
    text = markdown.read_text()
    assert "**Accuracy against gold: at chance" in text
    assert text.index("Accuracy against gold") < text.index("| quantity |")  # it leads the report


def test_a_judge_that_reads_the_answers_is_above_chance(items, tmp_path):
    with JudgeServer(default=lambda body: _one_token(0.9 if _first_is_clear(body) else 0.1)) as server:
        result, out, markdown = _report(server, items, tmp_path)
    assert result.returncode in (0, 1), result.stderr
    accuracy = json.loads(out.read_text())["accuracy"]
    assert accuracy["estimate"] == 1.0 and accuracy["ci_low"] > 0.5 and accuracy["at_chance"] is False
    assert accuracy["statement"].startswith("above chance") and "30 gold pairs" in accuracy["statement"]
    assert "**Accuracy against gold: above chance" in markdown.read_text()


def test_a_reply_without_logprobs_is_one_line_naming_the_setting(items, tmp_path):
    with JudgeServer(default=("ok", "A")) as server:  # an endpoint that ignores `logprobs`
        result, out, _ = _report(server, items, tmp_path)
        calls = server.requests
    line = one_error_line(result)
    assert line.startswith("marl: error: --verdict logprobs: model openai:small@") and "answered without logprobs" in line
    assert "use --verdict text" in line and calls == 2 and not out.exists()  # the first pair only


def test_logprobs_and_no_logprobs_together_are_refused_before_any_call(items, tmp_path):
    with JudgeServer(default=_one_token(0.7)) as server:
        result, _, _ = _report(server, items, tmp_path, "--no-logprobs")
        calls = server.requests
    assert "--verdict logprobs reads the verdict from logprobs, which --no-logprobs turns off" in one_error_line(result)
    assert calls == 0


def test_a_local_judge_whose_tokenizer_splits_a_label_fails_validation_in_one_line(real_model_dirs, tmp_path):
    spec = {"name": "judged", "agents": [{"name": "writer"}],
            "tasks": {"inline": [{"prompt": "Write a haiku about rain."}]},
            "judges": [{"name": "critic", "backend": "local", "model": str(real_model_dirs["qwen2"]),
                        "verdict": "logprobs"}],
            "rewards": {"answer_from": "writer", "outcome": [{"kind": "critic"}]}}
    path = tmp_path / "judged.yaml"
    path.write_text(yaml.safe_dump(spec))
    line = one_error_line(marl_in_process("validate", str(path)))
    assert "judges.0.verdict" in line and "verdict label 'Yes' is 2 tokens" in line and "verdict 'text'" in line
    spec["judges"][0]["verdict"] = "text"
    path.write_text(yaml.safe_dump(spec))
    assert marl_in_process("validate", str(path)).returncode == 0


def _logprobs_relay(tmp_path, url):
    """relay.yaml with a process reward from an openai judge at `url` read with `verdict: logprobs`."""
    import shutil

    from helpers.judge_server import write_judged_relay
    from helpers.paths import SCENARIOS

    shutil.copy(SCENARIOS / "relay_lib.py", tmp_path / "relay_lib.py")
    path = write_judged_relay(SCENARIOS, url, tmp_path)
    spec = yaml.safe_load(path.read_text())
    spec["judges"][0]["verdict"] = "logprobs"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_scenario_judge_read_by_logprobs_is_probed_for_them_before_anything_plays(tmp_path, capsys):
    from trainers.cli.main import main

    with JudgeServer(default=("ok", "Yes")) as server:  # answers, but never with logprobs
        path = _logprobs_relay(tmp_path, server.url)
        assert main(["rollout", str(path), "--episodes", "2"]) == 2
        assert server.requests == 1  # the probe's one token, nothing played
    captured = capsys.readouterr()
    [line] = captured.err.strip().splitlines()
    assert line.startswith("marl: error: judge 'critic': the endpoint ") and server.url in line
    assert "cannot give a logprobs verdict: its reply carries no logprobs" in line
    assert "set judges[critic].verdict: text" in line and "Traceback" not in captured.err + captured.out
    yes = ("ok", "Yes", [("Yes", {"Yes": math.log(0.8), " No": math.log(0.15)})])
    with JudgeServer(default=yes) as server:
        path = _logprobs_relay(tmp_path, server.url)
        assert main(["rollout", str(path), "--episodes", "2", "--judge-cache", "off"]) == 0
        asked = [body for body in server.bodies if "Reply Yes or No." in body["messages"][-1]["content"]]
    assert asked and all(body["max_tokens"] == 1 and body["top_logprobs"] == 20 for body in asked)


def test_calibrate_in_the_logprobs_mode_binds_the_calibrator_to_that_mode(items, tmp_path):
    out = tmp_path / "cal.json"
    result = marl_in_process("judges", "calibrate", "--simulated", "--verdict", "logprobs", "--items", str(items),
                             "--out", str(out), "--cache", str(tmp_path / "cache.sqlite"))
    assert result.returncode == 0, result.stderr
    judge_id = json.loads(out.read_text())["judge_id"]
    assert judge_id.startswith("pairwise|openai:sim@sim://") and "verdict=logprobs" in judge_id


def test_a_tiny_local_judge_read_by_logprobs_fails_every_pair_and_the_report_says_nothing_was_measured(
        real_model_dirs, items, tmp_path):
    out = tmp_path / "report.json"
    result = marl_in_process("judges", "report", "--local-model", str(real_model_dirs["qwen2"]), "--verdict",
                             "logprobs", "--items", str(items), "--out", str(out), "--per-kind", "1",
                             "--cache", str(tmp_path / "cache.sqlite"))
    # an untrained 400-token model puts ~1% of its first token on A and B: no verdict, never a number
    assert result.returncode == 1 and "nothing could be graded" in result.stdout, result.stderr
    report = json.loads(out.read_text())
    assert report["accuracy"]["n_failed"] == 30 and report["accuracy"]["estimate"] is None
    assert report["accuracy"]["statement"].startswith("not estimated: every one of the 30 gold pairs failed")
