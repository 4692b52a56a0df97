"""`marl rollout FILE`: play episodes of a scenario with a fixed policy, print transcripts.

`--policy` is a scripted policy (expert, null, random, module:function; needs no torch) or a model
directory (a Hugging Face causal LM, or a LoRA adapter on the base it names; e.g. a checkpoint's
`model/`), which plays every agent greedily
with the prompts it was trained on (trainers/policy/prompts.py). A directory that does not load is
one line and exit 2 before anything plays.
"""

from __future__ import annotations

import json
import math
import statistics

from pathlib import Path

from common.chat import check_model_dir
from common.text import printable
from judges.model.gguf_source import is_gguf_source
from marl.credit.coalitions import episode_credit
from trainers.cli.common import (UsageError, add_judge_cache_argument, add_play_arguments, judge_cache_path, judged,
                                 path_value, quiet_libraries, setup_play, usage_errors)
from trainers.policy.actors import ModelActor
from trainers.policy.adapters import is_adapter_dir, load_adapter_dir
from trainers.policy.gguf import resolve_model_dir


def add_parser(commands) -> None:
    """Register `marl rollout FILE`."""
    rollout = commands.add_parser("rollout", help="play episodes of a scenario with a fixed policy")
    rollout.add_argument("file", metavar="FILE", type=path_value,
                         help="scenario file or built-in name (relay, weather, ...)")
    add_play_arguments(rollout, episodes=3)
    for action in rollout._actions:  # rollout also takes a model directory (the shared help says scripted only)
        if action.dest == "policy":
            action.help = ("expert, null, random, module:function, or a model directory (a Hugging Face causal LM, "
                           "e.g. a checkpoint's model/, a .gguf file or smollm2-135m-instruct; it plays every "
                           "agent at temperature 0)")
    rollout.add_argument("--base", metavar="DIR", type=path_value,
                         help="with --policy ADAPTER_DIR: its base model directory (default: "
                              "the one the adapter names)")
    rollout.add_argument("--quiet", action="store_true", help="print only the summary line")
    rollout.add_argument("--credit", action="store_true", help="also print each agent's credit (scenario's credit section)")
    add_judge_cache_argument(rollout, "$MARL_CACHE/judge_cache.sqlite (~/.cache/marl), shared with marl credit")
    rollout.set_defaults(handler=run)


def run(args) -> int:
    """Play episodes with one policy and print their transcripts and reward breakdowns."""
    from marl.policies import rollout

    with usage_errors(ValueError, FileNotFoundError):  # a bad policy, file or --episodes: one line
        if is_model_directory(args.policy):
            # the scenario, env and tasks as for any policy ('null' always exists), then the model in its place
            scenario, _, env, tasks = setup_play(args.file, args.set, "null", args.seed, args.episodes)
            policy = ModelPolicy.load(args.policy, scenario, args.base)
        else:
            if args.base is not None:
                raise UsageError(f"--base {args.base}: only for --policy ADAPTER_DIR (a LoRA adapter directory); "
                                 "drop --base")
            try:
                scenario, policy, env, tasks = setup_play(args.file, args.set, args.policy, args.seed, args.episodes)
            except ValueError as error:  # rollout also plays a model directory: say so where the policy is unknown
                if str(error).startswith("unknown policy"):
                    raise UsageError(f"{error}, or a model directory (a path to a Hugging Face causal LM or a "
                                     "LoRA adapter)") from None
                raise
        means = []
        with judged(scenario, judge_cache_path(args.judge_cache)):  # a dead judge: one line, exit 2, before any episode
            for index, task in enumerate(tasks):
                result = rollout(env, policy, task=task, seed=args.seed + index)
                means.append(statistics.fmean(result.rewards.values()) if scenario.spec.mode == "cooperative"
                             else max(b.total for b in result.breakdown.values()))
                if not args.quiet:
                    print_episode(result)
                if args.credit and not args.quiet:
                    _print_episode_credit(env, policy, task, args.seed + index)
    valid = [m for m in means if not math.isnan(m)]
    summary = {"scenario": scenario.spec.name, "policy": args.policy, "episodes": len(means),
               "mean_reward": statistics.fmean(valid) if valid else None, "masked": len(means) - len(valid)}
    print(json.dumps(summary))
    return 0


def is_model_directory(policy: str) -> bool:
    """Whether --policy names a model directory: an existing folder, or a path (not 'module:function'), or a
    GGUF model (a .gguf file or a packaged model's name, converted to a directory)."""
    return is_gguf_source(policy) or (":" not in policy and (Path(policy).is_dir() or "/" in policy
                                                            or policy.startswith(".")))


class ModelPolicy:
    """A model directory as a `policy(agent, observation, task) -> text`: its actor answers each turn
    greedily within the agent's max_tokens, its prompts rendered in the agent's style."""

    def __init__(self, actor, max_tokens: dict[str, int]):
        self.actor, self.max_tokens = actor, max_tokens

    @classmethod
    def load(cls, directory: str, scenario, base: str | None = None) -> "ModelPolicy":
        """Check the directory (ValueError, one line), then load it as every agent's actor (an adapter
        on `base`, else on the base it names)."""
        import torch

        from trainers.policy.prompts import agent_styles
        from trainers.policy.tinylm import load_policy

        quiet_libraries()
        if is_gguf_source(directory):  # a .gguf file or a packaged model: converted once into the model cache
            directory = str(resolve_model_dir(directory))
        if is_adapter_dir(directory):  # a LoRA run's checkpoint: the adapter on the base it names
            torch.set_num_threads(scenario.spec.train.threads)
            model, tokenizer = load_adapter_dir(directory, base)
        else:
            if base is not None:
                raise ValueError(f"--base {base}: only for a LoRA adapter directory, and {directory} is a full model")
            problem = check_model_dir(directory)
            if problem is not None:
                raise ValueError(f"--policy {problem}")
            torch.set_num_threads(scenario.spec.train.threads)
            model, tokenizer = load_policy(directory)
        actor = ModelActor(Path(directory).name, model, tokenizer, trainable=False, styles=agent_styles(scenario.spec))
        return cls(actor, {agent.name: agent.max_tokens for agent in scenario.spec.agents})

    def __call__(self, agent: str, observation: str, task) -> str:
        """The model's message for one turn."""
        [text] = self.actor.act([(agent, observation, task)], max_new_tokens=self.max_tokens.get(agent, 16),
                                greedy=True).texts
        return text


def _format_breakdown(name: str, breakdown) -> list[str]:
    lines = [f"  reward[{name}] = {breakdown.total:.3f}  layers: " + ", ".join(
        f"{layer} {score:.2f}" if score is not None else f"{layer} -" for layer, score in breakdown.layers.items())]
    for part in breakdown.components:
        score = "failed" if part["score"] is None else f"{part['score']:.2f}"
        lines.append(f"    {part['layer']:<8} {part['kind']:<11} {score:>6}  {printable(part['rationale'], 90)}")
    for penalty in breakdown.penalties:
        if penalty["applied"]:
            lines.append(f"    penalty  {penalty['kind']:<11} -{penalty['amount']:.2f}  {printable(penalty['rationale'], 90)}")
    return lines


def _quoted(text, limit: int = 2000) -> str:
    """Model text as a Python literal (repr escapes every control character), cut to `limit` characters."""
    text = str(text)
    return repr(text) if len(text) <= limit else f"{text[:limit]!r} ... [{len(text) - limit} chars cut]"


def print_episode(result) -> None:
    """A readable transcript with each heard observation, the action, tool results and rewards: what
    models and judges wrote is shown quoted or as plain text (no escape sequence reaches the terminal)."""
    print(f"task {result.task.id}: {_quoted(result.task.prompt)}  (answer {_quoted(result.task.answer)})")
    for turn in result.observations:
        print(f"  {turn['agent']} sees {_quoted(turn['observation'])}")
        print(f"  {turn['agent']} says {_quoted(turn['action'])}")
    for entry in result.transcript:  # a game's referee: its verdict on the turn it ended (marl.env)
        if entry.get("referee"):
            print(f"  referee: {printable(entry['referee'])}")
    for name, breakdown in result.breakdown.items():
        for line in _format_breakdown(name, breakdown):
            print(line)
    print("  rewards: " + ", ".join(f"{agent} {value:+.3f}" for agent, value in result.rewards.items()))


def _print_episode_credit(env, policy, task, seed) -> None:
    estimate, _ = episode_credit(env, policy, task, seed=seed)
    shares = ", ".join(f"{agent} {value:+.3f}±{estimate.stderr[agent]:.3f}" for agent, value in estimate.values.items())
    print(f"  credit ({estimate.method}, {estimate.n_evals} coalitions): {shares}; sum {sum(estimate.values.values()):+.3f}")
