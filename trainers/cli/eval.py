"""`marl eval SCENARIO --checkpoint DIR`: the held-out set at temperature 0 (metrics in trainers/team/evaluation.py).

    marl eval relay                                  the base model (train.model) on relay's held-out tasks
    marl eval relay --checkpoint runs/relay          the run's newest checkpoint (checkpoints/latest)
    marl eval relay --checkpoint runs/relay/checkpoints/step-000200

The checkpoint's `model/` plays every 'shared' agent and `model-<agent>/` the agent with that name;
model agents the checkpoint has no directory for play the base model. eval.json and eval.md go to
--out (default: the checkpoint's run directory, else runs/<scenario>-eval).
"""

from __future__ import annotations

import sys
from pathlib import Path


def add_eval_parser(commands) -> None:
    """Register `marl eval SCENARIO`."""
    from trainers.cli.run import add_scenario_arguments

    evaluate = commands.add_parser("eval", help="held-out metrics of a checkpoint at temperature 0 (JSON and markdown)")
    add_scenario_arguments(evaluate)
    evaluate.add_argument("--checkpoint", metavar="DIR",
                          help="a run directory (its newest checkpoint) or a checkpoints/step-N directory; "
                               "default: the base model")
    evaluate.add_argument("--out", metavar="DIR", help="where eval.json and eval.md go (default: the run directory, "
                                                      "else runs/<scenario>-eval)")
    evaluate.add_argument("--tasks", type=int, metavar="N", help="evaluate the first N held-out tasks only")
    evaluate.add_argument("--retries", type=int, default=1, help="retries of a failed task for the pass rate "
                                                                 "(default 1; 0 makes it the first-try success)")
    evaluate.add_argument("--no-credit", action="store_true", help="skip credit replays (no credit summary, no "
                                                                   "effective reasoning rate)")
    evaluate.add_argument("--seed", type=int, default=0, help="seed of the first episode (task i gets seed + i)")
    evaluate.set_defaults(handler=eval_command)


def eval_command(args) -> int:
    """Validate the scenario, load the checkpoint's models, evaluate, print a table, write the reports."""
    from marl.scenario.load import ScenarioError, load_scenario
    from trainers.cli.main import UsageError, _quiet_libraries

    _quiet_libraries()
    try:
        scenario = load_scenario(args.scenario, args.set)
        tasks = held_out_tasks(scenario, args.tasks)
    except ScenarioError as error:
        for problem in error.problems:
            print(problem, file=sys.stderr)
        return 2
    except FileNotFoundError as error:
        raise UsageError(str(error)) from None
    if args.retries < 0:
        raise UsageError(f"--retries {args.retries}: expected 0 or more")
    checkpoint = resolve_checkpoint(args.checkpoint)
    result = _evaluate(scenario, tasks, checkpoint, args)
    out = Path(args.out) if args.out else default_out_dir(checkpoint, scenario.spec.name)
    json_path, md_path = _write(result, out)
    print(eval_table(result))
    print(f"wrote {json_path} and {md_path}")
    return 0


def held_out_tasks(scenario, limit: int | None) -> list:
    """The fixed held-out tasks: the first `limit`, else train.eval_tasks of them, else all."""
    from trainers.cli.main import UsageError

    _, tasks = scenario.split()
    if not tasks:
        raise UsageError(f"scenario {scenario.spec.name!r} has no held-out tasks: set tasks.eval_count, "
                         "e.g. --set tasks.eval_count=50")
    if limit is not None and limit < 1:
        raise UsageError(f"--tasks {limit}: expected 1 or more")
    limit = limit or scenario.spec.train.eval_tasks
    return tasks[:limit] if limit else tasks


def resolve_checkpoint(path: str | None) -> Path | None:
    """The checkpoint directory named by --checkpoint (a run directory means its newest checkpoint)."""
    from trainers.runs.checkpoint import latest_checkpoint
    from trainers.cli.main import UsageError

    if path is None:
        return None
    given = Path(path)
    if not given.is_dir():
        raise UsageError(f"--checkpoint {path}: no such directory (pass a run directory or its "
                         "checkpoints/step-N directory)")
    if _model_dirs(given):
        from trainers.runs.checkpoint import CheckpointError, verified_checkpoint

        try:
            return verified_checkpoint(given)  # a damaged checkpoint is one line, not a load traceback
        except CheckpointError as error:
            raise UsageError(str(error)) from None
    if (given / "checkpoints").is_dir():
        latest = latest_checkpoint(given)
        if latest is None:
            raise UsageError(f"--checkpoint {path}: the run has no complete checkpoint (checkpoints/latest "
                             "names none); pass a checkpoints/step-N directory")
        return latest
    raise UsageError(f"--checkpoint {path}: neither a run directory (no checkpoints/) nor a checkpoint "
                     "(no model/ or model-<agent>/ directory)")


def _model_dirs(checkpoint: Path) -> dict[str, Path]:
    """Actor name -> model directory of a checkpoint ('shared' for model/, the agent for model-<agent>/)."""
    found = {}
    for directory in sorted(checkpoint.glob("model*")):
        if (directory / "config.json").exists() and (directory.name == "model" or directory.name.startswith("model-")):
            found["shared" if directory.name == "model" else directory.name.removeprefix("model-")] = directory
    return found


def load_actors(scenario, checkpoint: Path | None, cache_dir: str | None, log=print) -> tuple[dict, dict]:
    """The scenario's actors and seats, the checkpoint's models in place of the base (module docstring)."""
    from trainers.policy.actors import build_actors
    from trainers.cli.main import UsageError
    from trainers.run import base_model_dir
    from trainers.policy.tinylm import load_policy

    trained = _model_dirs(checkpoint) if checkpoint is not None else {}
    keys = {"shared" if a.policy == "shared" else a.name for a in scenario.spec.agents if _model_played(a)}
    if checkpoint is not None and not keys & set(trained):
        raise UsageError(f"--checkpoint {checkpoint}: no agent of {scenario.spec.name!r} is played by a model it "
                         f"holds (it has {', '.join(d.name + '/' for d in trained.values())}; agents: "
                         f"{', '.join(f'{a.name}={a.policy}' for a in scenario.spec.agents)})")
    on_base = {"shared" if a.policy == "shared" else a.name for a in scenario.spec.agents
               if a.policy in ("shared", "own")}  # actors build_actors makes from the base model
    base = None
    if on_base - set(trained):
        base = base_model_dir(scenario, cache_dir, log)
    elif on_base:
        base = trained.get("shared", trained[min(on_base)])
    train = scenario.spec.train
    actors, seats = build_actors(scenario, base, temperature=train.temperature, top_p=train.top_p, seed=train.seed)
    for key, directory in trained.items():
        if key in actors and hasattr(actors[key], "model") and not (key == "shared" and directory == base):
            actors[key].model, actors[key].tokenizer = load_policy(directory)
    return actors, seats


def _model_played(agent) -> bool:
    from trainers.policy.actors import SCRIPTED

    return agent.policy in ("shared", "own") or not (agent.policy in SCRIPTED or ":" in agent.policy)


def _evaluate(scenario, tasks, checkpoint, args) -> dict:
    import torch

    from trainers.cli.main import UsageError
    from marl.rollout import EpisodePlayer
    from trainers.run import RunError
    from trainers.team.evaluation import evaluate_scenario

    torch.set_num_threads(scenario.spec.train.threads)
    try:
        actors, seats = load_actors(scenario, checkpoint, args.cache_dir)
        credit = scenario.spec.credit
        default = scenario.resolve(credit.default_policy) if credit.default_policy else None
        player = EpisodePlayer(scenario, actors, seats, default_policy=default)
        result = evaluate_scenario(player, tasks, seed=args.seed, credit=not args.no_credit, retries=args.retries)
    except (RunError, FileNotFoundError, ValueError) as error:
        raise UsageError(str(error)) from None
    return {**result, "checkpoint": str(checkpoint) if checkpoint is not None else "base model"}


def default_out_dir(checkpoint: Path | None, name: str) -> Path:
    """The run directory a checkpoint belongs to (RUN/checkpoints/step-N), else runs/<name>-eval."""
    if checkpoint is not None and checkpoint.parent.name == "checkpoints":
        return checkpoint.parent.parent
    return Path("runs") / f"{name}-eval"


def _write(result: dict, out: Path) -> tuple[Path, Path]:
    from trainers.cli.main import UsageError
    from trainers.team.evaluation import write_eval_report

    try:
        return write_eval_report(result, out)
    except OSError as error:
        raise UsageError(f"--out {out}: cannot write the reports ({error.strerror or error})") from None


def eval_table(result: dict) -> str:
    """A short plain-text table of the metrics (and per-agent credit) for the terminal."""
    from trainers.team.evaluation import format_value

    lines = [f"{result['scenario']}: {result['tasks']} held-out tasks, temperature 0, {result['checkpoint']}"]
    lines += [f"  {name:<26}{format_value(value):>8}" for name, value in result["metrics"].items()]
    para = result["paraphrase"]
    lines.append(f"  (paraphrases: {para['tasks_reached']} of {para['tasks_with_variants']} tasks with variants "
                 "changed what an agent saw)")
    if result["credit"]:
        lines += [f"  credit {agent:<19}{format_value(c['mean']):>8}  share {format_value(c['share'])}"
                  for agent, c in result["credit"]["agents"].items()]
    return "\n".join(lines)
