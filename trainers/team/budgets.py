"""The thinking-budget curve: the held-out set at several per-turn token budgets.

`marl eval --budgets 8,16,32` and `train.budget_curve: [8, 16, 32]` (at the end of `marl run`) both
call `budget_curve(player, tasks, budgets)`. For each budget N, every agent's per-turn budget
becomes N tokens, and the held-out tasks are played once each at temperature 0, the whole team, with
the seeds `marl eval` uses (task i gets seed + i), no retries and no credit replays. A model agent's
budget is capped at what its model's context allows (the context minus `max_prompt_tokens`, else
minus one prompt token; the row lists caps under `capped`), and its prompts are fitted as a run with
`max_tokens: N` fits them. Scripted agents ignore budgets. Per budget:

    team_success      share of tasks the team solves (masked episodes left out)
    team_reward       mean team reward (cooperative scenarios; None otherwise)
    tokens_per_turn   mean tokens a model agent wrote per turn, its stop token not counted
    at_budget         share of those turns that hit the budget (no stop token within N tokens)
    model_turns       turns whose tokens were counted (a model actor reports them; None figures: none)

`write_budget_curve` writes budget_curve.json, budget_curve.md and budget_curve.png (every file
atomically); `log_budget_curve` is `marl run`'s end-of-training hook (tracker keys
`eval/budget/<N>/<figure>`, and a section for the run's report.md).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

from common.files import atomic_file, write_text_atomically
from marl.rollout import EpisodeJob, EpisodePlayer
from marl.scenario.spec import MAX_NEW_TOKENS

FIGURES = ("team_success", "team_reward", "tokens_per_turn", "at_budget")
EXAMPLE = "e.g. --budgets 8,16,32"
MAX_BUDGET = MAX_NEW_TOKENS  # a budget past an agent's longest turn is no budget


def parse_budgets(text: str, flag: str = "--budgets") -> list[int]:
    """'8,16,32' as [8, 16, 32] (sorted); ValueError in one line naming the problem and the fix for an
    empty list or item, a value that is not a whole number, a budget below 1, or a budget given twice."""
    items = [item.strip() for item in str(text).split(",")]
    if not any(items):
        raise ValueError(f"{flag} {text!r}: no budget given; list per-turn token budgets separated by commas, "
                         f"{EXAMPLE}")
    budgets = []
    for item in items:
        if not item:
            raise ValueError(f"{flag} {text}: an empty item between commas; list whole numbers of tokens "
                             f"separated by single commas, {EXAMPLE}")
        try:
            budget = int(item)
        except ValueError:
            raise ValueError(f"{flag} {text}: {item!r} is not a whole number of tokens; list whole numbers "
                             f"separated by commas, {EXAMPLE}") from None
        if budget > MAX_BUDGET:
            raise ValueError(f"{flag} {text[:60]}: {str(budget)[:40]} is more than {MAX_BUDGET:,} tokens, the most an "
                             f"agent may write in one turn (agents[].max_tokens); {EXAMPLE}")
        if budget < 1:
            raise ValueError(f"{flag} {text}: {budget} is below 1 (a turn needs at least one token); give "
                             f"budgets of 1 or more, {EXAMPLE}")
        if budget in budgets:
            raise ValueError(f"{flag} {text}: {budget} is given twice; list each budget once, {EXAMPLE}")
        budgets.append(budget)
    return sorted(budgets)


def budget_curve(player, tasks: list, budgets: list[int], *, seed: int = 0) -> dict:
    """The team's held-out figures at each per-turn token budget (module docstring), as a JSON-able dict.

    `player` is an EpisodePlayer (or anything with its `scenario`, `actors`, `seats`, `max_tokens` and
    `scorer`, such as the Ray backend's): its actors play here, in this process, and are left as found."""
    from marl.env import ScenarioEnv

    if not tasks:
        raise ValueError("the budget curve needs at least one held-out task (set tasks.eval_count in the scenario)")
    scenario = player.scenario
    env = ScenarioEnv(scenario, tasks=list(tasks), scorer=player.scorer)  # the judges are built once
    local = EpisodePlayer(scenario, dict(player.actors), dict(player.seats), env=env, max_tokens=player.max_tokens)
    rows = [_at_budget(local, player.actors, tasks, budget, seed) for budget in sorted(budgets)]
    return {"scenario": scenario.spec.name, "mode": scenario.spec.mode, "tasks": len(tasks), "seed": seed,
            "default_max_tokens": dict(player.max_tokens), "rows": rows}


def _at_budget(local, actors: dict, tasks: list, budget: int, seed: int) -> dict:
    """One row of the curve: every task played greedily with every agent's budget set to `budget`."""
    from trainers.grpo.shared import nanmean
    from trainers.team.metrics import success

    scenario = local.scenario
    budgets = {agent: min(budget, _context_cap(actors[local.seats[agent]], scenario.spec) or budget)
               for agent in scenario.agent_names}
    written: list[tuple[int, bool]] = []  # (tokens, hit the budget) of every counted model turn
    local.actors = {name: _Measured(actor, budgets, written) for name, actor in actors.items()}
    local.max_tokens = budgets
    jobs = [EpisodeJob(task, seed + index) for index, task in enumerate(tasks)]
    episodes = local.play(jobs, greedy=True).episodes
    mode = scenario.spec.mode
    return {"budget": budget,
            "team_success": _plain(nanmean(success(e, mode) for e in episodes)),
            "team_reward": _plain(nanmean(e.team_reward() for e in episodes)) if mode == "cooperative" else None,
            "tokens_per_turn": statistics.fmean(t for t, _ in written) if written else None,
            "at_budget": statistics.fmean(hit for _, hit in written) if written else None,
            "model_turns": len(written),
            "masked_episodes": sum(math.isnan(success(e, mode)) for e in episodes),
            "capped": {agent: value for agent, value in budgets.items() if value < budget}}


def _context_cap(actor, spec) -> int | None:
    """The longest answer a model actor's context leaves room for (None: not a model, or no known context)."""
    model = getattr(actor, "model", None)
    if model is None:
        return None
    from trainers.policy.prompts import model_context

    context = model_context(model)
    if context is None:
        return None
    return max(1, context - (spec.max_prompt_tokens or 1))


class _Measured:
    """An actor at one budget: its agents' prompts fitted for that budget (as a run with max_tokens N
    fits them), and the tokens of every row it writes counted. Never trainable: nothing it samples is
    kept for training."""

    trainable = False

    def __init__(self, actor, budgets: dict[str, int], written: list):
        self.actor, self.budgets, self.written = actor, budgets, written

    def act(self, requests, *, max_new_tokens, greedy: bool = False, keys=None):
        """The actor's answers (its styles fitted to the budget for the call), their tokens counted."""
        styles = getattr(self.actor, "styles", None)
        if isinstance(styles, dict):
            self.actor.styles = {agent: replace(style, max_tokens=self.budgets.get(agent, style.max_tokens))
                                 for agent, style in styles.items()}
        try:
            generation = self.actor.act(requests, max_new_tokens=max_new_tokens, greedy=greedy, keys=keys)
        finally:
            if isinstance(styles, dict):
                self.actor.styles = styles
        self.written.extend(_written(generation.completions))
        return generation


def _written(completions) -> list[tuple[int, bool]]:
    """(tokens written, hit the budget) per row of a model's completions: the mask covers the tokens up
    to and including the stop token; a truncated row wrote no stop token. [] when there are no tokens."""
    if completions is None or not hasattr(completions, "completion_mask"):
        return []
    lengths = completions.completion_mask.sum(dim=1).tolist()
    truncated = completions.truncated.tolist()
    return [(int(length) - (0 if cut else 1), bool(cut)) for length, cut in zip(lengths, truncated)]


def _plain(value: float) -> float | None:
    return None if value is None or math.isnan(value) else value


# -- reports ------------------------------------------------------------------------------------


def write_budget_curve(curve: dict, out_dir: str | Path) -> tuple[Path, Path, Path]:
    """Write the curve as out_dir/budget_curve.json, budget_curve.md and budget_curve.png; return the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path, png_path = (out / f"budget_curve.{ext}" for ext in ("json", "md", "png"))
    write_text_atomically(json_path, json.dumps(curve, indent=2) + "\n")
    write_text_atomically(md_path, f"# marl eval: {curve['scenario']}, thinking-budget curve\n\n"
                          + budget_markdown(curve) + f"\n![thinking-budget curve]({png_path.name})\n")
    plot_budget_curve(curve, png_path)
    return json_path, md_path, png_path


def budget_markdown(curve: dict) -> str:
    """The curve as a sentence and a markdown table (one row per budget)."""
    default = ", ".join(f"{agent} {tokens}" for agent, tokens in curve["default_max_tokens"].items())
    lines = [f"{curve['tasks']} held-out tasks at temperature 0, checkpoint: {curve.get('checkpoint', '-')}; "
             f"every agent's per-turn budget set to each value in tokens (the scenario's own: {default}).", "",
             "| budget (tokens/turn) | team success | team reward | tokens written per turn | turns at the budget |",
             "|---|---|---|---|---|"]
    for row in curve["rows"]:
        cells = [_cell(row[name], ".2f" if name == "tokens_per_turn" else ".3f") for name in FIGURES]
        lines.append(f"| {row['budget']} | " + " | ".join(cells) + " |")
    capped = [f"{row['budget']} ({', '.join(f'{a} {t}' for a, t in row['capped'].items())})"
              for row in curve["rows"] if row["capped"]]
    if capped:
        lines += ["", "Capped by the model's context: " + "; ".join(capped) + "."]
    return "\n".join(lines) + "\n"


def _cell(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def budget_table(curve: dict) -> str:
    """A short plain-text table of the curve for the terminal."""
    lines = [f"thinking-budget curve ({curve['tasks']} held-out tasks, temperature 0):",
             f"  {'budget':>8}{'success':>10}{'tokens/turn':>13}{'at budget':>11}"]
    lines += [f"  {row['budget']:>8}{_cell(row['team_success'], '.3f'):>10}"
              f"{_cell(row['tokens_per_turn'], '.2f'):>13}{_cell(row['at_budget'], '.3f'):>11}"
              for row in curve["rows"]]
    return "\n".join(lines)


def plot_budget_curve(curve: dict, path: Path) -> Path:
    """Team success and the share of turns at the budget against the budget (log2 axis), with the tokens
    written per turn on a second axis; matplotlib's object-oriented API, written atomically."""
    from matplotlib.figure import Figure

    rows = curve["rows"]
    budgets = [row["budget"] for row in rows]
    figure = Figure(figsize=(7, 4), dpi=100)
    axes = figure.add_subplot()
    for index, (name, label) in enumerate((("team_success", "team success"), ("at_budget", "turns at the budget"))):
        points = [(row["budget"], row[name]) for row in rows if row[name] is not None]
        if points:
            axes.plot(*zip(*points), marker="os"[index], color=f"C{index}", label=label)
    tokens = [(row["budget"], row["tokens_per_turn"]) for row in rows if row["tokens_per_turn"] is not None]
    handles = axes.get_legend_handles_labels()
    if tokens:  # on its own axis from 0, so a small change does not look like a large one
        twin = axes.twinx()
        twin.plot(*zip(*tokens), marker="^", linestyle=":", color="C2", label="tokens written per turn")
        twin.set_ylim(0, 1.1 * max(max(t for _, t in tokens), 1))
        twin.set_ylabel("tokens written per turn")
        handles = [a + b for a, b in zip(handles, twin.get_legend_handles_labels())]
    if len(budgets) > 1:
        axes.set_xscale("log", base=2)
    axes.set_xticks(budgets, [str(b) for b in budgets])
    axes.set_ylim(-0.05, 1.05)
    axes.set_xlabel("per-turn token budget")
    axes.set_ylabel("share")
    axes.set_title(f"{curve['scenario']}: thinking-budget curve ({curve['tasks']} held-out tasks, temperature 0)")
    axes.grid(alpha=0.3)
    if handles[0]:
        axes.legend(*handles, fontsize="small", loc="best")
    figure.tight_layout()
    with atomic_file(Path(path), "wb") as handle:
        figure.savefig(handle, format="png")
    return Path(path)


# -- the end of `marl run` ----------------------------------------------------------------------


def log_budget_curve(trainer, tasks: list, tracker, out: Path, log=print) -> str:
    """`train.budget_curve` at the end of `marl run`: the final policy's curve on the held-out `tasks`,
    written to the run directory, logged as `eval/budget/<N>/<figure>` (with `eval/step`) and as a
    `budget_curve` table; returns the section of report.md ('' when the setting is off)."""
    budgets = list(trainer.config.loop.budget_curve)
    if not budgets:
        return ""
    if not tasks:
        log("train.budget_curve: no held-out tasks to measure it on; set tasks.eval_count")
        return ""
    curve = {**budget_curve(trainer.player, tasks, budgets), "checkpoint": f"step {trainer.step_count}"}
    write_budget_curve(curve, out)
    figures = {f"eval/budget/{row['budget']}/{name}": row[name] for row in curve["rows"] for name in FIGURES
               if row[name] is not None}
    tracker.log({"eval/step": trainer.step_count, **figures})
    tracker.log_table("budget_curve", ["step", "budget", *FIGURES],
                      [[trainer.step_count, row["budget"], *(row[name] for name in FIGURES)] for row in curve["rows"]])
    log("thinking-budget curve, team success: "
        + ", ".join(f"{row['budget']} tokens {_cell(row['team_success'], '.3f')}" for row in curve["rows"])
        + f" ({len(tasks)} held-out tasks, temperature 0; budget_curve.md)")
    return ("## Thinking-budget curve (train.budget_curve)\n\n" + budget_markdown(curve)
            + "\n![thinking-budget curve](budget_curve.png)\n")
