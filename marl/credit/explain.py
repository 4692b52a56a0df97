"""One episode's credit split, told in words: what each agent's credit is measured against, what the
team would have scored without it, and what the method made of that (a run report's credit section).

`explain_credit(player, episode, credit)` replays the episode with each agent absent (the scenario's
`credit.absent`, the same replays training uses) and, for the methods that use more coalitions
(Shapley, Banzhaf, ...), with every coalition the method needs, then writes markdown lines. The
numbers are the ones the trainer's credit would give this episode; nothing is re-estimated here.
"""

from __future__ import annotations

from marl.credit.coalitions import coalitions_needed, estimate_credit
from marl.credit.exact import NonFiniteValue, coalition_name
from marl.credit.replay import EpisodeReplays, fill_values, shared_memos

STAND_INS = {  # credit.absent -> what plays an absent agent's part, in words
    "null_message": "an empty message in its place",
    "skip_turn": "its turns skipped",
    "default_policy": "the stand-in policy `{policy}` in its place",
    "resample": "a fresh sample of its own policy in its place",
    "replay": "an empty message in its place, the later turns played again",
    "mask": "its messages blanked from the transcript, which is scored again",
}
METHODS = {  # credit.method -> how it turns coalition values into credit, in words
    "difference": "each agent's credit is what the team lost without it: v(everyone) - v(everyone without it)",
    "shapley": "Shapley averages what each agent adds to the team over every order in which the team could "
               "have been formed, from the values of all the coalitions below",
    "banzhaf": "Banzhaf averages what each agent adds to every coalition of the others, from the values below",
    "myerson": "Myerson is Shapley over the coalitions the visibility graph connects",
    "owen": "Owen is Shapley within and across the a priori unions (credit.unions)",
    "least_core": "the least core splits v(everyone) so that no coalition gets less than its own value "
                  "minus the smallest possible epsilon",
}
MAX_TABLE_ROWS = 16  # coalition values listed at most (all of them up to 4 agents)


def stand_in_words(credit) -> str:
    """What plays an absent agent's part under `credit.absent`, in words."""
    return STAND_INS[credit.absent].format(policy=credit.default_policy)


def explain_credit(player, episode, credit) -> list[str]:
    """Markdown lines explaining how `credit` splits `episode`'s team reward among its agents."""
    players = tuple(player.scenario.agent_names)
    everyone = frozenset(players)
    total = episode.team_reward()
    task = getattr(episode.job.task, "id", "?")
    if credit.method == "team":
        return [f"Task `{task}`: the team scored {total:.2f}, and every agent's reward is that team reward "
                "(credit.method: team): no agent's part is measured."]
    leave_one_out = [everyone - {agent} for agent in players]
    needed = list(dict.fromkeys([*coalitions_needed(credit, players, player.visibility), *leave_one_out]))
    replay = EpisodeReplays(episode, {everyone: total}, shared_memos([episode], credit.rollouts, "episode")[0])
    fill_values(player, [replay], [c for c in needed if c != everyone], credit)
    if replay.masked():
        return [f"Task `{task}`: a judge failed in this episode or one of its replays, so its credit is "
                "masked (never a 0) and there is nothing to explain."]
    lines = [f"Task `{task}`: the team scored {total:.2f}. Each agent's credit is measured against "
             f"{stand_in_words(credit)} (credit.absent: {credit.absent}), not against zero: a negative "
             "credit means the team did better with that stand-in than with the agent.", ""]
    for agent in players:
        without = replay.values[everyone - {agent}]
        lines.append(f"- Without `{agent}` the team would have scored {without:.2f}, so `{agent}` added "
                     f"{total - without:+.2f}.")
    lines += ["", *_method_lines(player, credit, replay, players)]
    return lines


def _method_lines(player, credit, replay: EpisodeReplays, players: tuple) -> list[str]:
    """What the method made of the coalition values: a table of them (when it used more than the
    leave-one-out ones) and each agent's credit."""
    def value(coalition):  # sampled estimators ask for coalitions as they go, as in training
        coalition = frozenset(coalition)
        if coalition not in replay.values:
            fill_values(player, [replay], [coalition], credit)
        return replay.values[coalition]

    try:
        estimate = estimate_credit(credit, value, players, player.visibility)
    except NonFiniteValue:  # a sampled coalition's replay failed its judge: masked, never a 0
        return ["A replay the method sampled failed its judge, so this episode's credit is masked."]
    lines = [f"{METHODS.get(credit.method, credit.method)}."]
    if credit.method != "difference":
        rows = sorted(replay.values.items(), key=lambda item: (len(item[0]), coalition_name(item[0])))
        lines += ["", "| coalition playing (the others absent) | team score |", "|---|---|"]
        lines += [f"| {coalition_name(c)} | {v:.2f} |" for c, v in rows[:MAX_TABLE_ROWS]]
        if len(rows) > MAX_TABLE_ROWS:
            lines.append(f"| ... {len(rows) - MAX_TABLE_ROWS} more | |")
        lines.append("")
    credits = ", ".join(f"`{agent}` {estimate.values[agent]:+.2f}" for agent in players)
    lines.append(f"Credit ({estimate.method}): {credits}.")
    return lines
