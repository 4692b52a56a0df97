"""The rollout-engine interface: token ids in; tokens, their logprobs and the policy version out.

An engine answers `generate(actor, policy, prompt_ids, prompt_mask, settings, keys)` with a
`trainers.policy.generation.Completions` batch (one row per prompt; row r answers prompt r), whose
`version` says which published weights sampled it. Two back-ends exist:

    InProcessEngine   (inprocess.py) samples with the live weights of this process: never off-policy
    HttpEngine        (http.py) asks a generation server; every trained adapter is published to it under
                      a name that holds its version (`adapter_name`), written once and never reused, so an
                      answer from other weights is impossible to mistake for the current ones: a reply that
                      names another adapter, or a server that lacks the asked one, is a StaleAdapterError

`offpolicy` says whether the engine's logprobs come from another forward than the trainer's (another
process, another kernel or precision): the learner then weighs every token by the truncated importance
ratio of the two (trainers/engine/correction.py, train.tis_cap).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

ENGINE_KINDS = ("inprocess", "http")


class EngineError(RuntimeError):
    """A generation server failed or answered something unusable (the message says which and how to fix it)."""


class StaleAdapterError(EngineError):
    """An answer would come, or came, from other adapter weights than the version a step asked for."""


@dataclass(frozen=True)
class SamplingSettings:
    """How one batch is generated: the same for every row of it."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False  # temperature 0: the argmax at every step
    stop_ids: tuple[int, ...] = ()  # a row ends at the first of these (kept in its tokens, masked in)
    pad_id: int = 0


class RolloutEngine(Protocol):
    """Where an actor's tokens come from (see the module docstring)."""

    kind: str
    offpolicy: bool

    def generate(self, actor: str, policy, prompt_ids, prompt_mask, settings: SamplingSettings,
                 keys: Sequence[int] | None = None, generator=None):
        """A Completions batch, one row per left-padded prompt, `version` set; `keys` (one `stream_key`
        per prompt) make each row's draws its own, whichever batch it is in."""

    def close(self) -> None:
        """Release what the engine holds (a server's loaded adapters, open connections)."""


def adapter_name(actor: str, tag: str, version: int) -> str:
    """The served name of an actor's adapter at a version: `<actor>-<tag>-v<version>`. `tag` is the
    engine's own (random, per run), so two runs on one server never share a name, and no name is ever
    loaded twice: the name alone says which weights answer."""
    return f"{actor}-{tag}-v{version}"
