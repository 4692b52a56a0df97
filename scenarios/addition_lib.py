"""Tasks and the expert of the addition scenario (`marl demo`)."""

from __future__ import annotations

from marl.addition import addition_splits


def generate_tasks(seed: int, count: int) -> list[dict]:
    """The demo's RL split, then its held-out split (addition_splits: `seed` shuffles every pair in
    [10, 99]^2); `count` must be their total, so that the scenario's eval_count holds out exactly the
    held-out split."""
    splits = addition_splits(seed=seed)
    tasks = splits.train + splits.eval
    if count != len(tasks):
        raise ValueError(f"tasks.count must be {len(tasks)} (the demo's {len(splits.train)} RL and "
                         f"{len(splits.eval)} held-out tasks), got {count}")
    return [{"id": task.id, "prompt": task.prompt, "answer": task.answer, "metadata": dict(task.metadata),
             "difficulty": task.difficulty} for task in tasks]


def expert(agent: str, observation: str, task) -> str:
    """The sum."""
    return task.answer or ""
