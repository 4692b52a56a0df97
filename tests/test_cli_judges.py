"""`marl judges report|calibrate`: the documented report format, and one-line errors with exit 2."""

import json
import socket
import subprocess
import sys

import pytest

from judge_server import JudgeServer


def _marl(*args):
    return subprocess.run([sys.executable, "-m", "trainers.cli", "judges", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def items(tmp_path_factory):
    path = tmp_path_factory.mktemp("judges") / "items.jsonl"
    lines = []
    for i in range(40):
        good, bad = f"A clear and correct explanation of topic {i}.", f"Topic {i} is a thing."
        candidates, gold = ([good, bad], 0) if i % 2 else ([bad, good], 1)
        lines.append(json.dumps({"id": f"q{i}", "prompt": f"Explain topic {i}.", "candidates": candidates,
                                 "gold": gold}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_report_against_the_simulated_judge_has_the_documented_keys(items, tmp_path):
    out, markdown = tmp_path / "report.json", tmp_path / "report.md"
    result = _marl("report", "--simulated", "--sim-bias", "master_key=5", "--items", str(items), "--out", str(out),
                   "--markdown", str(markdown), "--per-kind", "40", "--cache", str(tmp_path / "cache.sqlite"))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    for section, name in (("position", "log_odds"), ("length", "slope")):
        assert {"estimate", "ci_low", "ci_high"} <= set(report[section][name])
    assert 0 <= report["position"]["flip_rate"] <= 1
    assert report["master_key"]["fpr"]["estimate"] > 0.3 and report["verdicts"]["master_key.fpr"] == "fail"
    assert "null_answer" in report and report["n_calls"] > 0 and report["n_failed"] == 0
    assert "master_key.fpr" in markdown.read_text() and "FAIL: master_key.fpr" in result.stdout


def test_calibrate_writes_a_calibrator_bound_to_the_judge(items, tmp_path):
    out = tmp_path / "cal.json"
    result = _marl("calibrate", "--simulated", "--items", str(items), "--out", str(out),
                   "--cache", str(tmp_path / "cache.sqlite"))
    assert result.returncode == 0, result.stderr
    saved = json.loads(out.read_text())
    assert saved["kind"] == "platt" and saved["judge_id"].startswith("pairwise|openai:sim@sim://")


def test_a_malformed_items_line_names_the_file_and_line(tmp_path):
    bad = tmp_path / "items.jsonl"
    bad.write_text('{"prompt": "p", "candidates": ["a", "b"]}\n{oops\n')
    result = _marl("report", "--simulated", "--items", str(bad), "--out", str(tmp_path / "r.json"))
    assert result.returncode == 2 and f"{bad}:2: not valid JSON" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_an_unreachable_endpoint_is_one_line_and_exit_2(items, tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = _marl("report", "--base-url", f"http://127.0.0.1:{port}/v1", "--model", "m", "--items", str(items),
                   "--out", str(tmp_path / "r.json"), "--retries", "0", "--timeout", "2",
                   "--cache", str(tmp_path / "cache.sqlite"))
    assert result.returncode == 2 and "cannot judge with model" in result.stderr and "connection" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_wrong_model_name_is_one_line_and_exit_2(items, tmp_path):
    with JudgeServer(models=["real-model"]) as server:
        result = _marl("report", "--base-url", server.url, "--model", "wrong-model", "--items", str(items),
                       "--out", str(tmp_path / "r.json"), "--retries", "0", "--cache", str(tmp_path / "c.sqlite"))
    assert result.returncode == 2 and "404" in result.stderr and "Traceback" not in result.stderr
