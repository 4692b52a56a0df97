"""Held-out evaluation: accuracy of a policy on a fixed task set (greedy = temperature 0)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from marl.types import Task
from trainers.policy.prompts import stop_token_ids
from trainers.policy.generation import decode_completions, encode_prompts, sample_completions


@torch.no_grad()
def accuracy(model, tokenizer, tasks: Sequence[Task], reward_fn: Callable[[Task, str], float], *,
             greedy: bool = True, samples: int = 1, max_new_tokens: int = 8, temperature: float = 1.0,
             batch_size: int = 256, seed: int = 0) -> float:
    """Mean reward (1.0 = solved) over `tasks` x `samples`; greedy decoding when `greedy`.

    Sampled evaluation uses its own seeded generator, so it is reproducible and leaves the global
    RNG untouched.
    """
    if not tasks:
        raise ValueError("accuracy() needs at least one task")
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    total, count = 0.0, 0
    for start in range(0, len(tasks), batch_size):
        chunk = list(tasks[start:start + batch_size])
        ids, mask = encode_prompts(tokenizer, [t.prompt for t in chunk])
        out = sample_completions(model, ids, mask, group_size=1 if greedy else samples,
                                 max_new_tokens=max_new_tokens, temperature=temperature, greedy=greedy,
                                 eos_token_id=stop_token_ids(model, tokenizer), pad_token_id=tokenizer.pad_token_id,
                                 generator=generator)
        texts = decode_completions(tokenizer, out)
        group = 1 if greedy else samples
        for i, text in enumerate(texts):
            total += reward_fn(chunk[i // group], text)
            count += 1
    model.train(was_training)
    return total / count
