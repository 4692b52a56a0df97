"""`marl eval SCENARIO --checkpoint DIR`: the held-out set at temperature 0 (work in trainers/checkpoint_eval.py).

    marl eval relay                                  the base model (train.model) on relay's held-out tasks
    marl eval relay --checkpoint runs/relay          the run's newest checkpoint (checkpoints/latest)
    marl eval relay --checkpoint runs/relay/checkpoints/step-000200
    marl eval relay --checkpoint runs/own --seat left=final --seat final=left   the role-swap test
    marl eval relay --budgets 2,4,8,16               also the thinking-budget curve (budget_curve.json, .md, .png)

The checkpoint's `model/` plays every 'shared' agent and `model-<agent>/` the agent with that name;
model agents the checkpoint has no directory for play the base model. `--seat AGENT=OTHER` has AGENT's
seat played by OTHER's policy (AGENT keeps its own observation and role prompt): with per-role
policies (`policy: own`), swapping two roles shows whether each policy specialised. A checkpoint of a
run with train.selfplay.converge: average plays what the run served, the mixture of its iterates (one
drawn per game), unless --last-iterate. eval.json and eval.md go to --out (default: the checkpoint's run
directory, else runs/<scenario>-eval).
"""

from __future__ import annotations

from pathlib import Path

from trainers.checkpoint_eval import evaluate_checkpoint, reseat
from trainers.cli.common import (UsageError, add_judge_cache_argument, add_scenario_arguments, judge_cache_path, judged,
                                  path_value, quiet_libraries, training_errors, usage_errors)
from trainers.judging import CACHE_FILE, resolve_local_judges
from trainers.records.layout import resolve_checkpoint, run_dir_of
from trainers.team.budgets import budget_table, parse_budgets, write_budget_curve
from trainers.team.evaluation import format_value, seating_note, served_note, write_eval_report


def add_parser(commands) -> None:
    """Register `marl eval SCENARIO`."""
    evaluate = commands.add_parser("eval", help="held-out metrics of a checkpoint at temperature 0 (JSON and markdown)")
    add_scenario_arguments(evaluate)
    evaluate.add_argument("--checkpoint", metavar="DIR", type=path_value,
                          help="a run directory (its newest checkpoint) or a checkpoints/step-N directory; "
                               "default: the base model")
    evaluate.add_argument("--out", metavar="DIR", type=path_value,
                          help="where eval.json and eval.md go (default: the run directory, "
                               "else runs/<scenario>-eval)")
    evaluate.add_argument("--tasks", type=int, metavar="N", help="evaluate the first N held-out tasks only")
    evaluate.add_argument("--retries", type=int, default=1, help="retries of a failed task for the pass rate "
                                                                 "(default 1; 0 makes it the first-try success)")
    evaluate.add_argument("--no-credit", action="store_true", help="skip credit replays (no credit summary, no "
                                                                   "effective reasoning rate)")
    evaluate.add_argument("--seat", action="append", default=[], metavar="AGENT=OTHER",
                          help="AGENT's seat is played by OTHER's policy (repeatable; e.g. --seat left=final "
                               "--seat final=left is the role-swap test)")
    evaluate.add_argument("--last-iterate", action="store_true",
                          help="a checkpoint of a train.selfplay.converge: average run serves the mixture of its "
                               "iterates (one drawn per game); this plays the checkpoint's own weights instead")
    evaluate.add_argument("--seed", type=int, default=0, help="seed of the first episode (task i gets seed + i)")
    evaluate.add_argument("--budgets", metavar="N,N,...",
                          help="per-turn token budgets, e.g. 8,16,32: the held-out set is also played at each "
                               "(temperature 0) and the thinking-budget curve written as budget_curve.json, "
                               ".md and .png beside eval.json")
    add_judge_cache_argument(evaluate, "judge_cache.sqlite in --out's folder (with --checkpoint RUN_DIR and no --out: "
                                       "the run's own cache, so the judgments the run paid for are read back)")
    evaluate.set_defaults(handler=run)


def run(args) -> int:
    """Validate the scenario, load the checkpoint's models, evaluate, print a table, write the reports."""
    from marl.scenario.load import load_scenario

    with usage_errors(ValueError):  # checked first: a malformed list writes nothing and loads nothing
        budgets = parse_budgets(args.budgets) if args.budgets is not None else []
    quiet_libraries()
    with usage_errors(FileNotFoundError):  # a scenario's own problems are printed by main, one line each
        scenario = load_scenario(args.scenario, args.set)
        tasks = held_out_tasks(scenario, args.tasks)
    played_by = parse_seats(args.seat, scenario.agent_names)
    if args.retries < 0:
        raise UsageError(f"--retries {args.retries}: expected 0 or more")
    if args.retries > 100:  # each retry replays the failed task: a huge count plays for ever
        raise UsageError(f"--retries {str(args.retries)[:40]}: at most 100 (each retry plays a failed task again)")
    with usage_errors(*training_errors()):
        scenario = resolve_local_judges(scenario, args.cache_dir)  # a local judge's GGUF model: its converted directory
        checkpoint = resolve_checkpoint(args.checkpoint)
        out = Path(args.out) if args.out else run_dir_of(checkpoint) or Path("runs") / f"{scenario.spec.name}-eval"
        with judged(scenario, judge_cache_path(args.judge_cache, out / CACHE_FILE)):  # a dead judge: exit 2 first
            result = evaluate_checkpoint(scenario, tasks, checkpoint, args.cache_dir, seed=args.seed,
                                         credit=not args.no_credit, retries=args.retries, played_by=played_by,
                                         budgets=budgets, last_iterate=args.last_iterate)
    curve = result.pop("budget_curve", None)
    json_path, md_path = _write(result, out)
    print(eval_table(result))
    print(f"wrote {json_path} and {md_path}")
    if curve is not None:
        _write_curve(curve, out)
    return 0


def _write_curve(curve: dict, out: Path) -> None:
    try:
        paths = write_budget_curve(curve, out)
    except OSError as error:
        raise UsageError(f"--out {out}: cannot write the budget curve ({error.strerror or error})") from None
    print(budget_table(curve))
    print("wrote " + ", ".join(str(path) for path in paths))


def parse_seats(values: list[str], agents) -> dict[str, str]:
    """`--seat AGENT=OTHER` values as {agent: other}; UsageError (one line) for a malformed or unknown name."""
    played_by = {}
    for value in values:
        agent, sep, other = (part.strip() for part in value.partition("="))
        if not sep or not agent or not other:
            raise UsageError(f"--seat {value!r}: expected AGENT=OTHER, e.g. --seat left=final")
        if agent in played_by:
            raise UsageError(f"--seat {value}: {agent!r} is seated twice")
        played_by[agent] = other
    with usage_errors(ValueError):  # a name that is not an agent: reseat's one line, before any model loads
        reseat({agent: agent for agent in agents}, played_by)
    return played_by


def held_out_tasks(scenario, limit: int | None) -> list:
    """The fixed held-out tasks: the first `limit`, else train.eval_tasks of them, else all."""
    _, tasks = scenario.split()
    if not tasks:
        raise UsageError(f"scenario {scenario.spec.name!r} has no held-out tasks: set tasks.eval_count, "
                         "e.g. --set tasks.eval_count=50")
    if limit is not None and limit < 1:
        raise UsageError(f"--tasks {limit}: expected 1 or more")
    limit = limit or scenario.spec.train.eval_tasks
    return tasks[:limit] if limit else tasks


def _write(result: dict, out: Path) -> tuple[Path, Path]:
    try:
        return write_eval_report(result, out)
    except OSError as error:
        raise UsageError(f"--out {out}: cannot write the reports ({error.strerror or error})") from None


def eval_table(result: dict) -> str:
    """A short plain-text table of the metrics (and per-agent credit) for the terminal."""
    lines = [f"{result['scenario']}: {result['tasks']} held-out tasks, temperature 0, {result['checkpoint']}"
             + seating_note(result) + served_note(result)]
    lines += [f"  {name:<26}{format_value(value):>8}" for name, value in result["metrics"].items()]
    para = result["paraphrase"]
    lines.append(f"  (paraphrases: {para['tasks_reached']} of {para['tasks_with_variants']} tasks with variants "
                 "changed what an agent saw)")
    if result["credit"]:
        lines += [f"  credit {agent:<19}{format_value(c['value']):>8}  share {format_value(c['share'])}"
                  for agent, c in result["credit"]["agents"].items()]
    return "\n".join(lines)
