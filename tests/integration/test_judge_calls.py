"""Judge calls of every command against a real OpenAI-compatible server on 127.0.0.1: a judgment already
paid for is never asked again (resumes, replays, a second command), a dead endpoint is one line and exit 2
before anything plays, an endpoint that fails and recovers is a line each way, and an evaluation whose
every episode is masked is a clear line, never a KeyError."""

from __future__ import annotations

import json
import shutil
import socket
from collections import Counter
from pathlib import Path

import pytest

from helpers.judge_server import JudgeServer, write_judged_relay
from helpers.paths import SCENARIOS
from trainers.cli.main import main

SMALL = ["train.prompts_per_step=2", "train.group_size=2", "tasks.count=40", "tasks.eval_count=4",
         "train.warmup.rl_steps=0", "train.checkpoint_every=1", "train.max_masked_fraction=1"]
RATING = ("ok", "Rating: [[8]]")


def _settings(*extra: str) -> list[str]:
    return [arg for item in SMALL + list(extra) for arg in ("--set", item)]


def _judged_relay(tmp_path: Path, url: str) -> Path:
    shutil.copy(SCENARIOS / "relay_lib.py", tmp_path / "relay_lib.py")
    return write_judged_relay(SCENARIOS, url, tmp_path)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _repeats(bodies: list[dict]) -> dict[str, int]:
    """The requests the server received more than once (a canonical JSON form of each body)."""
    counts = Counter(json.dumps(body, sort_keys=True) for body in bodies)
    return {body[:80]: n for body, n in counts.items() if n > 1}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_judged_run_and_its_resume_send_no_request_twice(demo_model_dir, tmp_path):
    with JudgeServer(default=RATING) as server:
        path, out = _judged_relay(tmp_path, server.url), tmp_path / "run"
        assert main(["run", str(path), *_settings("train.steps=1"), "--out", str(out), "--tracker", "none"]) == 0
        first = list(server.bodies)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["judges"]["critic"]["calls"] == len(first) > 0  # the ledger counts what the server saw
        server.reset_counters()
        assert main(["run", str(path), *_settings("train.steps=2"), "--out", str(out), "--tracker", "none",
                     "--resume"]) == 0
        both = first + server.bodies
        summary = json.loads((out / "summary.json").read_text())
        assert summary["judges"]["critic"]["calls"] == len(server.bodies)
    assert _repeats(both) == {}  # each distinct request reached the server once, across the run and its resume
    assert (out / "judge_cache.sqlite").is_file()
    rows = _rows(out / "metrics.jsonl")
    assert [row["train/step"] for row in rows] == [1, 2]
    assert all({"judge/critic/calls", "judge/critic/cache_hits", "judge/critic/failures"} <= set(row) for row in rows)
    report = (out / "report.md").read_text()
    assert "judge critic: " in report and "answers from the cache" in report


def test_rollout_and_credit_read_back_the_judgments_already_paid_for(tmp_path, capsys):
    cache = tmp_path / "judges.sqlite"
    with JudgeServer(default=RATING) as server:
        path = _judged_relay(tmp_path, server.url)
        command = ["rollout", str(path), "--episodes", "3", "--quiet", "--judge-cache", str(cache)]
        assert main(command) == 0
        paid = server.requests
        assert paid > 0 and f"judge critic: {paid} calls to the endpoint" in capsys.readouterr().err
        assert main(command) == 0
        assert server.requests == paid  # the expert's episodes again: every judgment read back
        assert "judge critic: 0 calls to the endpoint (0 retries), " in capsys.readouterr().err
        assert main(["credit", str(path), "--episodes", "2", "--judge-cache", str(cache)]) == 0
        assert _repeats(server.bodies) == {}  # the credit's replays asked only what no episode had asked


def test_a_judge_where_nothing_listens_is_one_line_and_exit_2(tmp_path, capsys):
    url = f"http://127.0.0.1:{_free_port()}/v1"
    path = _judged_relay(tmp_path, url)
    for command in (["run", str(path), "--out", str(tmp_path / "run"), "--tracker", "none"],
                    ["rollout", str(path), "--episodes", "2"],
                    ["credit", str(path), "--episodes", "2"]):
        assert main(command) == 2
        captured = capsys.readouterr()
        [line] = captured.err.strip().splitlines()
        assert line.startswith("marl: error: judge 'critic': the endpoint ") and url in line
        assert "does not answer: connection:" in line and "start the endpoint, or fix judges[critic].base_url" in line
        assert "Traceback" not in captured.err + captured.out
    assert not (tmp_path / "run").exists()  # nothing was built or written


def test_a_judge_model_the_endpoint_does_not_serve_is_one_line_and_exit_2(tmp_path, capsys):
    with JudgeServer(models=("other-judge",)) as server:
        path = _judged_relay(tmp_path, server.url)
        assert main(["rollout", str(path), "--episodes", "2"]) == 2
        assert server.requests == 0  # found by listing the models: no chat request paid for
    captured = capsys.readouterr()
    [line] = captured.err.strip().splitlines()
    assert "model 'judge' is not served there (it serves other-judge)" in line and server.url in line
    assert "check judges[critic].model" in line and "Traceback" not in captured.err + captured.out


def test_an_endpoint_that_fails_mid_rollout_and_recovers_is_a_line_each_way(tmp_path, capsys):
    """The expert plays three held-out tasks in order; every request about the second one fails (503, no wait)."""
    from marl.scenario.load import load_scenario

    with JudgeServer(default=RATING) as server:
        path = _judged_relay(tmp_path, server.url)
        _, held_out = load_scenario(path).split()
        second = held_out[1].prompt

        def down_for_the_second(body):
            asked = body["messages"][-1]["content"]
            return ("status", 503, {"Retry-After": "0"}, "overloaded") if second in asked else RATING

        server.default = down_for_the_second
        assert main(["rollout", str(path), "--episodes", "3", "--quiet", "--judge-cache", "off"]) == 0
    err = capsys.readouterr().err
    failing = [line for line in err.splitlines() if " is failing: " in line]
    recovered = [line for line in err.splitlines() if " recovered after " in line]
    assert failing == [f"judge endpoint {server.url} is failing: 503: overloaded (after 5 tries); its judgments "
                       "are masked until it answers again"]
    assert len(recovered) == 1 and "s lost to retries over 1 failed calls" in recovered[0]
    assert err.index(failing[0]) < err.index(recovered[0])


def test_an_evaluation_with_every_episode_masked_is_one_line_not_a_key_error(demo_model_dir, tmp_path, capsys):
    with JudgeServer(default=("ok", "no verdict here")) as server:  # every judgment is a parse error
        path = _judged_relay(tmp_path, server.url)
        code = main(["run", str(path), *_settings("train.steps=1"), "--out", str(tmp_path / "run"),
                     "--tracker", "none"])
    captured = capsys.readouterr()
    assert code == 2 and "Traceback" not in captured.err and "KeyError" not in captured.err
    [line] = [line for line in captured.err.splitlines() if line.startswith("marl: error:")]
    assert "the held-out evaluation before training: every one of its 4 episodes was masked" in line


@pytest.mark.ray
@pytest.mark.slow  # a real cluster: seconds to start
def test_on_the_ray_backend_the_judge_cache_has_one_writer_and_a_resume_asks_nothing_twice(demo_model_dir, tmp_path,
                                                                                           ray_cluster):
    """Two rollout workers judge through the driver's ledger actor: one sqlite file in the run directory."""
    pytest.importorskip("ray")
    ray_settings = ["train.ray.rollout_workers=2", "train.ray.num_cpus=0.5"]
    with JudgeServer(default=RATING) as server:
        path, out = _judged_relay(tmp_path, server.url), tmp_path / "run"
        assert main(["run", str(path), *_settings("train.steps=1", *ray_settings), "--out", str(out),
                     "--tracker", "none", "--backend", "ray"]) == 0
        first = list(server.bodies)
        assert main(["run", str(path), *_settings("train.steps=2", *ray_settings), "--out", str(out),
                     "--tracker", "none", "--backend", "ray", "--resume"]) == 0
        both = first + server.bodies[len(first):]
        summary = json.loads((out / "summary.json").read_text())
    assert _repeats(both) == {}
    assert summary["judges"]["critic"]["calls"] == len(both) - len(first)  # the workers' calls, counted centrally
    assert sorted(p.name for p in out.glob("judge_cache.sqlite*")) == ["judge_cache.sqlite"]  # closed: no WAL left


def test_eval_reads_back_the_judgments_of_an_earlier_eval(demo_model_dir, tmp_path, capsys):
    with JudgeServer(default=RATING) as server:
        path, out = _judged_relay(tmp_path, server.url), tmp_path / "eval"
        command = ["eval", str(path), "--set", "tasks.eval_count=4", "--tasks", "2", "--no-credit", "--out", str(out)]
        assert main(command) == 0
        paid = server.requests
        assert paid > 0 and (out / "judge_cache.sqlite").is_file()
        assert main(command) == 0
        assert server.requests == paid
    assert "judge critic: 0 calls to the endpoint (0 retries), " in capsys.readouterr().err


def test_eval_with_every_judgment_failing_is_not_a_traceback(demo_model_dir, tmp_path, capsys):
    with JudgeServer(default=("ok", "no verdict here")) as server:
        path = _judged_relay(tmp_path, server.url)
        code = main(["eval", str(path), "--set", "tasks.eval_count=4", "--tasks", "2", "--no-credit",
                     "--out", str(tmp_path / "eval"), "--judge-cache", "off"])
    captured = capsys.readouterr()
    assert code == 0 and "Traceback" not in captured.err
    assert ["pass_rate", "-"] in [line.split() for line in captured.out.splitlines()]  # no figure, no made-up number
