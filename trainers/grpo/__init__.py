"""The single-policy GRPO core: config, objective, learner and guards. The training step that uses it, read
top to bottom CleanRL style, is trainers/team/trainer.py (one trainer for one agent or a team).

    config.py      GRPOConfig: every knob, one typed config (a scenario's `train` section sets it)
    objective.py   group advantages and the clipped policy loss, pure tensor functions (TRL-equal)
    learner.py     one trainable policy: optimizer, lr schedule, spike guard, KL reference, the update
    safeguards.py  Self-BLEU, diversity penalty, difficulty buckets, floor reward (no torch)
    shared.py      the step's bookkeeping: seeding, buckets, guard tally, the core's saved state

Public names (imported on first use): `GRPOConfig`, `group_advantages`, `policy_loss`,
`zero_std_group_fraction`.

May import: marl (types), trainers.policy, trainers.records.
"""

_PUBLIC = {  # public name -> "module:attribute", imported on first use (PEP 562)
    "GRPOConfig": "trainers.grpo.config:GRPOConfig",
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
