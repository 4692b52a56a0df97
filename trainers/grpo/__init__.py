"""The single-policy GRPO core (CleanRL style: read `trainer.py` top to bottom).

    config.py      GRPOConfig: every knob, one typed config (a scenario's `train` section sets it)
    objective.py   group advantages and the clipped policy loss, pure tensor functions (TRL-equal)
    learner.py     one trainable policy: optimizer, lr schedule, spike guard, KL reference, the update
    trainer.py     GRPOTrainer.step(): sample -> score -> safeguards -> advantages -> update
    safeguards.py  Self-BLEU, diversity penalty, difficulty buckets, floor reward (no torch)
    shared.py      what both trainers (this one and the team's) share: seeding, buckets, guard tally, state
    evaluate.py    held-out accuracy of one policy at temperature 0

May import: marl (types), trainers.policy, trainers.runs.
"""
