"""`marl credit FILE`: per-agent credit of a scenario under a fixed policy, over several episodes (needs no torch)."""

from __future__ import annotations

import math
import statistics

from marl.credit.coalitions import episode_credit
from marl.options import ABSENT_MODES, CREDIT_ESTIMATORS, CREDIT_METHODS, one_of
from trainers.cli.common import (add_judge_cache_argument, add_play_arguments, judge_cache_path, judged, path_value,
                                 setup_play, usage_errors)

CREDIT_FLAGS = ("method", "estimator", "absent", "budget", "rollouts")  # each one is a credit.<flag> override


def add_parser(commands) -> None:
    """Register `marl credit FILE`."""
    credit = commands.add_parser("credit", help="per-agent credit of a scenario under a fixed policy")
    credit.add_argument("file", metavar="FILE", type=path_value, help="scenario file or built-in name")
    add_play_arguments(credit, episodes=10)
    credit.add_argument("--method", help=one_of(CREDIT_METHODS))
    credit.add_argument("--estimator", help=one_of(CREDIT_ESTIMATORS))
    credit.add_argument("--absent", help=one_of(ABSENT_MODES))
    credit.add_argument("--budget", type=int, help="coalition evaluations per episode")
    credit.add_argument("--rollouts", type=int, help="seeded rollouts per coalition")
    add_judge_cache_argument(credit, "$MARL_CACHE/judge_cache.sqlite (~/.cache/marl), shared with marl rollout")
    credit.set_defaults(handler=run)


def run(args) -> int:
    """Per-agent credit over several episodes: mean credit, its standard error, method, evaluations."""
    overrides = list(args.set) + [f"credit.{key}={getattr(args, key)}" for key in CREDIT_FLAGS
                                  if getattr(args, key) is not None]
    with usage_errors(ValueError, FileNotFoundError):  # a bad policy, file or --episodes: one line
        scenario, policy, env, tasks = setup_play(args.file, overrides, args.policy, args.seed, args.episodes)
        with judged(scenario, judge_cache_path(args.judge_cache)):  # replays read the cache
            results = [episode_credit(env, policy, task, seed=args.seed + i)[0] for i, task in enumerate(tasks)]
        _print_credit_table(scenario, args.policy, results)
    return 0


def _masked(result) -> bool:
    """A judge failed in the episode or a replay: its credit is NaN, to be left out, never read as 0."""
    return any(math.isnan(value) for value in result.values.values())


def _print_credit_table(scenario, policy_name: str, results) -> None:
    agents, scored = list(results[0].values), [r for r in results if not _masked(r)]
    masked = len(results) - len(scored)
    print(f"{scenario.spec.name}: {results[0].method} credit, policy {policy_name}, {len(results)} episodes, "
          f"absent = {scenario.spec.credit.absent}")
    if masked:
        print(f"masked: {masked} of {len(results)} episodes (a judge failed in the episode or a replay); "
              "their credit is left out of the table, never read as 0")
    if not scored:
        print("no credit to show: every episode was masked")
        return
    print(f"{'agent':<14}{'credit':>10}{'stderr':>10}{'sd over episodes':>20}")
    for agent in agents:
        values = [r.values[agent] for r in scored]
        within = math.sqrt(statistics.fmean(r.stderr[agent] ** 2 for r in scored) / len(scored))
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"{agent:<14}{statistics.fmean(values):>10.4f}{within:>10.4f}{spread:>20.4f}")
    evaluations = statistics.fmean(r.n_evals for r in results)
    total = statistics.fmean(sum(r.values.values()) for r in scored)
    print(f"evaluations per episode: {evaluations:.1f}; mean sum of credit: {total:.4f}")
