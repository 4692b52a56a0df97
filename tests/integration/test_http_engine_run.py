"""`marl run` generating through the HTTP engine against a real `marl serve --enable-lora` on 127.0.0.1.

The run publishes each trained adapter under a versioned name whenever its weights change, samples
every turn from the version it just published, corrects and reports the sampler/trainer mismatch,
and unloads its adapters when it ends.
"""

from __future__ import annotations

import json
import threading

import pytest

from marl.scenario.load import load_scenario
from trainers.run import RunOptions, base_model_dir, run_scenario

SMALL = ["train.stages=[main]", "train.steps=4", "train.group_size=4", "train.prompts_per_step=2",
         "tasks.count=24", "tasks.eval_count=4", "train.lora.r=4", "train.lr=0.05", "train.tracking.tracker=none",
         "credit.method=team"]


@pytest.fixture
def server(demo_model_dir):
    """`marl serve --enable-lora` of relay's base model (the demo model: asking for the fixture orders this test
    after the session's background build of it, tests/conftest.py)."""
    from trainers.engine.server import make_http_server

    base = base_model_dir(load_scenario("relay"), None, log=lambda *_: None)
    assert base == demo_model_dir
    httpd = make_http_server(base, port=0, name="tiny", enable_lora=True)
    loaded: list[str] = []
    load = httpd.service.load_adapter
    httpd.service.load_adapter = lambda payload: (loaded.append(payload["lora_name"]), load(payload))[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", httpd, loaded
    httpd.shutdown()
    httpd.server_close()


def test_a_run_generates_through_the_server_with_fresh_adapters_and_reports_the_mismatch(server, tmp_path):
    url, httpd, loaded = server
    out = tmp_path / "run"
    run_scenario(RunOptions("relay", SMALL + ["train.engine.kind=http", f"train.engine.url={url}"], out=str(out)),
                 log=lambda *_: None)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [row for row in rows if row.get("policy/shared/trained_rows")]
    assert trained and all("engine/mismatch_kl" in row for row in trained)  # measured on every trained batch
    # the server sampled with the weights the trainer holds: its logprobs are the trainer's, to float precision
    assert all(row["engine/mismatch_kl"] < 1e-6 and row["engine/unknown_logprobs"] == 0.0 for row in trained)
    versions = [int(name.rsplit("-v", 1)[1]) for name in loaded]
    assert versions == list(range(len(versions))) and len(versions) >= 2  # a new version once the weights moved
    assert len(set(loaded)) == len(loaded)  # no name loaded twice
    assert [m["id"] for m in httpd.service.models()["data"]] == ["tiny"]  # unloaded when the run ended
    assert not any((out / "engine_adapters").iterdir())


def test_an_unreachable_server_is_one_line_before_any_step(tmp_path, capsys):
    import socket

    from trainers.cli.main import main

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = ["run", "relay", "--out", str(tmp_path / "run")]
    for item in SMALL + ["train.engine.kind=http", f"train.engine.url=http://127.0.0.1:{port}/v1"]:
        argv += ["--set", item]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no OpenAI-compatible server answers there" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
