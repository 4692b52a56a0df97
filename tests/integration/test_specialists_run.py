"""`marl run specialists` end to end, briefly: the default shared policy and a LoRA adapter per role
(the two conditions bench/roles.py compares), on a tiny model of a few SFT steps so that the test
spends seconds, not the scenario's full build."""

from __future__ import annotations

import json

import pytest

from trainers.cli.main import main

SHORT = ["train.steps=2", "train.prompts_per_step=2", "train.group_size=2", "train.warmup.rl_steps=0",
         "train.warmup.sft_max_steps=4", "train.warmup.sft_batch_size=8", "train.warmup.sft_time_budget_s=5",
         "train.eval_tasks=4", "train.threads=1"]
PER_ROLE_LORA = ["agents.0.policy=own", "agents.1.policy=own", "agents.2.policy=own", "train.lora.r=4"]


@pytest.mark.parametrize("extra", [(), PER_ROLE_LORA], ids=["shared", "own_lora"])
def test_a_short_run_completes_and_reports_held_out_team_success(extra, tmp_path, capsys):
    out = tmp_path / "run"
    settings = [item for setting in SHORT + list(extra) for item in ("--set", setting)]
    assert main(["run", "specialists", *settings, "--cache-dir", str(tmp_path / "cache"), "--out", str(out),
                 "--tracker", "jsonl"]) == 0
    assert "team success" in capsys.readouterr().out  # the before -> after line
    before, after = (json.loads((out / f"{when}.json").read_text()) for when in ("before", "after"))
    for figures in (before, after):
        assert 0.0 <= figures["team_success"] <= 1.0
        assert {f"agent/{agent}/reward" for agent in ("adder", "subtractor", "final")} <= set(figures)
