"""Scenario environments: a PettingZoo `ParallelEnv` built from a scenario, and its AEC view.

    env = marl.make_env("relay")             # or a path, a dict, a loaded Scenario
    observations, infos = env.reset(seed=0)  # a task is drawn with the seed (or options={"task": ...})
    while env.agents:
        actions = {agent: {"text": "..."} for agent in env.agents}
        observations, rewards, terminations, truncations, infos = env.step(actions)

Spaces: observations and actions are `Dict({"text": Text(max_length, min_length=0, charset=printable)})`.
Everything the env emits is clipped to its space and characters outside the charset become '?'. An
observation over `observation_max_chars` keeps its head (what the template puts before {history}:
the role and the task, up to three quarters of the limit) and its most recent text, and drops the middle of the
history, marking the cut with CUT_MARK (`keep_ends`); a message over `action_max_chars` keeps its
first characters. Actions may be given as {"text": str} or str.

Turns: every live agent submits an action at each step, as the parallel API requires, but only the
agents whose turn it is (the graph's turn order) are heard; the others' actions are ignored.
`infos[agent]["your_turn"]` says whose action will count at the next step. An episode ends after
`graph.rounds` rounds, or early when a message fully matches `graph.end_on` (termination), or when
`max_cycles` steps have passed (truncation). Rewards arrive at the last step, from the reward spec.

Games: a scenario's `referee` (module:function) is called as referee(task, transcript) at the reset
and after every turn. Its `state` is the template field {state}: one text (a board) or a text per
agent ({agent: text}: the card only that player sees). Its `over` ends the episode (termination),
and its `verdict` on the last turn goes into the infos (`infos[agent]["referee"]`) and into the
transcript's last entry as "referee". The rules of the game (an illegal move loses, say) are the
referee's and the scorer's, never a crash of the env.

Infos carry the transcript, the agent's own tool results, its tool-call validity, and at the end the
reward breakdown.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import replace
from functools import partial
from pathlib import Path

from gymnasium import spaces
from pettingzoo import ParallelEnv
from pettingzoo.utils.conversions import parallel_to_aec

from judges.model.factory import build_judge
from judges.rules.patterns import compile_pattern
from judges.rules.registry import build_scorer
from marl.scenario.graph import build_visibility, episode_turns, visible_speakers
from marl.rewards import EpisodeScorer
from marl.scenario.load import Scenario, load_scenario
from marl.tools import ToolRegistry, ToolSpec
from marl.types import Task

CHARSET = string.printable
DEFAULT_OBSERVATION = "{role}\n{prompt}\n{history}{tool_results}"
CUT_MARK = "\n[...]\n"  # where a too-long observation's middle was dropped (printable: it survives sanitise)
_OUTSIDE_CHARSET = re.compile(f"[^{re.escape(CHARSET)}]")
HEAD_SHARE = 0.75  # the most of a cut text its head may keep: the rest goes to the most recent text
_HISTORY_AT = "\x00"  # stands for {history} when measuring an observation's head (outside the charset)


def sanitise(text: str, max_chars: int, keep: str = "head") -> str:
    """Replace characters outside the charset with '?' and clip to max_chars (head or tail kept)."""
    text = _OUTSIDE_CHARSET.sub("?", str(text))
    if len(text) <= max_chars:
        return text
    return text[:max_chars] if keep == "head" else text[-max_chars:]


def keep_ends(text: str, max_chars: int, head: int) -> str:
    """`text` within `max_chars`: its first `head` characters (at most HEAD_SHARE of the limit), CUT_MARK, and
    its most recent characters; unchanged when it fits. A text already cut keeps its one mark: the
    head never reaches past the earlier CUT_MARK nor the tail before it (cutting again drops more of
    the same middle), and a tail shorter than the room left gives the head that room."""
    if len(text) <= max_chars:
        return text
    if max_chars <= 2 * len(CUT_MARK):  # no room for both ends and a mark: the most recent text
        return text[len(text) - max_chars:]
    head, earlier = max(0, min(head, int(max_chars * HEAD_SHARE))), text.find(CUT_MARK)
    if earlier >= 0:
        after = len(text) - earlier - len(CUT_MARK)
        head = min(earlier, max(head, max_chars - len(CUT_MARK) - after))
    tail = max_chars - head - len(CUT_MARK)
    return text[:head] + CUT_MARK + text[-tail:]


def text_space(max_length: int) -> spaces.Dict:
    """The text space of observations and actions: printable characters, empty allowed."""
    return spaces.Dict({"text": spaces.Text(max_length=max_length, min_length=0, charset=CHARSET)})


class ScenarioEnv(ParallelEnv):
    """A scenario as a PettingZoo parallel environment (see the module docstring for the rules)."""

    metadata = {"name": "marl_scenario_v0", "render_modes": ["ansi", "human"], "is_parallelizable": True}

    def __init__(self, scenario: Scenario, *, tasks: list[Task] | None = None, render_mode: str | None = None,
                 max_cycles: int | None = None, scorer: EpisodeScorer | None = None):
        self.scenario, spec = scenario, scenario.spec
        self.render_mode = render_mode
        self.possible_agents = list(scenario.agent_names)
        self.agents: list[str] = []
        self.tasks = list(tasks) if tasks is not None else scenario.tasks()
        self.visibility = build_visibility(self.possible_agents, spec.graph)
        self.turns = episode_turns(self.possible_agents, spec.graph)  # lazy: rounds never build a list
        self.max_cycles = max_cycles if max_cycles is not None else len(self.turns)
        # RE2: model output cannot make the match take more than linear time (no catastrophic backtracking)
        self._end_on = compile_pattern(spec.graph.end_on) if spec.graph.end_on else None
        self._referee = scenario.resolve(spec.referee) if spec.referee else None
        self.verdict: dict = {}
        self._agent_spec = {agent.name: agent for agent in spec.agents}
        self._observation_spaces = {a: text_space(spec.observation_max_chars) for a in self.possible_agents}
        self._action_spaces = {a: text_space(spec.action_max_chars) for a in self.possible_agents}
        self.tools = _agent_tool_registries(scenario)
        judges = {judge.name: judge for judge in spec.judges}
        self.scorer = scorer if scorer is not None else EpisodeScorer(
            spec, lambda s: _build_scorer(s, judges, scenario.base_dir, build_scorer))  # pass one to share judges
        self._rng = random.Random(0)
        self.task: Task | None = None
        self.absent: frozenset = frozenset()

    def observation_space(self, agent):
        return self._observation_spaces[agent]

    def action_space(self, agent):
        return self._action_spaces[agent]

    # -- the episode ------------------------------------------------------------------------------

    def reset(self, seed: int | None = None, options: dict | None = None):
        """Start an episode on `options["task"]` (a Task, an id or an index) or on a task drawn with `seed`.

        `options["absent"]`: agents that skip their turns this episode (nothing of theirs is heard or
        recorded): the `skip_turn` counterfactual of credit assignment.
        """
        self.start(seed, options)
        return {a: self._observe(a) for a in self.agents}, {a: self._info(a) for a in self.agents}

    def start(self, seed: int | None = None, options: dict | None = None) -> None:
        """`reset` without building the observations and infos (the episode engine's way in)."""
        if seed is not None:
            self._rng = random.Random(seed)
        options = options or {}
        self.task = self._pick_task(options.get("task"))
        self.absent = frozenset(options.get("absent", ()))
        self.agents = list(self.possible_agents)
        self.turn_index, self.steps = 0, 0
        self.transcript: list[dict] = []
        self.tool_log = []
        self.breakdown = None
        for registry in self.tools.values():
            registry.reset_stats()
        self.verdict = self._ask_referee()

    def step(self, actions: dict):
        """Hear the agents whose turn it is, run their tool calls, and end the episode when due."""
        agents = list(self.agents)  # the agents live before this step (self.agents is empty once it ends)
        rewards, terminated, truncated = self.advance(actions)
        observations = {a: self._observe(a) for a in agents}
        infos = {a: self._info(a) for a in agents}
        return observations, rewards, dict.fromkeys(agents, terminated), dict.fromkeys(agents, truncated), infos

    def observe(self, agent: str) -> dict:
        """What `agent` sees now ({"text": ...}): its entry of the observations reset and step return."""
        return self._observe(agent)

    def tool_validity(self, agent: str) -> float | None:
        """The share of the agent's tool calls that were valid (None: it has no tools): infos' tool_validity."""
        registry = self.tools.get(agent)
        return registry.validity(agent) if registry is not None else None

    def advance(self, actions: dict) -> tuple[dict[str, float], bool, bool]:
        """`step` without building every agent's observation and info: (rewards, terminated, truncated).

        The episode engine (marl.rollout) plays through this and `observe`s only the agents whose turn
        it is; `step` is this plus the PettingZoo dicts, so both follow the same rules.
        """
        if not self.agents:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        for agent in self.turns[self.turn_index]:
            if agent not in self.absent:
                self._hear(agent, actions.get(agent))
        self.turn_index, self.steps = self.turn_index + 1, self.steps + 1
        self.verdict = self._ask_referee()
        if self.verdict.get("verdict") and self.transcript:
            self.transcript[-1]["referee"] = str(self.verdict["verdict"])
        ended_early = bool(self._end_on and self.transcript and self._end_on.fullmatch(self.transcript[-1]["text"]))
        ended_early = ended_early or bool(self.verdict.get("over"))
        terminated = self.turn_index >= len(self.turns) or ended_early
        truncated = not terminated and self.steps >= self.max_cycles
        rewards = {a: 0.0 for a in self.agents}
        if terminated or truncated:
            rewards, self.breakdown = self.scorer.score_episode(self.task, self.transcript, self.tool_log, self.agents)
            self.agents = []
        return rewards, terminated, truncated

    def _ask_referee(self) -> dict:
        """The referee's {state, over, verdict} on the transcript so far ({} without a referee)."""
        if self._referee is None:
            return {}
        try:
            verdict = self._referee(self.task, [dict(turn) for turn in self.transcript])
        except Exception as error:  # noqa: BLE001 - the scenario's own code: name it, in one line
            raise RuntimeError(f"referee {self.scenario.spec.referee} raised {type(error).__name__}: {error}") from None
        if not isinstance(verdict, dict):
            raise RuntimeError(f"referee {self.scenario.spec.referee} returned {type(verdict).__name__}, not a dict "
                               "with 'state', 'over' and 'verdict'")
        return verdict

    def acting_agents(self) -> tuple[str, ...]:
        """The agents whose actions the next step will hear (empty once the episode is over)."""
        if not self.agents or self.turn_index >= len(self.turns):
            return ()
        return tuple(agent for agent in self.turns[self.turn_index] if agent not in self.absent)

    def _pick_task(self, chosen) -> Task:
        if isinstance(chosen, Task):
            return chosen
        if isinstance(chosen, int):
            return self.tasks[chosen]
        if isinstance(chosen, str):
            matches = [task for task in self.tasks if task.id == chosen]
            if not matches:
                raise KeyError(f"no task with id {chosen!r} in scenario {self.scenario.spec.name!r}")
            return matches[0]
        return self.tasks[self._rng.randrange(len(self.tasks))]

    def _hear(self, agent: str, action) -> None:
        text = action.get("text", "") if isinstance(action, dict) else ("" if action is None else str(action))
        text = sanitise(text, self.scenario.spec.action_max_chars)
        self.transcript.append({"agent": agent, "text": text, "turn": self.turn_index})
        registry = self.tools.get(agent)
        if registry is not None and text:
            self.tool_log.extend(replace(call, turn=self.turn_index) for call in registry.run_all(agent, text))

    # -- what agents see --------------------------------------------------------------------------

    def _observe(self, agent: str) -> dict:
        spec = self._agent_spec[agent]
        template = spec.observation if spec.observation is not None else DEFAULT_OBSERVATION
        text = _OUTSIDE_CHARSET.sub("?", template.format_map(_TemplateFields(self, agent)))
        limit = self.scenario.spec.observation_max_chars
        if len(text) <= limit:  # what fits is exactly as before
            return {"text": text}
        # the head is what comes before {history} (the role, the task): kept, so the agent still knows
        # who it is and what it is asked; without {history}, half of each end
        fields = _TemplateFields(self, agent)
        fields["history"] = _HISTORY_AT
        head = template.format_map(fields).find(_HISTORY_AT) if "{history}" in template else -1
        return {"text": keep_ends(text, limit, head if head >= 0 else limit // 2)}

    def _info(self, agent: str) -> dict:
        info = {
            "task_id": self.task.id if self.task else None,
            "your_turn": agent in self.acting_agents(),
            "transcript": [dict(turn) for turn in self.transcript],
            "tool_results": [vars(call) for call in self.tool_log if call.agent == agent],
            "tool_validity": self.tool_validity(agent),
        }
        if self.breakdown is not None:
            info["reward_breakdown"] = {key: vars(value) for key, value in self.breakdown.items()}
        if self.verdict:
            info["referee"] = {"over": bool(self.verdict.get("over")), "verdict": str(self.verdict.get("verdict", ""))}
        return info

    def render(self):
        """ansi: the transcript so far as text; human: print it."""
        lines = [f"task {self.task.id if self.task else '-'}: {self.task.prompt if self.task else ''}"]
        lines += [f"[{turn['turn']}] {turn['agent']}: {turn['text']}"
                  + (f"\n    referee: {turn['referee']}" if turn.get("referee") else "") for turn in self.transcript]
        text = "\n".join(lines)
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def close(self):
        """Nothing to release (tools run in-process)."""


class _TemplateFields(dict):
    """Lazily resolves the fields of an observation template for one agent."""

    def __init__(self, env: ScenarioEnv, agent: str):
        super().__init__()
        self.env, self.agent = env, agent

    def __missing__(self, key: str):
        env, agent = self.env, self.agent
        if key == "prompt":
            return env.task.prompt
        if key == "role":
            return env._agent_spec[agent].role
        if key == "history":
            seen = visible_speakers(env.visibility, agent)
            return "".join(f"{t['agent']}: {t['text']}\n" for t in env.transcript if t["agent"] in seen)
        if key == "tools":
            registry = env.tools.get(agent)
            return registry.describe() if registry is not None else ""
        if key == "tool_results":
            return "".join(f"[{c.name}] {c.result}\n" for c in env.tool_log if c.agent == agent)
        if key == "state":  # one text for everyone (a board), or {agent: text} (a card each sees alone)
            state = env.verdict.get("state", "")
            return str(state.get(agent, "")) if isinstance(state, dict) else str(state)
        if key == "task":
            return _Namespace(env.task.metadata)
        if key == "msg":
            seen = visible_speakers(env.visibility, agent)
            last = {t["agent"]: t["text"] for t in env.transcript if t["agent"] in seen}
            return _Namespace({name: last.get(name, "") for name in env.possible_agents})
        raise KeyError(f"unknown observation field {{{key}}}")


class _Namespace:
    def __init__(self, values: dict):
        self._values = values

    def __getattr__(self, name: str):
        return str(self._values.get(name, ""))


def _build_scorer(scorer_spec, judges: dict, base_dir, build_rule):
    """A rule verifier, or the model judge named by the scorer's kind (from the scenario's `judges`)."""
    if scorer_spec.kind in judges:
        return build_judge(judges[scorer_spec.kind].model_dump(), base_dir)
    return build_rule(scorer_spec.kind, scorer_spec.params(), base_dir)


def _agent_tool_registries(scenario: Scenario) -> dict:
    """One tool registry per agent that has tools, holding only that agent's tools."""
    declared = {tool.name: tool for tool in scenario.spec.tools}
    registries = {}
    for agent in scenario.spec.agents:
        if agent.tools:
            specs = [ToolSpec(name=t.name, function=scenario.resolve_tool(t.function), description=t.description,
                              parameters=t.parameters, timeout_s=t.timeout_s)
                     for t in (declared[name] for name in agent.tools)]
            registries[agent.name] = ToolRegistry(specs, max_calls=scenario.spec.max_tool_calls_per_turn)
    return registries


def make_env(scenario: str | Path | dict | Scenario, *, overrides: list[str] = (), **options) -> ScenarioEnv:
    """A PettingZoo ParallelEnv for a scenario (a built-in name, a path, a dict or a loaded Scenario)."""
    loaded = scenario if isinstance(scenario, Scenario) else load_scenario(scenario, overrides)
    return ScenarioEnv(loaded, **options)


def make_aec_env(scenario: str | Path | dict | Scenario, **options):
    """The same environment through PettingZoo's parallel_to_aec conversion (turn-based AEC API)."""
    return parallel_to_aec(make_env(scenario, **options))


def env_fn(scenario: str | Path | dict | Scenario, **options):
    """A zero-argument factory, as PettingZoo's seed tests expect."""
    return partial(make_env, scenario, **options)
