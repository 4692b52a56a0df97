"""`marl judges report|calibrate`: the documented report format, and one-line errors with exit 2."""

import json
import socket

import pytest

from helpers.inprocess import marl_in_process
from helpers.judge_server import JudgeServer
from helpers.judge_items import write_items


def _marl(*args):
    return marl_in_process("judges", *args)


@pytest.fixture(scope="module")
def items(tmp_path_factory):
    return write_items(tmp_path_factory.mktemp("judges") / "items.jsonl", 40)


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


# -- every option is checked before the first call (issue 10) -------------------------------------------------
def _one_line_error(result, message):
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stderr.strip() == f"marl: error: {message}" and "Traceback" not in result.stderr


@pytest.mark.parametrize("flag, value, message", [
    ("--timeout", "0", "--timeout 0: must be a number of seconds > 0, e.g. --timeout 60"),
    ("--timeout", "-5", "--timeout -5: must be a number of seconds > 0, e.g. --timeout 60"),
    ("--timeout", "inf", "--timeout inf: must be a number of seconds > 0, e.g. --timeout 60"),
    ("--concurrency", "0", "--concurrency 0: must be >= 1 (requests in flight at once, e.g. --concurrency 8)"),
    ("--retries", "-1", "--retries -1: must be >= 0 (retries after a failed call (0 = none), e.g. --retries 4)"),
    ("--max-tokens", "0", "--max-tokens 0: must be >= 1 (tokens per judge answer, e.g. --max-tokens 512)"),
])
@pytest.mark.parametrize("command", ["report", "calibrate"])
def test_bad_numbers_are_one_line_before_any_call(items, tmp_path, command, flag, value, message):
    with JudgeServer() as server:
        result = _marl(command, "--base-url", server.url, "--items", str(items), "--out", str(tmp_path / "o.json"),
                       "--cache", str(tmp_path / "c.sqlite"), flag, value)
        assert server.requests == 0
    _one_line_error(result, message)
    assert not (tmp_path / "c.sqlite").exists() and not (tmp_path / "o.json").exists()


def test_out_in_a_missing_folder_is_created_and_the_report_is_strict_json(items, tmp_path):
    out = tmp_path / "new" / "deeper" / "report.json"
    result = _marl("report", "--simulated", "--items", str(items), "--out", str(out), "--per-kind", "10",
                   "--markdown", str(tmp_path / "md" / "r.md"), "--cache", str(tmp_path / "cache" / "c.sqlite"))
    assert result.returncode == 0, result.stderr

    def refuse(constant):
        raise AssertionError(f"non-strict JSON constant {constant}")

    report = json.loads(out.read_text(), parse_constant=refuse)
    assert set(report["verdicts"].values()) <= {"pass", "warn", "fail", "not estimated"}
    assert "null_values" in report and (tmp_path / "md" / "r.md").exists()
    assert [p.name for p in out.parent.iterdir()] == ["report.json"]  # no temporary file left beside it


@pytest.mark.parametrize("flag", ["--out", "--cache"])
def test_an_output_path_that_is_a_folder_or_under_a_file_is_refused_before_any_call(items, tmp_path, flag):
    blocker = tmp_path / "a_file"
    blocker.write_text("keep me\n")
    folder = tmp_path / "a_folder"
    folder.mkdir()
    defaults = {"--out": str(tmp_path / "o.json"), "--cache": str(tmp_path / "c.sqlite")}
    with JudgeServer() as server:
        under_file = _marl("report", "--base-url", server.url, "--items", str(items),
                           *[x for k, v in {**defaults, flag: str(blocker / "x.json")}.items() for x in (k, v)])
        is_folder = _marl("report", "--base-url", server.url, "--items", str(items),
                          *[x for k, v in {**defaults, flag: str(folder)}.items() for x in (k, v)])
        assert server.requests == 0
    _one_line_error(under_file, f"{flag} {blocker / 'x.json'}: {blocker} is a file, not a folder; choose another path")
    _one_line_error(is_folder, f"{flag} {folder}: is a folder; give a file path, e.g. {flag} {folder / 'out.json'}")
    assert blocker.read_text() == "keep me\n" and list(folder.iterdir()) == []


def test_a_cache_that_is_not_a_database_is_refused_before_any_call(items, tmp_path):
    cache = tmp_path / "notes.txt"
    cache.write_text("this is not SQLite\n" * 100)
    with JudgeServer() as server:
        result = _marl("report", "--base-url", server.url, "--items", str(items), "--out", str(tmp_path / "o.json"),
                       "--cache", str(cache))
        assert server.requests == 0
    _one_line_error(result, f"--cache {cache}: cannot be used as the response cache (file is not a database); "
                            "give a new file path or delete it")
    assert cache.read_text() == "this is not SQLite\n" * 100


def test_serve_port_out_of_range_is_one_line_before_loading(tmp_path):
    result = marl_in_process("serve", str(tmp_path / "no-model"), "--port", "99999")
    _one_line_error(result, "--port 99999: a TCP port is 0-65535 (0 picks a free one), e.g. --port 8000")


def test_serve_binds_before_loading_so_a_busy_port_fails_first(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = marl_in_process("serve", str(tmp_path / "no-model"), "--port", str(port))
    _one_line_error(result, f"cannot listen on 127.0.0.1:{port}: Address already in use")


def test_a_judge_that_never_answers_grades_nothing_and_exits_1(items, tmp_path):
    out = tmp_path / "r.json"
    with JudgeServer(default=("ok", "I cannot decide.")) as server:
        result = _marl("report", "--base-url", server.url, "--model", "m", "--items", str(items), "--out", str(out),
                       "--per-kind", "5", "--no-logprobs", "--cache", str(tmp_path / "c.sqlite"))
    assert result.returncode == 1 and "nothing could be graded" in result.stdout, result.stderr
    report = json.loads(out.read_text())
    assert set(report["verdicts"].values()) == {"not estimated"} and report["n_failed"] > 0
    assert report["not_estimated"]["master_key.fpr"] == "no decided judgment (every call failed or was unparseable)"
    assert report["not_estimated"]["position.log_odds"] == "not estimated: no pair has a verdict in both orders"


def test_a_nan_first_answer_fails_its_pair_only_not_the_command(items, tmp_path):
    out = tmp_path / "r.json"
    nan_answer = ("ok", "[[A]]", [("A", {"A": float("nan"), "B": -2.0})])
    with JudgeServer([nan_answer], default=("ok", "[[A]]", [("A", {"A": -0.1, "B": -2.5})])) as server:
        result = _marl("report", "--base-url", server.url, "--model", "m", "--items", str(items), "--out", str(out),
                       "--per-kind", "5", "--cache", str(tmp_path / "c.sqlite"), "--concurrency", "1")
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr, result.stderr
    report = json.loads(out.read_text())
    assert report["n_failed"] == 0  # the preflight pair failed; asked again in the report, it was answered
    assert report["n_calls"] > 0 and result.stdout.startswith(f"wrote {out}")


def test_a_report_read_back_from_its_cache_says_it_made_no_call(items, tmp_path):
    cache = tmp_path / "c.sqlite"
    with JudgeServer(default=("ok", "[[A]]")) as server:
        args = ("report", "--base-url", server.url, "--model", "m", "--items", str(items), "--per-kind", "3",
                "--no-logprobs", "--cache", str(cache))
        first = _marl(*args, "--out", str(tmp_path / "first.json"))
        paid = server.requests
        again = _marl(*args, "--out", str(tmp_path / "again.json"))
        assert server.requests == paid  # every answer came from the cache
    assert first.returncode in (0, 1) and again.returncode in (0, 1), again.stderr
    report = json.loads((tmp_path / "again.json").read_text())
    judgments, hits = report["n_calls"], report["n_calls"] + 2  # and the preflight pair's two orders
    assert report["requests"] == {"calls": 0, "cache_hits": hits, "failures": 0, "retries": 0}
    assert f": {judgments} judgments (0 calls to the endpoint (0 retries), {hits} answers from the cache, " \
           "0 failed)" in again.stdout
    assert json.loads((tmp_path / "first.json").read_text())["requests"]["calls"] == paid


def test_a_long_report_says_how_far_it_has_got():
    """The progress line is due at once (every_s=0): it counts what the wrapped backend reports."""
    import asyncio
    import io

    from judges.model.backend import ChatRequest, ChatResponse
    from trainers.cli.judges import Progress

    class Answers:
        identity, stats = "fake", {"calls": 3, "retries": 1, "cache_hits": 2, "failed": 0}

        async def complete(self, request):
            return ChatResponse("ok", "[[A]]")

    stream = io.StringIO()
    progress = Progress(Answers(), every_s=0.0, stream=stream)
    asyncio.run(progress.complete(ChatRequest(messages=({"role": "user", "content": "q"},))))
    assert progress.identity == "fake"
    assert stream.getvalue() == ("judged 1 requests so far: 3 calls to the endpoint (1 retries), 2 answers from the "
                                 "cache, 0 failed\n")
