"""`marl credit`'s table with masked episodes (issue 27, item 5): a judge failure in an episode makes
its credit NaN; the table reports the episode as masked and summarises the others, never crashing
on the NaN (statistics.stdev raised ValueError) and never reading it as 0."""

from __future__ import annotations

import math

from marl.credit.exact import CreditEstimate
from marl.scenario.load import load_scenario
from trainers.cli.credit import _print_credit_table


def _estimate(left: float, right: float) -> CreditEstimate:
    return CreditEstimate({"left": left, "right": right}, {"left": 0.0, "right": 0.0}, 4, "shapley/exact")


def _table(capsys, results) -> list[str]:
    _print_credit_table(load_scenario("relay"), "expert", results)
    return capsys.readouterr().out.splitlines()


def test_a_masked_episode_is_reported_and_left_out(capsys):
    lines = _table(capsys, [_estimate(0.25, 0.75), _estimate(math.nan, math.nan), _estimate(0.75, 0.25)])
    assert lines[1] == ("masked: 1 of 3 episodes (a judge failed in the episode or a replay); their credit is "
                        "left out of the table, never read as 0")
    rows = {line.split()[0]: [float(x) for x in line.split()[1:]] for line in lines[3:5]}
    assert rows == {"left": [0.5, 0.0, 0.3536], "right": [0.5, 0.0, 0.3536]}  # the two scored episodes only
    assert lines[-1].endswith("mean sum of credit: 1.0000")


def test_every_episode_masked_is_one_clear_line(capsys):
    lines = _table(capsys, [_estimate(math.nan, 0.5), _estimate(math.nan, math.nan)])
    assert lines[1:] == ["masked: 2 of 2 episodes (a judge failed in the episode or a replay); their credit is "
                         "left out of the table, never read as 0", "no credit to show: every episode was masked"]
