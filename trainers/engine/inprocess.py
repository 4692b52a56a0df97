"""The in-process engine: the KV-cache sampler (trainers/policy/generation.py) on this process's live weights.

Its samples come from the weights the learner updates in place, so they are never stale and its
logprobs are the trainer's own model's (`offpolicy` is False); `version` is left None (live).
"""

from __future__ import annotations

from collections.abc import Sequence

from trainers.engine.base import SamplingSettings


class InProcessEngine:
    """`RolloutEngine` over the live model: one batched `sample_completions` call per `generate`."""

    kind = "inprocess"
    offpolicy = False

    def generate(self, actor: str, policy, prompt_ids, prompt_mask, settings: SamplingSettings,
                 keys: Sequence[int] | None = None, generator=None):
        """One completion per prompt from `policy` (a model, or an AdapterPolicy: its adapter alone)."""
        from trainers.policy.generation import sample_completions

        return sample_completions(policy, prompt_ids, prompt_mask, group_size=1,
                                  max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                                  top_p=settings.top_p, greedy=settings.greedy, eos_token_id=list(settings.stop_ids),
                                  pad_token_id=settings.pad_id, generator=generator, row_keys=keys)

    def close(self) -> None:
        """Nothing is held."""
