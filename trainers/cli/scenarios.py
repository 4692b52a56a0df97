"""`marl validate` and `marl rollout`: check scenario files, and play episodes with a fixed policy.

These commands need no torch: they import only marl and judges.
"""

from __future__ import annotations

import json
import math
import statistics
import sys


def validate_command(args) -> int:
    """Print every problem of every file on stderr (FILE:LINE:COL: key.path: message); exit 2 if any."""
    from marl.scenario.load import ScenarioError, load_scenario

    failures = 0
    for file in args.files:
        try:
            scenario = load_scenario(file, args.set)
            tasks = scenario.tasks()
        except ScenarioError as error:
            failures += 1
            for problem in error.problems:
                print(problem, file=sys.stderr)
            continue
        except FileNotFoundError as error:
            failures += 1
            print(f"{file}:0:0: (file): {error}", file=sys.stderr)
            continue
        spec = scenario.spec
        print(f"{file}: ok ({spec.mode}, {len(spec.agents)} agents, {len(tasks)} tasks, "
              f"{len(spec.tools)} tools)")
    return 2 if failures else 0


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


def reports_problems(command):
    """Wrap a command: scenario problems print one per line (exit 2); other bad input exits with one line."""
    def run(args) -> int:
        from marl.scenario.load import ScenarioError

        try:
            return command(args)
        except ScenarioError as error:
            for problem in error.problems:
                print(problem, file=sys.stderr)
            return 2
        except (ValueError, FileNotFoundError) as error:
            print(f"marl: error: {error}", file=sys.stderr)
            return 2

    run.__doc__ = command.__doc__
    return run


def _setup(file, overrides, policy_name: str, seed: int, episodes: int):
    """The scenario, the policy, an env, and the tasks to play (held-out tasks first)."""
    from marl.env import make_env
    from marl.policies import get_policy
    from marl.scenario.load import load_scenario

    if episodes < 1:
        raise ValueError(f"--episodes {episodes}: expected 1 or more")
    scenario = load_scenario(file, overrides)
    policy = get_policy(policy_name, scenario, seed=seed)
    train, held_out = scenario.split()
    return scenario, policy, make_env(scenario), (held_out or train)[:episodes]


@reports_problems
def rollout_command(args) -> int:
    """Play episodes with one policy and print their transcripts and reward breakdowns."""
    from marl.policies import rollout

    scenario, policy, env, tasks = _setup(args.file, args.set, args.policy, args.seed, args.episodes)
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


def _print_episode_credit(env, policy, task, seed) -> None:
    from marl.credit.coalitions import episode_credit

    estimate, _ = episode_credit(env, policy, task, seed=seed)
    shares = ", ".join(f"{agent} {value:+.3f}±{estimate.stderr[agent]:.3f}" for agent, value in estimate.values.items())
    print(f"  credit ({estimate.method}, {estimate.n_evals} coalitions): {shares}; sum {sum(estimate.values.values()):+.3f}")


@reports_problems
def credit_command(args) -> int:
    """Per-agent credit over several episodes: mean credit, its standard error, method, evaluations."""
    from marl.credit.coalitions import episode_credit

    overrides = list(args.set) + [f"credit.{key}={getattr(args, key)}" for key in ("method", "estimator", "absent",
                                                                                  "budget", "rollouts")
                                  if getattr(args, key) is not None]
    scenario, policy, env, tasks = _setup(args.file, overrides, args.policy, args.seed, args.episodes)
    results = [episode_credit(env, policy, task, seed=args.seed + i)[0] for i, task in enumerate(tasks)]
    _print_credit_table(scenario, args.policy, results)
    return 0


def _print_credit_table(scenario, policy_name: str, results) -> None:
    agents = list(results[0].values)
    print(f"{scenario.spec.name}: {results[0].method} credit, policy {policy_name}, {len(results)} episodes, "
          f"absent = {scenario.spec.credit.absent}")
    print(f"{'agent':<14}{'credit':>10}{'stderr':>10}{'sd over episodes':>20}")
    for agent in agents:
        values = [r.values[agent] for r in results]
        within = math.sqrt(statistics.fmean(r.stderr[agent] ** 2 for r in results) / len(results))
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"{agent:<14}{statistics.fmean(values):>10.4f}{within:>10.4f}{spread:>20.4f}")
    evaluations = statistics.fmean(r.n_evals for r in results)
    total = statistics.fmean(sum(r.values.values()) for r in results)
    print(f"evaluations per episode: {evaluations:.1f}; mean sum of credit: {total:.4f}")
