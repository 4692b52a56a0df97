"""`marl rollout FILE`: play episodes of a scenario with a fixed policy, print transcripts (needs no torch)."""

from __future__ import annotations

import json
import math
import statistics

from trainers.cli.common import add_play_arguments, setup_play, usage_errors


def add_parser(commands) -> None:
    """Register `marl rollout FILE`."""
    rollout = commands.add_parser("rollout", help="play episodes of a scenario with a fixed policy")
    rollout.add_argument("file", metavar="FILE", help="scenario file or built-in name (relay, weather, ...)")
    add_play_arguments(rollout, episodes=3)
    rollout.add_argument("--quiet", action="store_true", help="print only the summary line")
    rollout.add_argument("--credit", action="store_true", help="also print each agent's credit (scenario's credit section)")
    rollout.set_defaults(handler=run)


def run(args) -> int:
    """Play episodes with one policy and print their transcripts and reward breakdowns."""
    from marl.policies import rollout

    with usage_errors(ValueError, FileNotFoundError):  # a bad policy, file or --episodes: one line
        scenario, policy, env, tasks = setup_play(args.file, args.set, args.policy, args.seed, args.episodes)
        means = []
        for index, task in enumerate(tasks):
            result = rollout(env, policy, task=task, seed=args.seed + index)
            means.append(statistics.fmean(result.rewards.values()) if scenario.spec.mode == "cooperative"
                         else max(b.total for b in result.breakdown.values()))
            if not args.quiet:
                print_episode(result)
            if args.credit and not args.quiet:
                _print_episode_credit(env, policy, task, args.seed + index)
    valid = [m for m in means if not math.isnan(m)]
    summary = {"scenario": scenario.spec.name, "policy": args.policy, "episodes": len(means),
               "mean_reward": statistics.fmean(valid) if valid else None, "masked": len(means) - len(valid)}
    print(json.dumps(summary))
    return 0


def _format_breakdown(name: str, breakdown) -> list[str]:
    lines = [f"  reward[{name}] = {breakdown.total:.3f}  layers: " + ", ".join(
        f"{layer} {score:.2f}" if score is not None else f"{layer} -" for layer, score in breakdown.layers.items())]
    for part in breakdown.components:
        score = "failed" if part["score"] is None else f"{part['score']:.2f}"
        lines.append(f"    {part['layer']:<8} {part['kind']:<11} {score:>6}  {part['rationale'][:90]}")
    for penalty in breakdown.penalties:
        if penalty["applied"]:
            lines.append(f"    penalty  {penalty['kind']:<11} -{penalty['amount']:.2f}  {penalty['rationale'][:90]}")
    return lines


def print_episode(result) -> None:
    """A readable transcript with each heard observation, the action, tool results and rewards."""
    print(f"task {result.task.id}: {result.task.prompt!r}  (answer {result.task.answer!r})")
    for turn in result.observations:
        print(f"  {turn['agent']} sees {turn['observation']!r}")
        print(f"  {turn['agent']} says {turn['action']!r}")
    for name, breakdown in result.breakdown.items():
        for line in _format_breakdown(name, breakdown):
            print(line)
    print("  rewards: " + ", ".join(f"{agent} {value:+.3f}" for agent, value in result.rewards.items()))


def _print_episode_credit(env, policy, task, seed) -> None:
    from marl.credit.coalitions import episode_credit

    estimate, _ = episode_credit(env, policy, task, seed=seed)
    shares = ", ".join(f"{agent} {value:+.3f}±{estimate.stderr[agent]:.3f}" for agent, value in estimate.values.items())
    print(f"  credit ({estimate.method}, {estimate.n_evals} coalitions): {shares}; sum {sum(estimate.values.values()):+.3f}")
