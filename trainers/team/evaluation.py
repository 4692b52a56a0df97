"""Held-out evaluation of a team on a scenario: the fixed evaluation tasks at temperature 0.

`evaluate_team(player, tasks)` plays every task once, greedily, all episodes in lockstep, and
returns the team figures (team success, mean reward, mean reward per agent, and with format scorers
`well_formed/<agent>`: the format layer of each agent's own answers, apart from success); `marl run`
uses it for its before/after numbers.

`evaluate_scenario(player, tasks)` is what `marl eval` reports (trainers/cli/eval.py). Every
episode, credit replays included, is decoded greedily. Masked episodes (a judge failed) are left out
of every share and counted in `masked_episodes`. The metrics:

    first_try_success        share of tasks the team solves in its first greedy episode, no prefix
    pass_rate                share of tasks solved within 1 + `retries` attempts: a failed task is
                             replayed with the failure reason put before every observation (as the
                             reflection stage does); with retries=0 it equals first_try_success
    tool_call_validity       mean, over (episode, agent) pairs that called a tool, of the share of
                             well-formed calls (None: no agent called a tool)
    format_compliance        mean format-layer score of the first-try episodes (None: no format scorers)
    paraphrase_robustness    share of tasks whose team success is the same under every wording of the
                             task (its prompt and its `variants`), among tasks where a wording changed
                             what some agent saw (None: no such task; scenarios that build observations
                             from task metadata, like relay, never show the prompt)
    effective_reasoning_rate share of successful first-try episodes in which every agent's message
                             mattered: silencing any one agent (its difference reward with
                             null_message replays) lowers the team reward. Independent of the scenario's
                             credit section (cooperative scenarios with credit on; else None)
    vs/NAME/...              competitive and mixed scenarios: the games against each fixed opponent of
                             the scenario (`against_opponents`)
    game/NAME                the scenario's `evaluation` function's exact figures (`scenario_figures`)

and `credit`: each agent's mean credit over the first-try episodes (`value`) and its `share`, its
summed credit over the sum of every agent's |summed credit|, negative when it did worse than the
stand-in it is measured against (the scenario's `credit` section; cooperative scenarios only).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from common.files import write_text_atomically
from marl.rollout import EpisodeJob, PolicyActor
from marl.scenario.spec import CreditSpec
from marl.types import Task

CREDIT_EPS = 1e-9  # a credit at or below this did not matter

DEFINITIONS = {
    "pass_rate": "tasks solved within 1 + retries greedy attempts (a retry shows the failure reason)",
    "first_try_success": "tasks solved by the first greedy episode, with no retry",
    "tool_call_validity": "mean share of well-formed tool calls per agent and episode",
    "format_compliance": "mean format-layer score of the first-try episodes",
    "paraphrase_robustness": "tasks whose success agrees across every wording that reached the agents",
    "effective_reasoning_rate": "successful episodes in which silencing any one agent lowers the team reward",
}


def evaluate_team(player, tasks: list[Task], *, seed: int = 0, opponent_actors: dict | None = None) -> dict[str, float]:
    """Greedy (temperature 0) team success, mean team reward and per-agent reward on `tasks`; in
    competitive scenarios also the games against the scenario's fixed `opponents` and against
    `opponent_actors` (name -> actor, e.g. the run's initial policy as 'initial'; see against_opponents)."""
    from trainers.team.metrics import is_masked, nanmean, success

    if not tasks:
        raise ValueError("evaluation needs at least one task (set tasks.eval_count in the scenario)")
    mode = player.scenario.spec.mode
    player.context = "the held-out evaluation"  # what the Ray backend's error lines (and death counts) name
    episodes = player.play([EpisodeJob(task, seed + index) for index, task in enumerate(tasks)], greedy=True).episodes
    figures = {"team_success": nanmean(success(e, mode) for e in episodes),
               "team_reward": nanmean(e.team_reward() for e in episodes) if mode == "cooperative" else math.nan,
               "masked_episodes": float(sum(is_masked(e) for e in episodes)),
               "episodes": float(len(episodes))}
    for agent in player.scenario.agent_names:
        figures[f"agent/{agent}/reward"] = nanmean(e.rewards.get(agent, math.nan) for e in episodes)
    figures.update(well_formed(player, episodes))
    if mode != "cooperative":
        figures.update(against_opponents(player, tasks, seed=seed, actors=opponent_actors))
    if player.scenario.spec.evaluation:
        figures.update(scenario_figures(player))
    return {key: value for key, value in figures.items() if not math.isnan(value)}


def well_formed(player, episodes) -> dict[str, float]:
    """`well_formed/<agent>`: the mean format-layer score of each agent's own last message, where it spoke
    (apart from whether the team succeeded: learning the format alone is not learning the task), and
    `well_formed` over every agent's messages. Empty without format scorers (rewards.format)."""
    agents = player.scenario.agent_names
    scores: dict[str, list[float]] = {agent: [] for agent in agents}
    for episode in episodes:
        own = player.scorer.own_format_scores(episode.task or episode.job.task, episode.transcript,
                                              episode.tool_log, agents)
        for agent, score in own.items():
            scores[agent].append(score)
    figures = {f"well_formed/{agent}": statistics.fmean(values) for agent, values in scores.items() if values}
    every = [value for values in scores.values() for value in values]
    return {**figures, "well_formed": statistics.fmean(every)} if every else {}


def learned_policy(player):
    """The player's actors as one greedy `policy(agent, observation, task) -> text`, each agent answered
    by the actor of its seat within its max_tokens (what a scenario's `evaluation` function queries).

    The policy also has `probabilities(agent, observation, task, messages) -> [p, ...]`: how likely the
    seat's actor is to say each message when it samples (ModelActor.message_probabilities), or None for
    an actor that cannot say (a scripted or endpoint one): a game's exact figures of the mixed strategy.
    A player that serves a mixture of snapshots (trainers/team/served.py) gives its own policy, whose
    `mixture` lists (weight, component policy)."""
    served = getattr(player, "learned_policy", None)
    return served() if served is not None else LearnedPolicy(player)


class LearnedPolicy:
    """A player's trained team as a callable greedy policy with message probabilities (learned_policy)."""

    def __init__(self, player):
        self.player = player

    def __call__(self, agent: str, observation: str, task) -> str:
        actor = self.player.actors[self.player.seats[agent]]
        return actor.act([(agent, observation, task)], max_new_tokens=self.player.max_tokens[agent],
                         greedy=True).texts[0]

    def probabilities(self, agent: str, observation: str, task, messages: list[str]) -> list[float] | None:
        """The seat's actor's probability of saying each message when sampling, None if it cannot say."""
        actor = self.player.actors[self.player.seats[agent]]
        probe = getattr(actor, "message_probabilities", None)
        return None if probe is None else probe(agent, observation, task, messages,
                                                 max_new_tokens=self.player.max_tokens[agent])


def scenario_figures(player) -> dict[str, float]:
    """`game/NAME` of the scenario's `evaluation` function on the learned policy (Kuhn poker's exact
    exploitability, say); a function that fails, or returns anything but numbers, is a ValueError."""
    spec = player.scenario.spec
    try:
        figures = player.scenario.resolve(spec.evaluation)(learned_policy(player))
    except Exception as error:  # noqa: BLE001 - the scenario's own code: name it in one line
        raise ValueError(f"evaluation {spec.evaluation} raised {type(error).__name__}: {error}") from None
    if not isinstance(figures, dict) or not all(isinstance(v, (int, float)) for v in figures.values()):
        raise ValueError(f"evaluation {spec.evaluation} returned {figures!r:.80}, not a {{name: number}} dict")
    return {f"game/{name}": float(value) for name, value in figures.items()}


def against_opponents(player, tasks: list[Task], *, seed: int = 0, actors: dict | None = None) -> dict[str, float]:
    """The learned policy in each seat in turn, every other seat played by each of the scenario's fixed
    `opponents` (tic-tac-toe's minimax and random players) and each of `actors` (name -> an actor, such
    as the run's initial policy), greedy: per opponent and seat its mean zero-sum reward, the share of
    games it did not lose and the share it won (`vs/NAME/SEAT/reward`, `.../not_lost`, `.../won`), and
    `vs/NAME/not_lost` and `vs/NAME/won` over the seats. Against a perfect player, not losing is the
    best there is."""
    from marl.policies import get_policy

    scenario, figures = player.scenario, {}
    opponents = {name: PolicyActor(get_policy(reference, scenario, seed), order=scenario.agent_names)
                 for name, reference in scenario.spec.opponents.items()}
    # a scenario opponent of the same name keeps it (a user's 'initial' is the scenario's own)
    opponents.update({name: actor for name, actor in (actors or {}).items() if name not in opponents})
    for name, actor in opponents.items():
        key = f"opponent:{name}"
        player.actors[key] = actor
        try:
            figures.update(_games_against(player, tasks, name, key, seed))
        finally:
            del player.actors[key]
    return figures


def _games_against(player, tasks: list[Task], name: str, key: str, seed: int) -> dict[str, float]:
    """vs/NAME/* of the learned policy in each seat, every other seat played by actor `key`."""
    from trainers.team.metrics import nanmean

    figures, kept, won = {}, [], []
    for seat in player.scenario.agent_names:
        others = {agent: key for agent in player.scenario.agent_names if agent != seat}
        jobs = [EpisodeJob(task, seed + index, seats=others) for index, task in enumerate(tasks)]
        rewards = [e.rewards.get(seat, math.nan) for e in player.play(jobs, greedy=True).episodes]
        figures[f"vs/{name}/{seat}/reward"] = nanmean(rewards)
        figures[f"vs/{name}/{seat}/not_lost"] = nanmean(float(r >= -1e-9) for r in rewards if r == r)
        figures[f"vs/{name}/{seat}/won"] = nanmean(float(r > 1e-9) for r in rewards if r == r)
        kept.append(figures[f"vs/{name}/{seat}/not_lost"])
        won.append(figures[f"vs/{name}/{seat}/won"])
    figures[f"vs/{name}/not_lost"], figures[f"vs/{name}/won"] = nanmean(kept), nanmean(won)
    return figures


class GreedyPlayer:
    """An EpisodePlayer whose every `play` decodes greedily (credit replays too)."""

    def __init__(self, player):
        self._player = player

    def __getattr__(self, name):
        return getattr(self._player, name)

    def play(self, jobs, *, greedy: bool = True):
        """Play the jobs at temperature 0, whatever the caller asks."""
        return self._player.play(jobs, greedy=True)


def evaluate_scenario(player, tasks: list[Task], *, seed: int = 0, credit: bool = True,
                      retries: int = 1) -> dict:
    """Every `marl eval` metric on `tasks` at temperature 0, as a JSON-able dict (module docstring)."""
    from trainers.team.metrics import success

    if not tasks:
        raise ValueError("evaluation needs at least one task (set tasks.eval_count in the scenario)")
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    greedy, spec = GreedyPlayer(player), player.scenario.spec
    jobs = [EpisodeJob(task, seed + index) for index, task in enumerate(tasks)]
    episodes = greedy.play(jobs).episodes
    first = [success(e, spec.mode) for e in episodes]
    solved = _solved_with_retries(greedy, episodes, first, retries)
    paraphrase = _paraphrase_agreement(greedy, episodes, first)
    credits = _credit_summary(greedy, episodes, first) if credit and spec.mode == "cooperative" else None
    metrics = {"pass_rate": _share(solved), "first_try_success": _share(first),
               "tool_call_validity": _tool_call_validity(episodes),
               "format_compliance": _format_compliance(episodes) if spec.rewards.format else None,
               "paraphrase_robustness": paraphrase.pop("robustness"),
               "effective_reasoning_rate": credits.pop("effective_reasoning_rate") if credits else None}
    if spec.mode != "cooperative":  # the games against the scenario's fixed opponents (vs/NAME/won, ...)
        metrics.update(against_opponents(player, tasks, seed=seed))
    if spec.evaluation:  # the scenario's exact figures of the learned policy (game/NAME)
        metrics.update(scenario_figures(player))
    rows = [{"task": task.id, "first_try": _plain(f), "solved": _plain(s), "variants_agree": agree}
            for task, f, s, agree in zip(tasks, first, solved, paraphrase.pop("agree"))]
    return {"scenario": spec.name, "mode": spec.mode, "tasks": len(tasks), "seed": seed, "retries": retries,
            "metrics": metrics, "masked_episodes": sum(math.isnan(f) for f in first),
            "paraphrase": paraphrase, "credit": credits, "per_task": rows}


# -- pass rate with retries ---------------------------------------------------------------------


def failure_reason(episode) -> str:
    """Why an episode failed, in one line: the first outcome scorer that did not give full marks."""
    for breakdown in episode.breakdown.values():
        for part in breakdown.components:
            if part["layer"] == "outcome" and (part["score"] is None or part["score"] < 1.0):
                return " ".join((part["rationale"] or f"{part['kind']} scored {part['score']}").split())
    return "the last answer failed"


def _solved_with_retries(player, episodes, first: list[float], retries: int) -> list[float]:
    """Per task: 1 if an attempt up to 1 + retries succeeded, 0 if none did, NaN if the first was masked."""
    from trainers.team.metrics import success

    solved, last = list(first), dict(enumerate(episodes))
    for _ in range(retries):
        pending = [k for k, value in enumerate(solved) if value == 0.0]
        if not pending:
            break
        jobs = [EpisodeJob(last[k].job.task, last[k].job.seed, prefix=f"retry: {failure_reason(last[k])}\n")
                for k in pending]
        for k, episode in zip(pending, player.play(jobs).episodes):
            last[k] = episode
            solved[k] = 1.0 if success(episode, player.scenario.spec.mode) == 1.0 else 0.0
    return solved


# -- paraphrases --------------------------------------------------------------------------------


def _paraphrase_agreement(player, episodes, first: list[float]) -> dict:
    """Replay every variant wording; a task counts when some wording changed what an agent saw.

    The replay carries the original episode as its reference, so an agent whose observation did not
    change repeats its recorded message (a seeded `random` policy cannot fake a difference).
    """
    from trainers.team.metrics import success

    jobs, owners = [], []
    for k, episode in enumerate(episodes):
        task = episode.job.task
        for index in range(len(task.variants)):
            jobs.append(EpisodeJob(task.variant(index), episode.job.seed, reference=episode.reference()))
            owners.append(k)
    played = player.play(jobs).episodes if jobs else []
    outcomes: dict[int, list[float]] = {}
    for k, variant in zip(owners, played):
        if _observations(variant) != _observations(episodes[k]):
            outcomes.setdefault(k, []).append(success(variant, player.scenario.spec.mode))
    agree = [None] * len(episodes)
    for k, results in outcomes.items():
        values = [first[k], *results]
        if not any(math.isnan(v) for v in values):
            agree[k] = len(set(values)) == 1
    decided = [a for a in agree if a is not None]
    return {"robustness": statistics.fmean(decided) if decided else None,
            "tasks_with_variants": sum(bool(e.job.task.variants) for e in episodes),
            "tasks_reached": len(outcomes), "wordings_played": len(jobs),
            "variant_success": _share([s for results in outcomes.values() for s in results]), "agree": agree}


def _observations(episode) -> list[tuple[str, str]]:
    return [(turn.agent, turn.observation) for turn in episode.turns]


# -- credit and effective reasoning -------------------------------------------------------------


def _credit_summary(player, episodes, first: list[float]) -> dict:
    """Mean credit and share per agent, and the effective reasoning rate, from greedy credit replays."""
    from marl.credit.replay import credit_figures, episode_credits

    spec, agents = player.scenario.spec, player.scenario.agent_names
    estimates = episode_credits(player, episodes, spec.credit)
    figures = credit_figures(estimates, agents)
    per_agent = {agent: {"value": _finite(figures.get(f"credit/{agent}/value")),
                         "share": _finite(figures.get(f"credit/{agent}/share"))} for agent in agents}
    successful = [episode for episode, estimate, ok in zip(episodes, estimates, first)
                  if ok == 1.0 and estimate is not None]
    silenced = episode_credits(player, successful, CreditSpec(method="difference", absent="null_message"))
    effective = [all(estimate.values[agent] > CREDIT_EPS for agent in agents)
                 for estimate in silenced if estimate is not None]
    return {"method": spec.credit.method, "absent": spec.credit.absent, "agents": per_agent,
            "episodes": sum(e is not None for e in estimates), "successful_episodes": len(successful),
            "effective_reasoning_rate": statistics.fmean(effective) if effective else None}


# -- per-episode figures ------------------------------------------------------------------------


def _tool_call_validity(episodes) -> float | None:
    values = [v for e in episodes for v in e.tool_validity.values() if v is not None]
    return statistics.fmean(values) if values else None


def _format_compliance(episodes) -> float | None:
    scores = [b.layers.get("format") for e in episodes for b in e.breakdown.values()]
    kept = [s for s in scores if s is not None and not math.isnan(s)]
    return statistics.fmean(kept) if kept else None


def _share(values) -> float | None:
    kept = [v for v in values if not math.isnan(v)]
    return statistics.fmean(kept) if kept else None


def _plain(value: float) -> float | None:
    return None if math.isnan(value) else value


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


# -- reports ------------------------------------------------------------------------------------


def write_eval_report(result: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """Write `result` as out_dir/eval.json and a markdown summary out_dir/eval.md; return both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "eval.json", out / "eval.md"

    write_text_atomically(json_path, json.dumps(result, indent=2) + "\n")
    write_text_atomically(md_path, eval_markdown(result))
    return json_path, md_path


def definition(metric: str) -> str:
    """What an evaluation metric means, for the report's table (vs/ and game/ figures by their pattern)."""
    if metric.startswith("vs/"):
        parts = metric.split("/")
        seat = f" in seat {parts[2]}" if len(parts) == 4 else " over the seats"
        meaning = {"reward": "mean zero-sum reward", "not_lost": "share of games not lost",
                   "won": "share of games won"}.get(parts[-1], parts[-1])
        return f"{meaning}{seat} against the scenario's opponent {parts[1]} (greedy)"
    if metric.startswith("game/"):
        return "the scenario's evaluation function's figure of the learned policy"
    return DEFINITIONS[metric]


def eval_markdown(result: dict) -> str:
    """The evaluation as markdown: a metric table, paraphrase coverage, per-agent credit, failures."""
    lines = [f"# marl eval: {result['scenario']}", "",
             f"{result['tasks']} held-out tasks at temperature 0 ({result['mode']}), "
             f"checkpoint: {result.get('checkpoint', '-')}{seating_note(result)}{served_note(result)}, retries: {result['retries']}, "
             f"masked episodes: {result['masked_episodes']}.", "",
             "| metric | value | definition |", "|---|---|---|"]
    lines += [f"| {name} | {format_value(value)} | {definition(name)} |" for name, value in result["metrics"].items()]
    para = result["paraphrase"]
    lines += ["", f"Paraphrases: {para['tasks_with_variants']} tasks have variant wordings; in "
              f"{para['tasks_reached']} of them a wording changed what an agent saw "
              f"({para['wordings_played']} wordings played, variant success {format_value(para['variant_success'])})."]
    if result["credit"]:
        credit = result["credit"]
        lines += ["", f"## Credit ({credit['method']}, absent: {credit['absent']}, {credit['episodes']} episodes)", "",
                  "| agent | mean credit | share |", "|---|---|---|"]
        lines += [f"| {agent} | {format_value(c['value'])} | {format_value(c['share'])} |"
                  for agent, c in credit["agents"].items()]
    failed = [row["task"] for row in result["per_task"] if row["solved"] == 0.0]
    if failed:
        more = " ..." if len(failed) > 20 else ""
        lines += ["", f"Unsolved tasks ({len(failed)}): " + ", ".join(failed[:20]) + more]
    return "\n".join(lines) + "\n"


def seating_note(result: dict) -> str:
    """', seats: final played by left's policy' for an evaluation with --seat, else ''."""
    played_by = result.get("played_by") or {}
    return (", seats: " + ", ".join(f"{agent} played by {other}'s policy" for agent, other in played_by.items())
            if played_by else "")


def served_note(result: dict) -> str:
    """', served: the mixture of 3 iterates (steps 0..2)' for a checkpoint that serves the average of its
    iterates, else '' (the checkpoint's own weights)."""
    served = result.get("served", "last iterate")
    return f", served: the {served}" if served != "last iterate" else ""


def format_value(value) -> str:
    """A metric value for tables: three decimals, or '-' when it does not apply."""
    return "-" if value is None else f"{value:.3f}"


def credit_example(player, tasks: list[Task], *, seed: int = 0) -> str:
    """A report section: the first held-out task played at temperature 0 and its credit split told
    in words (marl.credit.explain); '' when the scenario splits no credit (not cooperative)."""
    from marl.credit.explain import explain_credit

    spec = player.scenario.spec
    if spec.mode != "cooperative" or not tasks:
        return ""
    greedy = GreedyPlayer(player)
    episode = greedy.play([EpisodeJob(tasks[0], seed)]).episodes[0]
    lines = explain_credit(greedy, episode, spec.credit)
    return "\n".join(["## Credit: one held-out episode, after training", "", *lines]) + "\n"


def credit_titles(credit) -> dict[str, str]:
    """The report's plot titles that say what per-agent rewards and credit are measured against."""
    from marl.credit.explain import stand_in_words

    if credit.method == "team":
        return {}
    against = f"{credit.method} credit against {stand_in_words(credit)}"
    return {"reward.png": f"Reward and team success (per-agent: {against})",
            "credit.png": f"Credit per agent: value and share ({against})"}
