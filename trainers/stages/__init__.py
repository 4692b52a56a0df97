"""The stages of `marl run` around RL.

    warmup.py      the stage plan, and stage 1: SFT warm-up on the expert's demonstrations
    reflection.py  stage 3: retry low-pass-rate tasks with the failure reason
    safety.py      stage 4: an adversarial set with penalties for fabrication and unsafe tool use

May import: marl, judges.types (what a scorer is given), trainers.team, trainers.grpo, trainers.policy,
trainers.records.
"""
