"""trainers: the torch edge (GRPO core, sampling, tiny model, checkpoints, CLI). Heavy imports are per module."""
