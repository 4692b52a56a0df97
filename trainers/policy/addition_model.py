"""The tiny addition model: two-number addition ("12+35=" -> "47"), the model `marl demo` trains and
relay's agents play when train.model is 'tiny'.

    demo_policy(splits)        build (or load from the cache) the model: SFT on the split no RL or
                               evaluation prompt comes from, until its sampled accuracy on a probe is met
    chat_tasks / chat_splits   tasks with each prompt rendered as the model's turn, as marl renders it
    held_out_accuracy(...)     greedy and sampled accuracy on the held-out split (the TRL comparison's figure)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from marl.addition import AdditionSplits, addition_reward
from trainers.policy.tinylm import TinyLMRecipe, build_or_load_tiny_model

PROBE_SIZE = 256  # tasks of the RL split used to decide when SFT has warmed the model up enough


def demo_policy(splits: AdditionSplits, cache_dir: str | None = None, log=print) -> Path:
    """The tiny addition model, built on the SFT split (each problem a chat turn with no role, as
    relay's agents see theirs) and warmed up until its sampled accuracy on a probe of the RL split
    reaches the recipe's target."""
    from trainers.policy.accuracy import accuracy
    from trainers.policy.prompts import DEFAULT_STYLE

    demonstrations = [(task.prompt, task.answer, DEFAULT_STYLE) for task in splits.sft]
    probe = splits.train[:PROBE_SIZE]

    def probe_accuracy(model, tokenizer):
        return accuracy(model, tokenizer, chat_tasks(probe, tokenizer), addition_reward, greedy=False, samples=2, seed=1)

    return build_or_load_tiny_model(TinyLMRecipe(), demonstrations, probe_accuracy, cache_dir, log)


def chat_tasks(tasks, tokenizer) -> list:
    """The tasks with each prompt rendered as the model's turn (trainers/policy/prompts.py: the chat
    template when the tokenizer has one, else the problem itself), as every marl command renders it."""
    from trainers.policy.prompts import turn_prompt

    return [dataclasses.replace(task, prompt=turn_prompt(tokenizer, task.prompt)) for task in tasks]


def chat_splits(splits: AdditionSplits, tokenizer) -> AdditionSplits:
    """`chat_tasks` of every split."""
    return AdditionSplits(*(chat_tasks(part, tokenizer) for part in (splits.sft, splits.train, splits.eval)))


def held_out_accuracy(model, tokenizer, splits: AdditionSplits, samples: int, max_new_tokens: int) -> dict:
    """Greedy and sampled accuracy on the fixed evaluation split."""
    from trainers.policy.accuracy import accuracy

    greedy = accuracy(model, tokenizer, splits.eval, addition_reward, max_new_tokens=max_new_tokens)
    sampled = accuracy(model, tokenizer, splits.eval, addition_reward, greedy=False, samples=samples,
                       max_new_tokens=max_new_tokens, seed=1234)
    return {"greedy": greedy, "sampled": sampled}
