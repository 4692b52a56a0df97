"""Load a scenario YAML into a checked `Scenario`, or report every problem as FILE:LINE:COL.

    scenario = load_scenario("scenarios/relay.yaml", overrides=["train.lr=1e-4"])
    scenario.tasks()          # list[marl.types.Task]

`--set` overrides are applied first (`marl.scenario.overrides`). Problems come in two passes: the shape
(pydantic: unknown keys, missing keys, wrong types) and the meaning (unknown agents in the graph,
cycles, tools, teams, import paths, task files). All problems of a pass are collected, so a user
fixes a file in one go. Each is printed as `FILE:LINE:COL: key.path: what is wrong (how to fix it)`
(`marl.scenario.problems`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from pydantic import ValidationError

from common.files import (FileProblem, FileTooLarge, parse_json_line, read_user_file, read_user_text, text_lines,
                          user_file_problem)
from judges.model.gguf_source import PACKAGED_MODELS, gguf_source_problem, is_gguf_source, local_model_path
from judges.model.reward_model import reward_model_problem
from judges.model.verdict import local_label_problem
from judges.rules.registry import KNOWN_KINDS, build_scorer
from marl.scenario.graph import check_graph
from common.imports import resolve_callable
from marl.scenario import checks as scenario_checks
from marl.scenario.overrides import apply_overrides
from marl.scenario.problems import Problem, ScenarioError, os_error_problem, shape_problems, where
from marl.scenario.spec import ScenarioSpec, TaskSpec
from marl.types import Task
from marl.scenario.yaml_positions import MAX_BYTES, YamlSyntaxError, decode_yaml_bytes, load_with_positions, locate

__all__ = ["Problem", "Scenario", "ScenarioError", "apply_overrides", "find_scenario", "load_scenario", "load_tasks"]

BUILTIN_DIR = Path(__file__).resolve().parents[2] / "scenarios"
MAX_TASK_PROBLEMS = 20  # bad lines of a tasks file reported at most


@dataclass(frozen=True)
class Scenario:
    """A validated scenario: its spec and the directory its relative paths and imports resolve in."""

    spec: ScenarioSpec
    base_dir: Path
    file: str = "<scenario>"
    positions: dict = field(default_factory=dict, compare=False, repr=False)  # key path -> (line, column)
    overridden: dict = field(default_factory=dict, compare=False, repr=False)  # key path -> its `--set` item
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def resolve(self, reference: str):
        """The callable named by a 'module:function' reference of this scenario."""
        return resolve_callable(reference, self.base_dir)

    def resolve_tool(self, reference: str):
        """The tool function named by 'module:function', only from the scenario's folder or an allowed
        module (marl.scenario.checks.resolve_tool); ValueError otherwise."""
        return scenario_checks.resolve_tool(reference, self.base_dir)

    def tasks(self) -> list[Task]:
        """Every task of the scenario (inline, JSONL or generated), loaded and checked once: ScenarioError
        when what the tasks really hold does not fit the scenario (`task_problems`)."""
        if "tasks" not in self._cache:
            tasks = load_tasks(self)
            problems = [Problem(*where(path, self.positions, self.file, self.overridden), path, message)
                        for path, message in task_problems(self, tasks)]
            if problems:
                raise ScenarioError(problems)
            self._cache["tasks"] = tasks
        return self._cache["tasks"]

    def split(self) -> tuple[list[Task], list[Task]]:
        """(training tasks, held-out evaluation tasks): the last `tasks.eval_count` are held out."""
        tasks, held_out = self.tasks(), self.spec.tasks.eval_count
        return (tasks[:-held_out], tasks[-held_out:]) if held_out else (tasks, [])

    @cached_property
    def agent_names(self) -> list[str]:
        return [agent.name for agent in self.spec.agents]


def find_scenario(name_or_path: str | Path) -> Path:
    """A path to a scenario file: the path itself, or a built-in scenario by name ('relay')."""
    path = Path(name_or_path)
    if path.is_file() or (path.exists() and not path.is_dir()):  # a FIFO or a device: refused as it is read
        return path
    builtin = BUILTIN_DIR / f"{name_or_path}.yaml"
    if builtin.is_file():
        return builtin
    known = ", ".join(sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml")))
    raise FileNotFoundError(f"no scenario file {name_or_path!r} (built-in scenarios: {known})")


def load_scenario(source: str | Path | dict | ScenarioSpec, overrides: list[str] = ()) -> Scenario:
    """Load and check a scenario from a path, a built-in name, a dict or a spec; raise ScenarioError."""
    if isinstance(source, ScenarioSpec):
        return _checked(source, {}, Path.cwd(), "<spec>", set())
    if isinstance(source, dict):
        data, positions, file, base_dir = source, {}, "<dict>", Path.cwd()
    else:
        path = find_scenario(source)
        file, base_dir = str(path), path.resolve().parent
        try:
            data, positions = load_with_positions(_read_text(path))
        except YamlSyntaxError as error:
            raise ScenarioError([Problem(file, error.line, error.column, error.path, error.message)]) from None
    if not isinstance(data, dict):
        raise ScenarioError([Problem(file, 1, 1, (), "a scenario file must be a mapping of sections "
                                     "(name, agents, tasks, rewards, ...)")])
    data, overridden = apply_overrides(data, overrides, file)
    try:
        spec = ScenarioSpec.model_validate(data)
    except ValidationError as error:
        raise ScenarioError(shape_problems(error, ScenarioSpec, data, positions, file, overridden)) from None
    return _checked(spec, positions, base_dir, file, overridden)


def _read_text(path: Path) -> str:
    """The text of a scenario file: a regular file (common.files.read_user_file: never a FIFO or a device),
    bounded in size, UTF-8 (YamlSyntaxError otherwise)."""
    try:
        data = read_user_file(path, max_bytes=MAX_BYTES, expected="a scenario YAML file")
    except FileTooLarge as problem:
        size = f"{problem.size:,}" if problem.exact else f"more than {MAX_BYTES:,}"
        raise YamlSyntaxError(1, 1, f"the file is {size} bytes; scenario files are limited to {MAX_BYTES:,} (move "
                                    "task data into a tasks.jsonl file)") from None
    except FileProblem as problem:
        raise YamlSyntaxError(1, 1, problem.reason) from None
    return decode_yaml_bytes(data)


def _checked(spec: ScenarioSpec, positions, base_dir: Path, file: str, overridden) -> Scenario:
    scenario = Scenario(spec=spec, base_dir=base_dir, file=file, positions=positions,
                        overridden=dict(overridden) if isinstance(overridden, dict) else {})
    try:
        found = check_semantics(scenario)
    except OSError as error:  # a path the file system refuses to look up (too long): its key, one line
        found = [os_error_problem(spec.model_dump(mode="json"), error)]
    problems = [Problem(*where(path, positions, file, overridden), path, message) for path, message in found]
    if problems:
        raise ScenarioError(problems)
    return scenario


def check_semantics(scenario: Scenario) -> list[tuple[tuple, str]]:
    """Cross-reference problems as (key path, message) pairs; empty when the scenario is sound."""
    spec, names = scenario.spec, scenario.agent_names
    problems = []
    seen = set()
    for index, agent in enumerate(spec.agents):
        if agent.name in seen:
            problems.append((("agents", index, "name"), f"duplicate agent name {agent.name!r} (names must be unique)"))
        seen.add(agent.name)
        tool_names = {tool.name for tool in spec.tools}
        for j, tool in enumerate(agent.tools):
            if tool not in tool_names:
                problems.append((("agents", index, "tools", j), f"unknown tool {tool!r} (declare it under `tools` "
                                 f"or remove it; declared: {', '.join(sorted(tool_names)) or 'none'})"))
    problems += [(("graph",) + p.path, p.message) for p in check_graph(names, spec.graph)]
    problems += _team_problems(spec, names)
    problems += _policy_problems(scenario)
    problems += _model_problems(scenario)
    problems += _reward_problems(scenario)
    problems += _reference_problems(scenario)
    problems += _converge_problems(spec)
    problems += _template_problems(spec, names)
    if spec.graph.end_on is not None and (problem := scenario_checks.pattern_problem(spec.graph.end_on)):
        problems.append((("graph", "end_on"), f"{problem} (graph.end_on is matched against whole messages)"))
    return problems


def _policy_problems(scenario: Scenario) -> list[tuple[tuple, str]]:
    """Every agent's policy names something that can play it (checked before any model is built)."""
    problems = []
    for index, agent in enumerate(scenario.spec.agents):
        path, policy = ("agents", index, "policy"), agent.policy
        if policy.startswith("openai:"):
            if agent.base_url is None:
                problems.append((("agents", index, "base_url"), f"policy {policy!r} needs base_url (the "
                                                                "OpenAI-compatible endpoint's URL)"))
        elif policy in ("shared", "own", "expert", "null", "random") or ":" in policy:
            continue
        elif not ((scenario.base_dir / policy) / "config.json").exists():
            problems.append((path, f"{policy!r} is not shared, own, expert, null, random, module:function, "
                                   "openai:MODEL or a Hugging Face model directory (no config.json there)"))
    return problems


def _model_problems(scenario: Scenario) -> list[tuple[tuple, str]]:
    """train.model as a GGUF file or packaged model, and each local judge's model: found, and GGUF or a model
    directory (a GGUF conversion needs torch: at run time)."""
    problems = []
    model = scenario.spec.train.model
    if is_gguf_source(model) and (problem := gguf_source_problem(model)) is not None:
        problems.append((("train", "model"), problem))
    for index, judge in enumerate(scenario.spec.judges):  # a local judge's model: relative to the scenario's folder
        if judge.backend == "local" and (problem := _local_judge_problem(judge.model, scenario.base_dir)):
            problems.append((("judges", index, "model"), problem))
    return problems


def _local_judge_problem(model: str, base_dir: Path) -> str | None:
    """A local judge's model: a GGUF source that is found and is GGUF, or a directory with a config.json."""
    path = local_model_path(model, base_dir)
    if is_gguf_source(model):
        return gguf_source_problem(path)
    if not (Path(path) / "config.json").is_file():
        return (f"{model!r} is not a Hugging Face model directory (no config.json in {path}); give a model directory "
                f"or a .gguf file (relative to the scenario's folder), or {', '.join(PACKAGED_MODELS)}")
    return None


def _team_problems(spec: ScenarioSpec, names: list[str]) -> list[tuple[tuple, str]]:
    if spec.mode != "mixed":
        return [(("teams",), "teams are only read in mode 'mixed' (remove them or set mode: mixed)")] \
            if spec.teams else []
    if not spec.teams or len(spec.teams) < 2:
        return [(("teams",), "mode 'mixed' needs at least two teams (team name -> list of agents)")]
    problems, placed = [], {}
    for team, members in spec.teams.items():
        for j, name in enumerate(members):
            if name not in names:
                problems.append((("teams", team, j), f"unknown agent {name!r} (known: {', '.join(names)})"))
            elif name in placed:
                problems.append((("teams", team, j), f"agent {name!r} is already in team {placed[name]!r}"))
            placed.setdefault(name, team)
    missing = [name for name in names if name not in placed]
    if missing:
        problems.append((("teams",), f"agents without a team: {', '.join(missing)} (add each to one team)"))
    return problems


def _reward_problems(scenario: Scenario) -> list[tuple[tuple, str]]:
    rewards, names = scenario.spec.rewards, scenario.agent_names
    judge_names = {judge.name for judge in scenario.spec.judges}
    problems = []
    if rewards.answer_from is not None and rewards.answer_from not in names:
        problems.append((("rewards", "answer_from"), f"unknown agent {rewards.answer_from!r} (known: {', '.join(names)})"))
    problems += _blend_problems(rewards, judge_names)
    for layer in ("outcome", "process", "format", "penalties"):
        for index, scorer in enumerate(getattr(rewards, layer)):
            path = ("rewards", layer, index)
            if scorer.agent is not None and scorer.agent not in names:
                problems.append((path + ("agent",), f"unknown agent {scorer.agent!r} (known: {', '.join(names)})"))
            if scorer.kind in judge_names:
                problems += _judge_use_problems(scenario, scorer, path)
                continue
            if scorer.kind not in KNOWN_KINDS:
                problems.append((path + ("kind",), f"unknown scorer kind {scorer.kind!r} (rule kinds: "
                                 f"{', '.join(KNOWN_KINDS)}; or the name of a judge under `judges`)"))
                continue
            database = scorer.params().get("database") if scorer.kind == "sql" else None
            if database is not None and (problem := scenario_checks.database_problem(database, scenario.base_dir)):
                problems.append((path + ("database",), problem))
                continue
            try:
                build_scorer(scorer.kind, scorer.params(), scenario.base_dir)
            except (ValueError, TypeError) as error:
                problems.append((path, f"{scorer.kind}: {error}"))
    return problems


def _blend_problems(rewards, judge_names: set) -> list[tuple[tuple, str]]:
    """rewards.blend must name one rule verifier and one judge, the outcome layer's only scorers."""
    blend = rewards.blend
    if blend is None:
        return []
    kinds = [scorer.kind for scorer in rewards.outcome]
    problems = []
    if blend.judge not in judge_names:
        problems.append((("rewards", "blend", "judge"), f"{blend.judge!r} is not a judge under `judges` "
                                                        f"(judges: {', '.join(sorted(judge_names)) or 'none'})"))
    if blend.rule in judge_names:
        problems.append((("rewards", "blend", "rule"), f"{blend.rule!r} is a judge; give a rule verifier kind"))
    if sorted(kinds) != sorted([blend.rule, blend.judge]):
        problems.append((("rewards", "outcome"), f"with rewards.blend the outcome layer holds exactly the rule "
                                                 f"{blend.rule!r} and the judge {blend.judge!r} (it has: "
                                                 f"{', '.join(kinds) or 'nothing'})"))
    return problems


def _judge_use_problems(scenario: Scenario, scorer, path: tuple) -> list[tuple[tuple, str]]:
    judge = next(j for j in scenario.spec.judges if j.name == scorer.kind)
    index = scenario.spec.judges.index(judge)
    problems = []
    if scorer.params():
        problems.append((path, f"a judge scorer takes no parameters (got {sorted(scorer.params())}); "
                               f"configure judge {judge.name!r} under `judges`"))
    if judge.mode != "pointwise":
        problems.append((("judges", index, "mode"), f"judge {judge.name!r} scores a reward layer, which needs mode "
                                                    "'pointwise' (pairwise and listwise compare candidates)"))
    if judge.backend == "reward_model" and (problem := reward_model_problem(scenario.base_dir / judge.model)):
        problems.append((("judges", index, "model"), problem))
    if judge.backend == "local" and judge.verdict == "logprobs":
        if (problem := local_label_problem(scenario.base_dir / judge.model)) is not None:
            problems.append((("judges", index, "verdict"), problem))
    if judge.calibration and (problem := _data_file_problem(scenario.base_dir / judge.calibration)) is not None:
        problems.append((("judges", index, "calibration"), f"file {judge.calibration!r} {problem} (fit one with "
                                                           "`marl judges calibrate`)"))
    return problems


def _data_file_problem(path: Path) -> str | None:
    """Why a data file a scenario names (tasks, a calibrator) cannot be read, or None: not found, or not a
    regular file (a FIFO would hang the read, /dev/zero never ends; common.files.user_file_problem)."""
    if not path.exists():
        return f"not found next to the scenario (looked in {path.parent})"
    problem = user_file_problem(path, "a regular file")
    return None if problem is None else problem.removesuffix("; give a regular file")


def _reference_problems(scenario: Scenario) -> list[tuple[tuple, str]]:
    spec, problems = scenario.spec, []
    references = [(("expert",), spec.expert, scenario.resolve), (("tasks", "generator"), spec.tasks.generator,
                                                                    scenario.resolve),
                  (("referee",), spec.referee, scenario.resolve), (("evaluation",), spec.evaluation, scenario.resolve)]
    references += [(("opponents", name), reference, scenario.resolve) for name, reference in spec.opponents.items()
                   if reference not in ("expert", "null", "random")]
    for name in spec.train.selfplay.fixed_opponents:
        if name not in spec.opponents:
            problems.append((("train", "selfplay", "fixed_opponents", name),
                             f"no opponent {name!r}: fixed_opponents name the scenario's `opponents` "
                             f"({', '.join(spec.opponents) or 'none declared'})"))
    if spec.opponents and spec.mode == "cooperative":
        problems.append((("opponents",), "opponents are for competitive scenarios (a cooperative team has no "
                                         "opponent); drop them or set mode: competitive"))
    references += [(("tools", i, "function"), tool.function, scenario.resolve_tool) for i, tool in enumerate(spec.tools)]
    for path, reference, resolve in references:
        if reference is None:
            continue
        late = (f"importing the module of {reference} did not finish within {spec.tasks.timeout_s:g} s (look "
                "for code that runs at import; or raise tasks.timeout_s)")
        try:  # bounded: a scenario module may hang as it loads
            scenario_checks.call_within(lambda: resolve(reference), spec.tasks.timeout_s, late)
        except scenario_checks.GeneratorProblem as problem:
            problems.append((path, str(problem)))
        except ValueError as error:
            fix = "" if str(error).endswith("next to the scenario") else " (fix the 'module:function' path)"
            problems.append((path, f"{error}{fix}"))
    if spec.tasks.jsonl is not None and (problem := _data_file_problem(scenario.base_dir / spec.tasks.jsonl)):
        problems.append((("tasks", "jsonl"), f"file {spec.tasks.jsonl!r} {problem}"))
    return problems


def _converge_problems(spec: ScenarioSpec) -> list[tuple[tuple, str]]:
    """train.selfplay.converge only where self-play runs, and mmd's KL not set twice (one line each)."""
    train, path = spec.train, ("train", "selfplay", "converge")
    converge = train.selfplay.converge
    if converge == "none":
        return []
    if spec.mode == "cooperative":
        return [(path, f"converge={converge} makes the self-play of a zero-sum game converge; this scenario is "
                       "cooperative (no self-play): remove it")]
    if train.selfplay.enabled is False:
        return [(path, f"converge={converge} needs self-play, which train.selfplay.enabled: false turns off")]
    if converge == "mmd" and (train.beta or train.ref_update_every):
        return [(path, "converge=mmd sets the KL term itself (train.selfplay.magnet_weight, magnet_every); "
                       "leave train.beta and train.ref_update_every at 0")]
    if converge == "average" and (train.backend == "ray" or train.engine.kind == "http"):
        return [(path, "converge=average plays its snapshots in this process; use backend local and engine "
                       "inprocess")]
    return []


def _template_problems(spec: ScenarioSpec, names: list[str]) -> list[tuple[tuple, str]]:
    """Observation templates use known fields and bounded format specs (marl.scenario.checks)."""
    problems = []
    for index, agent in enumerate(spec.agents):
        for message in scenario_checks.template_problems(agent.observation or "", names):
            problems.append((("agents", index, "observation"), message))
        if "{state}" in (agent.observation or "") and spec.referee is None:
            problems.append((("agents", index, "observation"), "{state} is a game's state, and this scenario has no "
                             "referee (add `referee: module:function`, or drop {state})"))
    return problems


def task_problems(scenario: Scenario, tasks: list[Task]) -> list[tuple[tuple, str]]:
    """What the tasks the scenario really produces (a generator's too: it has run) leave the run unable to
    do, as (key path, message): a held-out count that leaves no task to train on, and a `{task.KEY}` in an
    observation template that no task's metadata has (the agent would see an empty string there)."""
    problems = []
    held_out = scenario.spec.tasks.eval_count
    if held_out >= len(tasks):
        problems.append((("tasks", "eval_count"), f"eval_count {held_out} holds out every one of the {len(tasks)} "
                         f"task(s), leaving none to train on (set it to at most {len(tasks) - 1}, or add tasks)"))
    keys = set()
    for task in tasks:  # a variant may set metadata of its own (marl.env plays it in the task's place)
        keys.update(task.metadata)
        keys.update(key for variant in task.variants if isinstance(variant, dict)
                    for key in variant.get("metadata") or {})
    for index, agent in enumerate(scenario.spec.agents):
        for key in scenario_checks.task_fields(agent.observation or ""):
            if key not in keys:
                problems.append((("agents", index, "observation"), _missing_key_message(key, keys)))
    return problems


def _missing_key_message(key: str, keys: set) -> str:
    """{task.KEY} names a metadata key no task has: the keys the tasks do have, and the closest of them."""
    if not keys:
        return f"{{task.{key}}}: the tasks have no metadata, so it would always be empty (add metadata: " \
               f"{{{key}: ...}} to the tasks, or use {{prompt}})"
    close = difflib.get_close_matches(key, sorted(keys), n=1, cutoff=0.6)
    guess = f"did you mean {{task.{close[0]}}}? " if close else ""
    return f"{{task.{key}}}: no task has metadata key {key!r}, so it would always be empty ({guess}the tasks' " \
           f"keys: {', '.join(sorted(keys))})"


def load_tasks(scenario: Scenario) -> list[Task]:
    """The scenario's tasks as `Task` objects, with ids (`<scenario>-<n>` unless given)."""
    spec = scenario.spec.tasks
    if spec.inline is not None:
        raw = [task.model_dump() for task in spec.inline]
    elif spec.jsonl is not None:
        raw = _read_jsonl(scenario.base_dir / spec.jsonl)
    else:
        raw = _generate(scenario)
    tasks = []
    for index, item in enumerate(raw):
        try:
            item = TaskSpec.model_validate(item)
        except ValidationError as error:
            raise ScenarioError([Problem(scenario.file, 1, 1, ("tasks",), f"task {index} is malformed: "
                                         f"{_first_line(error)} (fix the task source)")]) from None
        tasks.append(task_from_spec(item, f"{scenario.spec.name}-{index}"))
    if not tasks:
        raise ScenarioError([Problem(scenario.file, 1, 1, ("tasks",), "the scenario produced no tasks")])
    return tasks


def _first_line(error: Exception) -> str:
    return " ".join(str(error).split("\n")[:3])


def _generate(scenario: Scenario) -> list[dict]:
    """Call the task generator under tasks.timeout_s; any failure becomes a ScenarioError naming it."""
    spec = scenario.spec.tasks
    try:
        def generator(seed, count):  # the import runs under the timeout too: a module may hang as it loads
            return scenario.resolve(spec.generator)(seed=seed, count=count)

        return scenario_checks.run_generator(generator, spec.generator, spec.seed, spec.count, spec.timeout_s)
    except scenario_checks.GeneratorProblem as problem:
        message = str(problem)
    except Exception as error:  # noqa: BLE001 - user code: report it, never a traceback
        message = f"{spec.generator} raised {type(error).__name__}: {_first_line(error)} (fix the generator)"
    line, column = locate(scenario.positions, ("tasks", "generator"))
    raise ScenarioError([Problem(scenario.file, line, column, ("tasks", "generator"), message)])


def _read_jsonl(path: Path) -> list[dict]:
    """The tasks of a JSONL tasks file, each checked against TaskSpec: every bad line is a located Problem
    (FILE:LINE:COL), the file itself read as every user file is (common.files: a regular file, bounded,
    UTF-8, each line's JSON bounded in nesting and digits)."""
    rows, problems = [], []
    try:
        text = read_user_text(path, expected="a JSONL file of tasks, one JSON object per line")
    except FileProblem as problem:
        raise ScenarioError([Problem(str(path), problem.line or 1, problem.column or 1, ("tasks", "jsonl"),
                                     problem.reason)]) from None
    for number, line in text_lines(text):
        try:
            rows.append(TaskSpec.model_validate(parse_json_line(path, number, line)).model_dump())
        except FileProblem as problem:
            problems.append(Problem(str(path), number, problem.column or 1, ("tasks", "jsonl"), problem.reason))
        except ValidationError as error:
            problems.append(Problem(str(path), number, 1, ("tasks", "jsonl"), f"bad task line: {error}".splitlines()[0]))
        if len(problems) >= MAX_TASK_PROBLEMS:  # a binary or foreign file: the first lines say what it is
            break
    if problems:
        raise ScenarioError(problems)
    return rows


def task_from_spec(item: TaskSpec, default_id: str) -> Task:
    """A validated TaskSpec as a Task (`default_id` when the spec has no id)."""
    return Task(id=item.id or default_id, prompt=item.prompt, answer=item.answer, metadata=dict(item.metadata),
                difficulty=item.difficulty, variants=tuple(_variant(v) for v in item.variants))


def _variant(variant) -> str | dict:
    """A TaskSpec variant as Task data: the prompt string, or a dict of the fields it sets."""
    if isinstance(variant, str):
        return variant
    return variant.model_dump(exclude_none=True, exclude_defaults=True)
