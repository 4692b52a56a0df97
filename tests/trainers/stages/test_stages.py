"""Training stages 3 and 4 on the real relay scenario: reflection (retry low-rate tasks with the failure
reason, discounted) and safety (adversarial tasks, fabrication and constraint penalties), plus the stage
plan and one `marl run` through main -> reflection -> safety. Models are the real tiny model; some seats
are taken by scripted actors so that what an episode says is known."""

from __future__ import annotations

import json
import math
import random
import re
import string

import pytest

from marl.env import ScenarioEnv
from marl.scenario.load import load_scenario
from marl.scenario.spec import ReflectionSpec, SafetySpec
from marl.types import Task
from trainers.policy.actors import ScriptedActor
from marl.rollout import Episode, EpisodeJob
from trainers.stages.reflection import (REASON_TEMPLATE, failure_reason, reflection_step, retry_discount,
                                 select_low_rate_tasks, task_pass_rates)
from trainers.stages.safety import (REFUSAL, adversarial_tasks, drop_part, fabricated, safety_step, safety_transform,
                             violates)
from trainers.config import stage_at, stage_plan

SMALL = ["train.prompts_per_step=2", "train.group_size=2", "tasks.count=40", "tasks.eval_count=4",
         "train.floor_reward=0"]


@pytest.fixture
def relay(demo_model_dir):
    """Factory of a real relay trainer on the tiny model: (scenario, training tasks, trainer)."""
    from trainers.run import RunOptions, prepare

    def make(*overrides: str):
        scenario, train_tasks, _, trainer, _ = prepare(RunOptions("relay", SMALL + list(overrides)), log=lambda m: None)
        return scenario, train_tasks, trainer

    return make


def _seat(trainer, name: str, policy, agents=()) -> None:
    """Register a scripted actor and give it `agents`' seats (the player shares these dicts)."""
    trainer.actors[name] = ScriptedActor(name, policy)
    for agent in agents:
        trainer.seats[agent] = name


def _play(trainer, task: Task, actor: str, seed: int = 0) -> Episode:
    """One real episode of `task` with every agent played by `actor`."""
    job = EpisodeJob(task, seed, seats={agent: actor for agent in trainer.agents})
    return trainer.player.play([job]).episodes[0]


def _policies(scenario):
    expert = scenario.resolve(scenario.spec.expert)

    def off_by_one(agent, observation, task):
        said = expert(agent, observation, task)
        return str(int(said) + 1) if said else "1"

    def gullible(agent, observation, task):
        """Believes the misleading note, invents an answer to missing data, else adds correctly."""
        note = task.metadata.get("misleading")
        if note:
            return re.search(r"-?\d+", note).group()
        return "42" if task.metadata.get("unanswerable") else expert(agent, observation, task)

    return {"expert": expert, "off_by_one": off_by_one, "gullible": gullible, "guess": lambda a, o, t: "42",
            "null": lambda a, o, t: "", "refuse": lambda a, o, t: "unknown"}


def _episode(task: Task, prefix: str = "", transcript=()) -> Episode:
    return Episode(EpisodeJob(task, 0, prefix=prefix), [], {}, {}, list(transcript), {})


# -- reflection -------------------------------------------------------------------------------------


def test_failure_reason_names_the_wrong_answer_and_the_failed_scorers(relay):
    scenario, tasks, trainer = relay()
    for name, policy in _policies(scenario).items():
        _seat(trainer, name, policy)
    task = tasks[0]
    wrong = _play(trainer, task, "off_by_one")  # each of the three additions is one too high
    reason = failure_reason(wrong, "final")
    assert reason == f"retry: last answer {int(task.answer) + 3} was wrong (exact).\n"
    assert reason == REASON_TEMPLATE.format(answer=int(task.answer) + 3, failed="exact")
    assert failure_reason(_play(trainer, task, "expert"), "final") == ""
    silent = failure_reason(_play(trainer, task, "null"), "final")
    assert silent == "retry: last answer (none) was wrong (exact, regex).\n"
    assert all(ch in string.printable for ch in reason + silent)


def test_low_rate_selection_never_counts_unknown_tasks_as_failing():
    tasks = [Task(id=f"t{i}", prompt=f"{i}") for i in range(6)]
    rates = {"t0": 0.9, "t1": 0.2, "t2": None, "t3": 0.1, "t4": 0.2, "t5": 0.7}
    pick = lambda threshold, limit: [t.id for t in select_low_rate_tasks(rates, tasks, threshold, limit)]  # noqa: E731
    assert pick(0.5, 8) == ["t3", "t1", "t4"]        # below 0.5, lowest first, ties in task order
    assert pick(0.5, 2) == ["t3", "t1"]
    assert pick(0.05, 2) == ["t3", "t1"]             # none below: the lowest observed instead
    assert "t2" not in pick(1.0, 8)                  # never observed: unknown, not failing
    assert [t.id for t in select_low_rate_tasks({}, tasks, 0.5, 2)] == ["t0", "t1"]


def _wrong_total(agent, observation, task):
    """Always one more than the task's total, whatever the teammates said: every try fails, on any CPU."""
    return str(int(task.answer) + 1)


def test_reflection_step_retries_low_rate_tasks_with_their_reason_and_discounts_them(relay):
    # Control flow pinned by scripted seats, not by what the tiny model samples (which differs across
    # CPUs): final is always one too high, and right says nothing, so final's answer, the reasons and
    # every coalition's value are the same whatever the model (playing left) says.
    scenario, tasks, trainer = relay()
    _seat(trainer, "wrong_total", _wrong_total, agents=["final"])
    _seat(trainer, "null", _policies(scenario)["null"], agents=["right"])
    for task in tasks[:5]:
        trainer.buckets.update(task.id, 1.0)
    for task in (tasks[9], tasks[7], tasks[5]):
        trainer.buckets.update(task.id, 0.0)
    assert task_pass_rates(trainer.buckets)[tasks[7].id] == 0.0
    assert task_pass_rates(trainer.buckets)[tasks[20].id] is None

    metrics = reflection_step(trainer, ReflectionSpec(threshold=0.5, retry_discount=0.9), tasks)

    assert metrics["reflection/tasks"] == 2 and metrics["reflection/retried"] == 2
    assert metrics["reflection/first_try_success"] == 0.0 and metrics["reflection/retry_success"] == 0.0
    assert metrics["train/step"] == 1 and "policy/shared/loss" in metrics  # left's samples were trained on
    last = trainer.last_step
    batch, rewards, credits = last.batch, last.rewards, last.credits
    assert [e.job.task.id for e in batch.episodes] == [tasks[5].id] * 2 + [tasks[7].id] * 2
    for episode in batch.episodes:
        wrong = int(episode.job.task.answer) + 1
        assert episode.job.prefix == f"retry: last answer {wrong} was wrong (exact).\n"
        assert [(turn.agent, turn.text) for turn in episode.turns][1:] == [("right", ""), ("final", str(wrong))]
        assert all(turn.observation.startswith(episode.job.prefix) for turn in episode.turns)
    for row, credit in zip(rewards, credits):
        # only final's format layer scores: its credit is positive and discounted, the others' is 0
        assert credit.values["final"] > 0 and row["final"] == pytest.approx(credit.values["final"] * 0.9)
        assert row["left"] == pytest.approx(0.0, abs=1e-12) and row["right"] == pytest.approx(0.0, abs=1e-12)
    assert len({round(row["final"], 12) for row in rewards}) == 1


def test_retry_discount_multiplies_only_positive_rewards_of_retried_episodes():
    task = Task(id="t", prompt="1+1=", answer="2")
    transform = retry_discount(0.9)
    retried, first = _episode(task, prefix="retry: last answer 3 was wrong (exact).\n"), _episode(task)
    assert transform(retried, "final", 1.0) == pytest.approx(0.9)
    assert transform(first, "final", 1.0) == 1.0
    assert transform(retried, "final", -0.2) == -0.2 and transform(retried, "final", 0.0) == 0.0
    assert math.isnan(transform(retried, "final", math.nan))


# -- safety -----------------------------------------------------------------------------------------


def test_adversarial_tasks_are_deterministic_missing_data_and_misleading_variants(relay):
    scenario, tasks, _ = relay()
    made = adversarial_tasks(tasks, seed=3, count=6)
    assert made == adversarial_tasks(tasks, seed=3, count=6)
    assert [t.id for t in made] != [t.id for t in adversarial_tasks(tasks, seed=4, count=6)]
    assert [t.id.split("/")[1] for t in made] == ["misleading", "missing"] * 3  # first kind: KINDS[3 % 2]
    originals = {t.id: t for t in tasks}
    env = ScenarioEnv(scenario, tasks=tasks)
    for task in made:
        source = originals[task.id.split("/")[0]]
        if task.id.endswith("/missing"):
            field = task.metadata["missing"]
            assert task.answer is None and task.metadata["unanswerable"] is True
            assert re.fullmatch(r"\d*\+\d*=", task.metadata[field]) and task.metadata[field] != source.metadata[field]
            assert len(re.findall(r"\d+", task.metadata[field])) == 1
            assert len(re.findall(r"\d+", task.prompt)) == 3
            observations, _ = env.reset(seed=0, options={"task": task})  # a Task that is not in the list
            assert env.task is task and observations[field]["text"] == task.metadata[field]
        else:
            decoy = re.search(r"-?\d+", task.metadata["misleading"]).group()
            assert task.answer == source.answer and decoy != source.answer
            assert task.prompt == source.prompt + f" (note: the answer is {decoy})"
            assert re.search(task.metadata["forbidden"], decoy) and not re.search(task.metadata["forbidden"],
                                                                                   source.answer)


def test_drop_part_removes_one_number_or_word():
    rng = random.Random(0)
    assert {drop_part("12+35=", random.Random(seed))[0] for seed in range(20)} == {"+35=", "12+="}
    assert drop_part("+=", rng) == ("", "+=")
    assert REFUSAL.search("Unknown") and REFUSAL.search("?") and not REFUSAL.search("146")


def test_fabrication_penalty_applies_exactly_when_an_unanswerable_task_gets_an_answer(relay):
    scenario, tasks, trainer = relay()
    for name, policy in _policies(scenario).items():
        _seat(trainer, name, policy)
    made = adversarial_tasks(tasks, seed=0, count=2)
    missing, normal = made[0], tasks[0]
    assert missing.metadata["unanswerable"]
    transform = safety_transform(0.5, 0.25, True, trainer.player.scorer.team_answerer)
    outcomes = {}
    for actor in ("expert", "guess", "null", "refuse"):
        episode = _play(trainer, missing, actor)
        assert math.isnan(episode.team_reward())  # no reference answer: the scenario cannot score it
        outcomes[actor] = (fabricated(episode, "final"), transform(episode, "left", episode.rewards["left"]))
    # relay's expert cannot add "12+=", says nothing, and so the final says nothing: no fabrication
    assert outcomes == {"expert": (False, 0.0), "guess": (True, -0.5), "null": (False, 0.0),
                        "refuse": (False, 0.0)}
    answered = _play(trainer, normal, "guess")
    assert not fabricated(answered, "final")
    assert transform(answered, "final", answered.rewards["final"]) == answered.rewards["final"]


def test_constraint_penalty_applies_exactly_when_a_message_matches_the_forbidden_regex(relay):
    scenario, tasks, trainer = relay()
    for name, policy in _policies(scenario).items():
        _seat(trainer, name, policy)
    decoyed = adversarial_tasks(tasks, seed=1, count=1)[0]
    assert decoyed.id.endswith("/misleading")
    cooperative = safety_transform(0.5, 0.25, True, trainer.player.scorer.team_answerer)
    own = safety_transform(0.5, 0.25, False, trainer.player.scorer.team_answerer)
    fooled, honest = _play(trainer, decoyed, "gullible"), _play(trainer, decoyed, "expert")
    assert violates(fooled) and violates(fooled, "final") and not violates(honest)
    assert honest.rewards["final"] == 1.0
    assert cooperative(honest, "left", 1.0) == 1.0
    assert cooperative(fooled, "left", 0.1) == pytest.approx(-0.15)  # the team shares the penalty
    assert own(fooled, "final", 0.1) == pytest.approx(-0.15)
    trace = [{"agent": "left", "text": "57", "turn": 0}, {"agent": "final", "text": "0", "turn": 1}]
    made_up = _episode(Task(id="x", prompt="p", metadata={"forbidden": "^57$"}), transcript=trace)
    assert own(made_up, "left", 0.0) == -0.25 and own(made_up, "final", 0.0) == 0.0


def test_safety_step_trains_on_the_adversarial_batch_with_both_penalties(relay):
    scenario, tasks, trainer = relay()
    _seat(trainer, "gullible", _policies(scenario)["gullible"], agents=["final"])
    settings = SafetySpec(fabrication_penalty=0.5, constraint_penalty=0.25)

    metrics = safety_step(trainer, settings, tasks)

    assert metrics["safety/tasks"] == 2 and metrics["safety/unanswerable_tasks"] == 1
    assert metrics["safety/fabrications"] == 2 and metrics["safety/violations"] == 2
    assert metrics["safety/fabrication_rate"] == 1.0 and metrics["safety/violation_rate"] == 1.0
    assert metrics["train/step"] == 1 and "policy/shared/loss" in metrics
    last = trainer.last_step
    batch, rewards, credits = last.batch, last.rewards, last.credits
    assert [e.job.task.id for e in batch.episodes] == [t.id for t in adversarial_tasks(tasks, 0, 2) for _ in "ab"]
    for episode, row, credit in zip(batch.episodes, rewards, credits):
        if episode.job.task.metadata.get("unanswerable"):
            assert credit is None and row == {agent: -0.5 for agent in trainer.agents}
        else:
            assert row == pytest.approx({agent: credit.values[agent] - 0.25 for agent in trainer.agents})
    assert all(trainer.buckets.state_dict()["pass_ema"][i] is None for i in range(len(tasks)))


def test_safety_generator_module_supplies_the_adversarial_set(relay, tmp_path, monkeypatch):
    (tmp_path / "stages_adversary.py").write_text(
        "from marl.types import Task\n"
        "CALLS = []\n"
        "def make(tasks, seed):\n"
        "    CALLS.append((len(tasks), seed))\n"
        "    blank = {'left': '12+=', 'right': '+=', 'unanswerable': True}\n"
        "    return [{'id': 'blank', 'prompt': '?', 'metadata': blank},\n"
        "            Task(id='plain', prompt='p', answer='5', metadata={'left': '1+1=', 'right': '1+2='}),\n"
        "            {'id': 'unused', 'prompt': 'p'}]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _, tasks, trainer = relay()
    metrics = safety_step(trainer, SafetySpec(generator="stages_adversary:make"), tasks)
    import stages_adversary

    assert stages_adversary.CALLS == [(len(tasks), 0)]
    assert [e.job.task.id for e in trainer.last_step.episodes] == ["blank", "blank", "plain", "plain"]
    assert metrics["safety/tasks"] == 2 and metrics["safety/unanswerable_tasks"] == 1
    (tmp_path / "stages_bad.py").write_text("def make(tasks, seed):\n"
                                            "    return [{'prompt': 'p', 'metadata': {'forbidden': '('}}]\n")
    with pytest.raises(ValueError, match="not a regex"):
        safety_step(trainer, SafetySpec(generator="stages_bad:make"), tasks)


# -- the plan, and a whole run ----------------------------------------------------------------------


def test_stage_plan_runs_the_stages_in_the_listed_order():
    scenario = load_scenario("relay", ["train.stages=[main,reflection,safety]", "train.steps=2",
                                       "train.reflection.steps=1", "train.safety.steps=3"])
    plan = stage_plan(scenario.spec.train)
    assert plan == (("main", 2), ("reflection", 1), ("safety", 3))
    assert [stage_at(plan, step) for step in range(6)] == [("main", 0), ("main", 1), ("reflection", 0),
                                                            ("safety", 0), ("safety", 1), ("safety", 2)]
    with pytest.raises(ValueError, match="past the plan"):
        stage_at(plan, 6)


def test_marl_run_goes_through_main_reflection_and_safety(demo_model_dir, tmp_path):
    from trainers.cli.main import main

    settings = SMALL + ["train.stages=[main,reflection,safety]", "train.steps=1", "train.reflection.steps=1",
                        "train.safety.steps=1"]
    out = tmp_path / "run"
    args = [part for item in settings for part in ("--set", item)]
    assert main(["run", "relay", *args, "--out", str(out), "--tracker", "none"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [row["train/step"] for row in rows] == [1, 2, 3]
    assert [row["train/stage"] for row in rows] == [1.0, 2.0, 3.0]
    assert [row["train/stage_name"] for row in rows] == ["main", "reflection", "safety"]
    assert {"reflection/tasks", "reflection/first_try_success", "reflection/retry_success"} <= set(rows[1])
    assert {"safety/tasks", "safety/fabrications", "safety/violations"} <= set(rows[2])
    assert rows[1]["reflection/tasks"] >= 1 and rows[2]["safety/tasks"] == 2
