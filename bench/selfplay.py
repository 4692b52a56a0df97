"""Benchmark self-play against the opponent pool on the two games with exact referees.

Run from a checkout: `python bench/selfplay.py` (both games, 3 conditions x 2 seeds x 100 steps:
about 2 hours on a 2-core CPU), `--games tictactoe --seeds 1 --steps 60` for a shorter look, or
`--quick` (1 seed x 1 step of self and fixed on each game, on tiny models warmed up for 20 SFT steps, for
tests/integration/test_benchmarks.py).

Conditions, differing only in `train.selfplay` (everything else is the scenario's defaults):

    self     pure self-play: the learner plays only itself (self_play_fraction 1)
    pool     the default pool: half the steps against a snapshot drawn by prioritised fictitious
             self-play (snapshots every 10 steps, Elo ratings), half against itself
    fixed    the pool, plus a quarter of the steps against a fixed opponent of the scenario
             (`train.selfplay.fixed_opponents`): tic-tac-toe's random player (never minimax, which
             is what the evaluation measures), Kuhn poker's equilibrium player
    mmd      pure self-play with `train.selfplay.converge: mmd` (magnetic mirror descent: a KL pull of
             magnet_weight toward a magnet reset to the current policy every magnet_every steps)
    average  pure self-play with `train.selfplay.converge: average`: the served policy is the mixture
             of every iterate's snapshot, one drawn per game

Each condition's served policy is evaluated too (`served/*`): the last iterate, except under `average`,
where it is the mixture (`trainer.serving()`, what `marl run`'s held-out evaluation plays). With
`--expert uniform` (or `check`), Kuhn poker's expert, and so its tiny model's build and any warm-up SFT,
is a player that does not imitate the equilibrium (kuhn_poker_lib:uniform_expert: each offered word with
probability 1/2, exploitability 0.458; check_expert: always the passive word, exploitability 1).

With `--warmup`, each seed first runs the scenario's warm-up SFT once (what `marl run` does before RL:
SFT on the expert's moves until the sampled accuracy among experts reaches train.warmup.accuracy_target,
within sft_time_budget_s), and every condition of that seed starts from those weights: the question is
then whether self-play keeps or loses a strong start.

Measured per (game, condition, seed) at step 0 and every `--eval-every` steps, greedy, on the
scenario's held-out tasks (`trainers.team.evaluation.evaluate_team`):

    tictactoe   vs/minimax/not_lost: games not lost against the perfect minimax player, both seats
                (1 is the best reachable); vs/random/not_lost too
    kuhn_poker  game/exploitability: exact, from the game tree, of the mixed strategy the model plays
                when sampling (0 at an equilibrium; lower is better); and game/exploitability_average,
                of the average of that strategy over every step so far (from the start): the strategy of
                drawing one of the run's policies each hand, which fictitious play converges with

The summary gives each curve's best and last value, and the drop from the best to the last (the
collapse pure self-play shows on tic-tac-toe). The last line, `ratio: ...`, is the pool-with-fixed-
opponent condition's last tic-tac-toe not-lost share over pure self-play's (the anchor, trained in
this run), each floored at one game in the evaluation set so that a collapse to 0 stays finite
(with `--games kuhn_poker` alone: pure self-play's last exploitability over the fixed condition's).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GAMES = {  # game -> (the figure followed, whether higher is better, the fixed opponent of `fixed`)
    "tictactoe": ("vs/minimax/not_lost", True, "random"),
    "kuhn_poker": ("game/exploitability", False, "nash"),
}
CONDITIONS = ("self", "pool", "fixed", "mmd", "average")
DEFAULT_CONDITIONS = ("self", "pool", "fixed")
EXPERTS = {"nash": None, "uniform": "kuhn_poker_lib:uniform_expert", "check": "kuhn_poker_lib:check_expert"}
SERVED = "served/game/exploitability"  # Kuhn poker: of the policy a run serves (the mixture under `average`)
AVERAGE = "game/exploitability_average"  # Kuhn poker: of the average of the iterates (IterateAverage)


def condition_settings(condition: str, game: str, seed: int) -> list[str]:
    """--set overrides of one condition (see the module doc)."""
    settings = [f"train.seed={seed}", "train.threads=1"]
    if condition == "self":
        return settings + ["train.selfplay.self_play_fraction=1.0"]
    if condition in ("mmd", "average"):  # pure self-play, converging by the setting alone
        return settings + ["train.selfplay.self_play_fraction=1.0", f"train.selfplay.converge={condition}"]
    if condition == "fixed":
        return settings + [f"train.selfplay.fixed_opponents={{{GAMES[game][2]}: 0.25}}"]
    return settings


def warmed_start(game: str, settings: list[str]) -> dict:
    """The shared model's weights after the scenario's warm-up SFT (`marl run`'s first stage: SFT on
    the expert's moves until the format and the accuracy among experts reach their targets, within
    the time budget), so that every condition of a seed starts from the same warmed-up policy."""
    from trainers.run import RunOptions, prepare
    from trainers.stages.warmup import sft_warmup_stage

    scenario, train_tasks, _, trainer, _ = prepare(RunOptions(game, settings), log=lambda message: None)
    report = sft_warmup_stage(trainer, scenario, train_tasks, scenario.spec.train.warmup, log=lambda message: None)
    accuracy = {agent: round(value, 2) for row in report["learners"].values()
                for agent, value in row.get("accuracy_after", row["accuracy_before"]).items()}
    print(f"  {game}: warm-up {report['sft_steps']} SFT steps, accuracy among experts {accuracy}", flush=True)
    return {key: value.clone() for key, value in trainer.actors["shared"].model.state_dict().items()}


def train_condition(game: str, settings: list[str], steps: int, eval_every: int, start: dict | None = None) -> dict:
    """Train `steps` steps (from the `start` weights when given); the held-out figures at step 0 and every
    `eval_every` steps."""
    from trainers.run import RunOptions, prepare
    from trainers.team.evaluation import evaluate_team

    _, _, eval_tasks, trainer, _ = prepare(RunOptions(game, settings), log=lambda message: None)
    if start is not None:
        trainer.actors["shared"].model.load_state_dict(start)
        trainer.restart_frozen_copies()  # the KL reference and the first snapshot are the warmed-up model
    iterates = IterateAverage(trainer.player) if game == "kuhn_poker" else None
    curve, seconds = [(0, evaluate_team(trainer.player, eval_tasks) | _average(iterates) | _served(trainer, eval_tasks))], 0.0
    for step in range(1, steps + 1):
        started = time.perf_counter()
        trainer.step()
        seconds += time.perf_counter() - started
        if iterates is not None:
            iterates.add()  # a measurement, not training: outside the seconds
        if step % eval_every == 0 or step == steps:
            curve.append((step, evaluate_team(trainer.player, eval_tasks) | _average(iterates) | _served(trainer, eval_tasks)))
    return {"curve": curve, "seconds": seconds, "games": len(eval_tasks)}


def _served(trainer, eval_tasks) -> dict:
    """`served/*`: figures of the policy the run serves, the mixture of the iterates under converge: average
    (else the last iterate, whose figures are already there): the scenario's own figures (Kuhn poker's exact
    exploitability) and, under `average`, the held-out games against every opponent (tic-tac-toe's
    `served/vs/minimax/not_lost`)."""
    from trainers.team.evaluation import evaluate_team, scenario_figures

    averaged = trainer.selfplay is not None and trainer.selfplay.average is not None
    figures = {}
    with trainer.serving() as player:
        if trainer.spec.evaluation:
            figures |= scenario_figures(player)
        if averaged and not trainer.spec.evaluation:
            figures |= evaluate_team(player, eval_tasks)
    return {f"served/{key}": value for key, value in figures.items()}


class IterateAverage:
    """Kuhn poker's average of self-play's iterates: the mixed strategy the model plays after every step
    (from the start), and the exploitability of their average (`kuhn_poker_lib.average_strategy`: the
    strategy of drawing one of the step's policies each hand, what fictitious play converges with)."""

    def __init__(self, player):
        from trainers.team.evaluation import learned_policy

        resolve = player.scenario.resolve
        self.policy = learned_policy(player)
        self.strategy_of = resolve("kuhn_poker_lib:mixed_strategy_of")
        self.average = resolve("kuhn_poker_lib:average_strategy")
        self.exploitability = resolve("kuhn_poker_lib:exploitability")
        self.strategies = []
        self.add()

    def add(self) -> None:
        """Read the current policy's strategy (12 forward passes)."""
        self.strategies.append(self.strategy_of(self.policy))

    def figure(self) -> float:
        """Exploitability of the average of the strategies read so far."""
        return self.exploitability(self.average(self.strategies))


def _average(iterates: IterateAverage | None) -> dict:
    return {} if iterates is None else {AVERAGE: iterates.figure()}


def summary(run: dict, figure: str, higher: bool) -> dict:
    """First, best and last value of the figure, and the drop from the best to the last."""
    values = [(step, figures[figure]) for step, figures in run["curve"] if figure in figures]
    best_step, best = (max if higher else min)(values, key=lambda point: point[1])
    last = values[-1][1]
    return {"first": values[0][1], "best": best, "best_step": best_step, "last": last,
            "drop": (best - last) if higher else (last - best)}


def print_game(game: str, results: dict, seeds: list[int], conditions: list[str]) -> dict:
    """The curves and the per-condition summary of one game; returns the mean last value per condition."""
    figure, higher, _ = GAMES[game]
    print(f"\n{game}: {figure} ({'higher' if higher else 'lower'} is better) by step")
    for (condition, seed), run in results.items():
        points = " ".join(f"{step}:{figures.get(figure, float('nan')):.3f}" for step, figures in run["curve"])
        extra = ""
        if game == "tictactoe":
            last = run["curve"][-1][1]
            extra = "  vs random " + " ".join(f"{figures.get('vs/random/not_lost', float('nan')):.2f}"
                                             for _, figures in run["curve"]) \
                + "  last vs minimax by seat " + " ".join(
                    f"{seat} {last.get(f'vs/minimax/{seat}/not_lost', float('nan')):.2f}" for seat in ("x", "o"))
            if "served/vs/minimax/not_lost" in last:  # converge: average serves the mixture of the iterates
                extra += "  served vs minimax " + " ".join(
                    f"{figures['served/vs/minimax/not_lost']:.3f}" for _, figures in run["curve"]) + " by seat " + \
                    " ".join(f"{seat} {last[f'served/vs/minimax/{seat}/not_lost']:.2f}" for seat in ("x", "o"))
        if game == "kuhn_poker":
            extra = "  average of the iterates " + " ".join(f"{figures.get(AVERAGE, float('nan')):.3f}"
                                                         for _, figures in run["curve"]) \
                + "  served " + " ".join(f"{figures.get(SERVED, float('nan')):.3f}" for _, figures in run["curve"])
        print(f"  {condition:<7} seed {seed}: {points}{extra}")
    print(f"  {'':<7} {'first':>6} {'best':>6} {'@step':>6} {'last':>6} {'drop':>6} {'s/step':>7}")
    lasts = {}
    for condition in conditions:
        rows = [summary(results[condition, seed], figure, higher) for seed in seeds]
        mean = {key: statistics.fmean(row[key] for row in rows) for key in rows[0]}
        per_step = statistics.fmean(results[condition, seed]["seconds"] for seed in seeds) / \
            max(1, results[condition, seeds[0]]["curve"][-1][0])
        print(f"  {condition:<7} {mean['first']:>6.3f} {mean['best']:>6.3f} {mean['best_step']:>6.0f} "
              f"{mean['last']:>6.3f} {mean['drop']:>6.3f} {per_step:>7.2f}")
        lasts[condition] = mean["last"]
    if game == "kuhn_poker":  # the average of the iterates (IterateAverage) and the served policy, beside the last
        for name, key in (("average of the iterates", AVERAGE), ("served policy", SERVED)):
            print(f"  {name}, last: " + ", ".join(
                f"{condition} {statistics.fmean(results[condition, seed]['curve'][-1][1][key] for seed in seeds):.3f}"
                for condition in conditions))
    return lasts


QUICK_SFT_STEPS = 20


def parse_args(argv=None):
    """Command-line options (see --help)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", default="tictactoe,kuhn_poker", help="games, comma-separated (default both)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per condition (0..N-1; default 2)")
    parser.add_argument("--steps", type=int, default=100, help="training steps per run (default 100)")
    parser.add_argument("--eval-every", type=int, default=10, help="steps between evaluations (default 10)")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="a scenario override applied to every condition (repeatable), e.g. train.beta=0.04")
    parser.add_argument("--conditions", default=",".join(DEFAULT_CONDITIONS),
                        help=f"conditions to run, comma-separated, of {','.join(CONDITIONS)} (default "
                             f"{','.join(DEFAULT_CONDITIONS)})")
    parser.add_argument("--expert", choices=tuple(EXPERTS), default="nash",
                        help="Kuhn poker's expert, which its tiny model and any warm-up imitate: nash (the "
                             "scenario's), uniform (each word 1/2) or check (always passive); default nash")
    parser.add_argument("--warmup", action="store_true",
                        help="start every condition of a seed from the scenario's warm-up SFT (train.warmup: SFT on "
                             "the expert until the accuracy among experts reaches accuracy_target, e.g. --set "
                             "train.warmup.accuracy_target=0.9), as marl run does")
    parser.add_argument("--quick", action="store_true", help="1 seed x 1 step of self and fixed on each game, tiny models warmed up for 20 SFT steps")
    args = parser.parse_args(argv)
    if args.quick:  # what the comparison needs (the ratio's two conditions), not the whole table
        args.seeds, args.steps, args.eval_every, args.conditions = 1, 1, 1, "self,fixed"
        # a tiny model warmed up for tens of SFT steps, not the default 300: the quick mode checks that
        # the comparison runs and yields its ratio, not what a trained model is worth
        args.settings = [f"train.warmup.sft_max_steps={QUICK_SFT_STEPS}", *args.settings]
    args.games = [game.strip() for game in args.games.split(",") if game.strip()]
    unknown = [game for game in args.games if game not in GAMES]
    if unknown or not args.games:
        parser.error(f"--games: {', '.join(unknown) or 'none given'}; choose from {', '.join(GAMES)}")
    args.conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    if not args.conditions or any(c not in CONDITIONS for c in args.conditions):
        parser.error(f"--conditions: choose from {', '.join(CONDITIONS)}")
    return args


def main(argv=None) -> int:
    """Train every condition on every game and seed; print the curves, the summaries and the ratio."""
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from bench.support.runtime import one_quiet_thread

    one_quiet_thread()
    seeds = list(range(args.seeds))
    print(f"self-play conditions {', '.join(args.conditions)}; games {', '.join(args.games)}; {args.seeds} seeds x "
          f"{args.steps} steps; evaluation every {args.eval_every} steps on the held-out tasks"
          + ("; every condition from the warm-up's SFT" if args.warmup else "")
          + (f"; every condition with {' '.join(args.settings)}" if args.settings else "")
          + (f"; Kuhn poker's expert {args.expert}" if args.expert != "nash" else ""))
    # the run is the main stage, `--steps` long, so an lr schedule (train.lr_schedule) spans exactly the run
    span = [f"train.steps={args.steps}", "train.stages=[main]"]
    lasts, games_per_eval = {}, {}
    for game in args.games:
        results = {}
        expert = [f"expert={EXPERTS[args.expert]}"] if game == "kuhn_poker" and EXPERTS[args.expert] else []
        for seed in seeds:
            start = warmed_start(game, condition_settings("self", game, seed) + span + expert + args.settings) \
                if args.warmup else None
            for condition in args.conditions:
                settings = condition_settings(condition, game, seed) + span + expert + args.settings
                run = train_condition(game, settings, args.steps, args.eval_every, start)
                results[condition, seed] = run
                games_per_eval[game] = run["games"]
                print(f"  {game} {condition:<7} seed {seed}: {run['seconds']:.0f} s training", flush=True)
        lasts[game] = print_game(game, results, seeds, args.conditions)
    if "tictactoe" not in lasts:  # Kuhn poker alone: exploitability, lower is better
        last = lasts["kuhn_poker"]
        if "self" not in last or len(last) < 2:
            print("ratio: skipped (--conditions must include self and another to compare; the anchor is pure "
                  "self-play)")
            return 0
        best = "fixed" if "fixed" in last else next(c for c in last if c != "self")
        ratio = max(last["self"], 1e-3) / max(last[best], 1e-3)
        print(f"ratio: {ratio:.2f} (kuhn_poker exploitability at the last step, pure self-play / {best}, each "
              f"floored at 0.001; anchor: pure self-play, trained in this run)")
        return 0
    floor = 1 / (2 * games_per_eval["tictactoe"])  # one game of the evaluation (both seats)
    last = lasts["tictactoe"]
    if "self" not in last or len(last) < 2:
        print("ratio: skipped (--conditions must include self and another to compare; the anchor is pure self-play)")
        return 0
    best = "fixed" if "fixed" in last else next(c for c in last if c != "self")
    ratio = max(last[best], floor) / max(last["self"], floor)
    print(f"ratio: {ratio:.2f} (tictactoe not lost vs minimax at the last step, {best} / "
          f"pure self-play, each floored at {floor:.3f}; anchor: pure self-play, trained in this run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
