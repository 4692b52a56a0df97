"""Who speaks for each agent of a scenario: language-model, scripted and endpoint actors.

An actor answers a batch of requests `(agent, observation, task)` in one call. `ModelActor` runs ONE
batched `sample_completions` per call (all the agents and episodes it plays at that turn), and
returns the sampled tokens too, so the trainer can turn them into GRPO samples. Scripted actors
(`expert`, `null`, `random`, 'module:function') and endpoint actors ('openai:MODEL') are frozen.

`build_actors(scenario, base_model_dir)` reads each agent's `policy` and `trainable` fields:

    shared          one model for every agent that says 'shared' (role-conditioned by its observation)
    own             a copy of the base model for this agent alone (with train.lora: its own LoRA
                    adapter on the one frozen base, as 'shared' gets one; trainers/policy/adapters.py)
    a directory     that Hugging Face causal-LM directory
    expert|null|random|module:function   a scripted policy (frozen)
    openai:MODEL    an OpenAI-compatible endpoint (`base_url`, `api_key_env`), frozen
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

from common.chat import check_model_dir
from judges.model.backend import ChatRequest, run_sync
from judges.model.openai_backend import OpenAIBackend
from marl.rollout import Generation  # noqa: F401 - the one Generation; re-exported for callers
from marl.scenario.spec import LoraSpec
from marl.types import Task
from trainers.engine.base import SamplingSettings
from trainers.engine.inprocess import InProcessEngine
from trainers.policy.adapters import AdapterBase

SCRIPTED = ("expert", "null", "random")


class ModelActor:
    """A causal LM answering a batch of observations with one batched sampling call."""

    def __init__(self, name: str, model, tokenizer, *, trainable: bool = True, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int = 0, styles: dict | None = None, engine=None):
        import torch

        from trainers.policy.prompts import ChatTemplateError, template_problem

        self.styles = dict(styles or {})  # agent -> trainers.policy.prompts.TurnStyle (role, chat-template mode)
        if (problem := template_problem(tokenizer, self.styles)) is not None:  # one line now, not mid-episode
            raise ChatTemplateError(problem)
        self.name, self.model, self.tokenizer, self.trainable = name, model.eval(), tokenizer, trainable
        self.engine = engine or InProcessEngine()  # where the tokens are generated (trainers/engine)
        self.temperature, self.top_p = temperature, top_p
        self.generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)

    def act(self, requests: list[tuple[str, str, Task]], *, max_new_tokens: int, greedy: bool = False,
            keys: list[int] | None = None) -> Generation:
        """Sample (or, greedy, decode) one message per request, each prompt in its agent's style
        (trainers/policy/prompts.py: the chat template when the tokenizer has one); rows stop at any
        of the model's end tokens, which the texts do not contain. With `keys` (one `stream_key` per
        request) each message is drawn from its own keyed stream, so it does not depend on the batch;
        without, from the actor's seeded generator in call order. The actor's `engine` generates."""
        from trainers.policy.prompts import fit_turn_prompts, model_context, stop_token_ids
        from trainers.policy.generation import encode_prompts

        # each prompt within its agent's token limit (max_prompt_tokens, else the context minus max_tokens)
        prompts, cut = fit_turn_prompts(self.tokenizer, requests, self.styles, model_context(self.model))
        ids, mask = encode_prompts(self.tokenizer, prompts)
        # computed per call: `marl eval` swaps a checkpoint's model and tokenizer in after construction
        settings = SamplingSettings(max_new_tokens=max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                                    greedy=greedy, stop_ids=tuple(stop_token_ids(self.model, self.tokenizer)),
                                    pad_id=self.tokenizer.pad_token_id)
        completions = self.engine.generate(self.name, self.model, ids, mask, settings, keys, self.generator)
        return self._generation(completions, prompts, cut)

    def _generation(self, completions, prompts: list[str], cut: list[bool]) -> Generation:
        """The texts of a sampled batch, its rows' shared prompts and cuts recorded."""
        import torch

        from trainers.policy.prompts import decode_turns

        # rows that saw the same observation (the G episodes of a task at their first turn) share one
        # prompt: the packed training forward then runs that prompt once for all of them (exact)
        first_row: dict[str, int] = {}
        completions.prompt_index = torch.tensor([first_row.setdefault(p, row) for row, p in enumerate(prompts)])
        # rows whose prompt was cut to fit: the team trainer's truncation guard counts them
        completions.prompt_cut = torch.tensor(cut, dtype=torch.bool, device=completions.prompt_ids.device)
        return Generation(decode_turns(self.tokenizer, completions), completions)

    @property
    def batch_group(self):
        """Actors with equal groups can sample in one batch (`act_together`): LoRA adapters on one base,
        generating in-process with the same tokenizer and sampling settings; None: this actor samples alone."""
        owner = getattr(self.model, "owner", None)
        if owner is None or self.engine.kind != "inprocess":
            return None
        return id(owner), id(self.tokenizer), self.temperature, self.top_p

    def act_together(self, calls: list, *, max_new_tokens: int, greedy: bool = False) -> list[Generation]:
        """One batch for several actors of this `batch_group`: `calls` is [(actor, requests, keys)], keys
        one per request (rows must draw from their own streams, whichever batch they are in). Each row
        runs with its actor's adapter (peft's mixed-batch forward: the base's matmuls once for all); the
        result is each actor's Generation, as its own `act` would give it (tested: the same tokens)."""
        import torch

        from trainers.policy.prompts import fit_turn_prompts, model_context, stop_token_ids
        from trainers.policy.generation import encode_prompts, sample_completions, select_rows

        texts, cuts, names, spans = [], [], [], []
        for actor, requests, _ in calls:
            prompts, cut = fit_turn_prompts(actor.tokenizer, requests, actor.styles, model_context(actor.model))
            spans.append((len(texts), len(texts) + len(prompts)))
            texts, cuts, names = texts + prompts, cuts + list(cut), names + [actor.model.name] * len(prompts)
        ids, mask = encode_prompts(self.tokenizer, texts)
        keys = [key for _, _, actor_keys in calls for key in actor_keys]
        batch = sample_completions(self.model.peft_model.eval(), ids, mask, max_new_tokens=max_new_tokens,
                                   temperature=self.temperature, top_p=self.top_p, greedy=greedy,
                                   eos_token_id=stop_token_ids(self.model, self.tokenizer),
                                   pad_token_id=self.tokenizer.pad_token_id, row_keys=keys, adapter_names=names)
        return [actor._generation(select_rows(batch, torch.arange(start, end)), texts[start:end], cuts[start:end])
                for (actor, _, _), (start, end) in zip(calls, spans)]

    def message_probabilities(self, agent: str, observation: str, task: Task, messages: list[str], *,
                              max_new_tokens: int | None = None) -> list[float]:
        """The probability that the agent's next message is exactly each of `messages` when the actor
        samples: the product of the sampler's own next-token probabilities (at its temperature and top_p,
        `sampling_probabilities`) over the message's tokens, times the chance of stopping there (any of
        the model's stop tokens), from a forward pass over the turn's prompt rendered as when it acts.
        With `max_new_tokens`, a message of exactly that many tokens needs no stop token and a longer one
        cannot be said (0). What a game's evaluation needs to measure the mixed strategy a policy plays."""
        import torch

        from trainers.policy.prompts import fit_turn_prompts, model_context, stop_token_ids
        from trainers.policy.generation import sampling_probabilities

        prompt = fit_turn_prompts(self.tokenizer, [(agent, observation, task)], self.styles,
                                  model_context(self.model))[0][0]
        prompt_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        stops = stop_token_ids(self.model, self.tokenizer)  # a list of ids
        device = next(self.model.parameters()).device
        probabilities = []
        with torch.no_grad():
            for message in messages:
                answer = self.tokenizer(message, add_special_tokens=False)["input_ids"]
                if max_new_tokens is not None and len(answer) > max_new_tokens:
                    probabilities.append(0.0)
                    continue
                ids = torch.tensor([prompt_ids + answer], device=device)
                logits = self.model(input_ids=ids).logits[0, len(prompt_ids) - 1:]
                probs = sampling_probabilities(logits, self.temperature, self.top_p)
                chance = probs[:-1].gather(1, ids[0, len(prompt_ids):, None]).prod()
                if max_new_tokens is None or len(answer) < max_new_tokens:
                    chance = chance * probs[-1, stops].sum()
                probabilities.append(float(chance))
        return probabilities


class ScriptedActor:
    """A frozen `policy(agent, observation, task) -> text` (expert, null, random, module:function)."""

    trainable = False

    def __init__(self, name: str, policy):
        self.name, self.policy = name, policy

    def act(self, requests: list[tuple[str, str, Task]], *, max_new_tokens: int, greedy: bool = False,
            keys=None) -> Generation:
        """Call the policy once per request (`keys` are ignored: a scripted policy keeps its own seed)."""
        return Generation([str(self.policy(agent, observation, task)) for agent, observation, task in requests])


class EndpointActor:
    """A frozen policy behind an OpenAI-compatible endpoint (requests go out concurrently)."""

    trainable = False

    def __init__(self, name: str, backend, *, temperature: float = 1.0, seed: int = 0, styles: dict | None = None):
        self.name, self.backend, self.temperature, self.seed = name, backend, temperature, seed
        self.styles = dict(styles or {})  # agent -> TurnStyle: its role goes out as the system message
        self.requests = 0  # requests sent so far: sampled requests are seeded seed + their index
        self.failures = 0  # requests that failed (their agent said nothing)

    def act(self, requests: list[tuple[str, str, Task]], *, max_new_tokens: int, greedy: bool = False,
            keys: list[int] | None = None) -> Generation:
        """One chat completion per request (the agent's role as the system message, the observation as
        the user's); a failed request says nothing (and is counted). A sampled request is seeded with
        seed + its key when `keys` are given (the same wherever it is sent from), else seed + its index."""
        from trainers.policy.prompts import DEFAULT_STYLE, turn_messages

        first, self.requests = self.requests, self.requests + len(requests)
        chats = [ChatRequest(messages=tuple(turn_messages(observation, self.styles.get(agent, DEFAULT_STYLE))),
                             max_tokens=max_new_tokens, temperature=0.0 if greedy else self.temperature,
                             seed=self.seed if greedy else
                             (self.seed + keys[index]) % 2 ** 31 if keys is not None else self.seed + first + index)
                 for index, (agent, observation, _) in enumerate(requests)]
        responses = run_sync(self.backend.complete_many(chats))
        self.failures += sum(r.status not in ("ok", "truncated") for r in responses)
        return Generation([r.text if r.status in ("ok", "truncated") else "" for r in responses])


def actor_key(agent_spec) -> str:
    """The name of the actor that plays an agent: 'shared' or the agent's own name."""
    return "shared" if agent_spec.policy == "shared" else agent_spec.name


def build_actors(scenario, base_model_dir: Path | None, *, temperature: float = 1.0, top_p: float = 1.0,
                 seed: int = 0, log=print, lora=None, adapters: dict[str, Path] | None = None, device: str = "cpu",
                 dtype: str = "float32") -> tuple[dict, dict[str, str]]:
    """The actors of a scenario and which actor plays each agent (see the module docstring).

    The base model is loaded once; 'shared' agents use it, 'own' agents get deep copies. With `lora`
    (a LoraSpec: the run's train.lora) given, or `adapters` (actor key -> a saved adapter directory, as `marl eval`
    loads a LoRA checkpoint), 'shared' and each 'own' agent get a LoRA adapter of their own on the ONE
    frozen base instead (trainers/policy/adapters.py). An agent whose `trainable` is false freezes
    its actor (a frozen shared actor freezes every shared agent). Models are loaded straight onto
    `device` in `dtype` (resolved names, see trainers.policy.loading.placement), so LoRA adapters made
    on a low-precision base keep peft's float32 weights.
    """
    from trainers.policy.prompts import agent_styles
    from trainers.policy.tinylm import load_policy

    actors, seats, base = {}, {}, {}
    options = dict(temperature=temperature, top_p=top_p, styles=agent_styles(scenario.spec))
    for index, agent in enumerate(scenario.spec.agents):
        key = actor_key(agent)
        seats[agent.name] = key
        if key in actors:
            actors[key].trainable = actors[key].trainable and agent.trainable
            continue
        if agent.policy in ("shared", "own"):
            if not base:
                if base_model_dir is None:
                    raise ValueError("this scenario has model-played agents but no base model was given")
                base["model"], base["tokenizer"] = load_policy(base_model_dir, device=device, dtype=dtype)
            model = _base_policy(key, agent, base, base_model_dir, lora, adapters or {}, seed)
            actors[key] = ModelActor(key, model, base["tokenizer"], trainable=agent.trainable, seed=seed + index,
                                     **options)
        elif agent.policy.startswith("openai:"):
            actors[key] = EndpointActor(key, _endpoint_backend(agent), temperature=temperature, seed=seed,
                                        styles=options["styles"])
        elif agent.policy in SCRIPTED or ":" in agent.policy:
            from marl.policies import get_policy

            actors[key] = ScriptedActor(key, get_policy(agent.policy, scenario, seed=seed + index))
        else:
            model, tokenizer = load_policy(_model_directory(scenario, agent), device=device, dtype=dtype)
            actors[key] = ModelActor(key, model, tokenizer, trainable=agent.trainable, seed=seed + index, **options)
    for actor in actors.values():  # an adapter trains (requires_grad) only when its actor does
        if hasattr(getattr(actor, "model", None), "owner"):
            actor.model.trainable = actor.trainable
    return actors, seats


def _base_policy(key: str, agent, base: dict, base_model_dir: Path, lora, adapters: dict[str, Path], seed: int):
    """The model of a base-played actor: the base itself ('shared'), a deep copy ('own'), or, with LoRA,
    the actor's adapter on the one frozen base (a saved one from `adapters`, else a fresh one)."""
    if lora is None and not adapters:
        return base["model"] if agent.policy == "shared" else copy.deepcopy(base["model"])

    if "adapters" not in base:
        base["adapters"] = AdapterBase(base["model"], base_model_dir, base["tokenizer"], seed=seed)
    if key in adapters:
        return base["adapters"].load(key, adapters[key])
    if lora is None:  # a LoRA checkpoint without this actor: a fresh adapter plays the base exactly (B = 0)
        lora = LoraSpec()
    return base["adapters"].add(key, lora)


def _model_directory(scenario, agent) -> Path:
    path = Path(agent.policy)
    if not path.is_absolute():
        path = scenario.base_dir / path
    if not (path / "config.json").exists():
        raise ValueError(f"agent {agent.name!r}: policy {agent.policy!r} is not 'shared', 'own', a scripted policy "
                         f"(expert, null, random, module:function), 'openai:MODEL', or a Hugging Face model "
                         f"directory ({path} has no config.json)")

    problem = check_model_dir(path)  # a broken directory: one line now, not a traceback from the loader
    if problem is not None:
        raise ValueError(f"agent {agent.name!r}: policy {problem}")
    return path


def _endpoint_backend(agent):
    """The OpenAI-compatible backend of an endpoint agent (the key from `api_key_env`, if named)."""
    if agent.base_url is None:
        raise ValueError(f"agent {agent.name!r}: policy {agent.policy!r} needs base_url (the endpoint's URL)")
    if agent.api_key_env and agent.api_key_env not in os.environ:
        raise ValueError(f"agent {agent.name!r}: environment variable {agent.api_key_env} is not set")
    return OpenAIBackend(model=agent.policy.split(":", 1)[1], base_url=agent.base_url,
                         api_key_env=agent.api_key_env or "OPENAI_API_KEY")
