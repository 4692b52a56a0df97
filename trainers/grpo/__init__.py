"""The single-policy GRPO core (CleanRL style: read `trainer.py` top to bottom).

    config.py      GRPOConfig: every knob, one typed config (a scenario's `train` section sets it)
    objective.py   group advantages and the clipped policy loss, pure tensor functions (TRL-equal)
    learner.py     one trainable policy: optimizer, lr schedule, spike guard, KL reference, the update
    trainer.py     GRPOTrainer.step(): sample -> score -> safeguards -> advantages -> update
    safeguards.py  Self-BLEU, diversity penalty, difficulty buckets, floor reward (no torch)
    shared.py      what both trainers (this one and the team's) share: seeding, buckets, guard tally, state

Public names (imported on first use): `GRPOConfig`, `GRPOTrainer`, `group_advantages`, `policy_loss`,
`zero_std_group_fraction`.

May import: marl (types), trainers.policy, trainers.records.
"""

_PUBLIC = {  # public name -> "module:attribute", imported on first use (PEP 562)
    "GRPOConfig": "trainers.grpo.config:GRPOConfig",
    "GRPOTrainer": "trainers.grpo.trainer:GRPOTrainer",
    "group_advantages": "trainers.grpo.objective:group_advantages",
    "policy_loss": "trainers.grpo.objective:policy_loss",
    "zero_std_group_fraction": "trainers.grpo.objective:zero_std_group_fraction",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    """The public name `name`, imported from its module now: importing the package itself loads nothing."""
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module, _, attribute = _PUBLIC[name].partition(":")
    return getattr(importlib.import_module(module), attribute)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
