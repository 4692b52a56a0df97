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

from common.lazy import lazy_names  # the one eager import: a few lines, no library

_PUBLIC = {  # public name -> "module:attribute", imported on first use (PEP 562)
    "GRPOConfig": "trainers.grpo.config:GRPOConfig",
    "group_advantages": "trainers.grpo.objective:group_advantages",
    "policy_loss": "trainers.grpo.objective:policy_loss",
    "zero_std_group_fraction": "trainers.grpo.objective:zero_std_group_fraction",
}
__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_names(__name__, _PUBLIC, globals())
