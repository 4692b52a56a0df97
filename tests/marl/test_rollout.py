"""The lockstep player's counterfactual replays: recorded messages reused while unchanged, and fresh
samples shared across the coalitions of one episode (common random numbers)."""

from __future__ import annotations

import itertools
import zlib

from marl.policies import get_policy, null_policy, random_policy
from marl.scenario.load import load_scenario
from trainers.policy.actors import ScriptedActor
from marl.rollout import EpisodeJob, EpisodePlayer


def _relay_player():
    scenario = load_scenario("relay", ["credit.absent=default_policy", "credit.default_policy=relay_lib:expert"])
    expert = get_policy("expert", scenario)
    actors = {"left": ScriptedActor("left", null_policy), "right": ScriptedActor("right", expert),
              "final": ScriptedActor("final", random_policy(seed=3, max_chars=4))}
    return scenario, EpisodePlayer(scenario, actors, {a: a for a in actors})


def _replays(player, episode, memo):
    coalitions = [frozenset({"final"}), frozenset({"right", "final"})]
    jobs = [EpisodeJob(episode.job.task, 100 + i, coalition=c, absent_mode="default_policy",
                       reference=episode.reference(), memo=memo) for i, c in enumerate(coalitions)]
    return [{t.agent: t for t in e.turns} for e in player.play(jobs).episodes]


def test_replays_of_one_episode_share_their_fresh_samples():
    scenario, player = _relay_player()
    [episode] = player.play([EpisodeJob(scenario.tasks()[0], 0)]).episodes
    first, second = _replays(player, episode, memo={})
    # left is absent in both, so the expert speaks for it; right's real message equals the expert's:
    # final sees the same new observation in both coalitions and must say the same thing
    assert first["final"].observation == second["final"].observation != episode.turns[-1].observation
    assert first["final"].text == second["final"].text
    assert first["right"].text == episode.reference()[(0, "right")].text  # unchanged input: recorded message


def test_without_a_shared_memo_the_replays_draw_independently():
    scenario, player = _relay_player()
    [episode] = player.play([EpisodeJob(scenario.tasks()[0], 0)]).episodes
    draws = [_replays(player, episode, memo=None) for _ in range(5)]
    assert any(first["final"].text != second["final"].text for first, second in draws)


def test_coalitions_a_sampled_estimator_asks_for_later_share_the_episodes_samples():
    """Permutation sampling asks for coalitions one at a time; their replays still share fresh samples,
    so a silent agent, whose absence changes nothing, gets exactly zero credit."""
    from marl.scenario.spec import CreditSpec
    from marl.credit.replay import episode_credits

    scenario = load_scenario("relay")
    actors = {"left": ScriptedActor("left", get_policy("expert", scenario)),
              "right": ScriptedActor("right", null_policy),
              "final": ScriptedActor("final", random_policy(seed=5, max_chars=3))}
    player = EpisodePlayer(scenario, actors, {a: a for a in actors})
    episodes = player.play([EpisodeJob(task, i) for i, task in enumerate(scenario.tasks()[:6])]).episodes
    credit = CreditSpec(method="shapley", estimator="permutation", budget=6, absent="null_message")
    estimates = episode_credits(player, episodes, credit)
    assert all(estimate.values["right"] == 0.0 for estimate in estimates)


class _CountingActor(ScriptedActor):
    """A scripted actor that records the observations it was asked to answer."""

    def __init__(self, name, policy):
        super().__init__(name, policy)
        self.asked = []

    def act(self, requests, **kwargs):
        self.asked.extend(observation for _, observation, _ in requests)
        return super().act(requests, **kwargs)


def _credits_of_one_task(shared_by: str):
    """Shapley credit (expert stand-in) of 4 episodes of one relay task, and what final was asked in replays."""
    from marl.credit.replay import episode_credits
    from marl.scenario.spec import CreditSpec

    scenario = load_scenario("relay")
    expert = get_policy("expert", scenario)
    final = _CountingActor("final", random_policy(seed=7, max_chars=3))
    actors = {"left": ScriptedActor("left", random_policy(seed=1, max_chars=2)),
              "right": ScriptedActor("right", expert), "final": final}
    player = EpisodePlayer(scenario, actors, {a: a for a in actors}, default_policy=expert)
    task = scenario.tasks()[0]
    episodes = player.play([EpisodeJob(task, seed) for seed in range(4)]).episodes
    final.asked.clear()
    credit = CreditSpec(method="shapley", absent="default_policy", samples_shared_by=shared_by)
    return episodes, episode_credits(player, episodes, credit), final.asked


def test_replays_of_one_tasks_episodes_sample_each_counterfactual_view_once():
    """With samples shared by task (the default), the G episodes of a task see the same counterfactual
    (the expert's sums, say) answered by one sample: final is asked each distinct view once, and the
    episodes' coalitions without left and right have one value. Shared by episode, every episode
    samples it again."""
    episodes, credits, asked = _credits_of_one_task("task")
    _, _, asked_alone = _credits_of_one_task("episode")
    assert len(asked) == len(set(asked)) < len(asked_alone)
    expert_view = [o for o in asked if all(o != e.turns[-1].observation for e in episodes)]
    assert expert_view and asked_alone.count(expert_view[0]) > 1  # the view every episode's replays reach
    assert all(estimate is not None for estimate in credits)
    for episode, estimate in zip(episodes, credits):  # efficiency: the credits add up to v(N) - v(empty) = r - 1
        assert abs(sum(estimate.values.values()) - (episode.team_reward() - 1.0)) < 1e-9


def _group_credits(shared_by: str, method: str):
    """Credit (expert stand-in) of 8 episodes of one relay task whose left and right vary from episode to
    episode, with a final that answers by what it sees only; and the views final was asked in replays."""
    from marl.credit.replay import episode_credits
    from marl.scenario.spec import CreditSpec

    scenario = load_scenario("relay")
    expert = get_policy("expert", scenario)

    def sloppy(agent, observation, task):  # the expert's sum, or one off, decided by what it sees
        answer = expert(agent, observation, task)
        wrong = zlib.crc32(observation.encode()) % 3 == 0 and answer.isdigit()
        return str(int(answer) + 1) if wrong else answer

    def now_and_then(every):  # the expert's sum on every `every`-th call, else a wrong digit
        calls = itertools.count()
        return lambda agent, observation, task: (expert(agent, observation, task) if next(calls) % every == 0
                                                 else str(next(calls) % 10))

    final = _CountingActor("final", sloppy)
    actors = {"left": ScriptedActor("left", now_and_then(2)), "right": ScriptedActor("right", now_and_then(3)),
              "final": final}
    player = EpisodePlayer(scenario, actors, {a: a for a in actors}, default_policy=expert)
    task = scenario.tasks()[0]
    episodes = player.play([EpisodeJob(task, seed) for seed in range(8)]).episodes
    final.asked.clear()
    credit = CreditSpec(method=method, absent="default_policy", samples_shared_by=shared_by)
    return episodes, episode_credits(player, episodes, credit), final.asked


def test_replays_sharing_by_group_reuse_the_groups_own_messages_and_change_no_credit():
    """samples_shared_by group: a replay in which final sees what one of the group's episodes showed
    final repeats that episode's message instead of asking the model. With a final that answers by what
    it sees, every credit is the same as with sharing by task, and final is asked only views that no
    episode of the group showed it, each once."""
    for method in ("shapley", "difference"):
        episodes, by_task, asked_by_task = _group_credits("task", method)
        _, by_group, asked_by_group = _group_credits("group", method)
        seen = {turn.observation for episode in episodes for turn in episode.turns if turn.agent == "final"}
        assert len(asked_by_group) == len(set(asked_by_group)) and not seen & set(asked_by_group)
        assert set(asked_by_group) < set(asked_by_task)  # some replays were answered from the group
        assert [e.values for e in by_group] == [e.values for e in by_task]


def test_leave_one_out_replay_credit_is_v_everyone_minus_v_without_the_agent_from_the_exact_engine():
    """credit.method difference plays n replays per episode and gives each agent v(N) - v(N minus it),
    the same coalition values the exact Shapley engine replays for those coalitions (common random
    numbers: a replay's samples depend only on who sees what), with random, hence noisy, agents."""
    from marl.credit.coalitions import coalitions_needed
    from marl.credit.replay import EpisodeReplays, episode_credits, fill_values, shared_memos
    from marl.scenario.spec import CreditSpec

    scenario = load_scenario("relay")
    expert = get_policy("expert", scenario)
    def sloppy(salt):  # the expert's answer, or one off, decided by what it sees: replayable anywhere
        def policy(agent, observation, task):
            answer = expert(agent, observation, task)
            wrong = zlib.crc32(f"{salt}|{observation}".encode()) % 3 == 0 and answer.isdigit()
            return str(int(answer) + 1) if wrong else answer
        return policy

    actors = {"left": ScriptedActor("left", sloppy(1)), "right": ScriptedActor("right", expert),
              "final": ScriptedActor("final", sloppy(7))}
    player = EpisodePlayer(scenario, actors, {a: a for a in actors}, default_policy=expert)
    episodes = player.play([EpisodeJob(task, i) for i, task in enumerate(scenario.tasks()[:12])]).episodes
    difference = episode_credits(player, episodes, CreditSpec(method="difference", absent="default_policy"))
    shapley = CreditSpec(method="shapley", estimator="exact", absent="default_policy")
    everyone = frozenset(actors)
    every_coalition = [c for c in coalitions_needed(shapley, tuple(actors), player.visibility) if c != everyone]
    assert len(every_coalition) == 7  # the exact engine's 2^3 - 1 others, the empty one included
    for episode, estimate in zip(episodes, difference):
        replay = EpisodeReplays(episode, {everyone: episode.team_reward()}, shared_memos([episode], 1, "task")[0])
        fill_values(player, [replay], every_coalition, shapley)
        for agent in actors:
            assert estimate.values[agent] == replay.values[everyone] - replay.values[everyone - {agent}]
    assert min(e.values["final"] for e in difference) < 0.0 == max(e.values["final"] for e in difference)  # it costs


def test_episodes_of_one_task_played_by_different_actors_do_not_share_samples():
    """A self-play pool seats other actors in some of a task's episodes: the same agent seeing the same
    thing is then another policy, so its replays keep their own memos (shared only with their seating)."""
    from marl.credit.replay import shared_memos

    scenario, player = _relay_player()
    task = scenario.tasks()[0]
    jobs = [EpisodeJob(task, 0), EpisodeJob(task, 1), EpisodeJob(task, 2, seats={"final": "right"})]
    episodes = player.play(jobs).episodes
    for shared_by in ("task", "group"):
        memos = shared_memos(episodes, 1, shared_by)
        assert memos[0] is memos[1] and memos[2] is not memos[0]
