"""trainers: the torch edge. The jobs sit on top, the library rooms below.

Jobs, read these first: `run.py` (`marl run`, a team on a scenario), `demo.py` (the addition demo),
`estimate.py` (what a run would cost), `evaluate.py` (`marl eval`: a checkpoint's team on the
held-out set). Rooms:

    grpo/     the single-policy GRPO core: config, objective (advantages, loss), learner, trainer, safeguards
    policy/   models: the tiny default, GGUF files, sampling with a KV cache, actors (who speaks for an agent)
    engine/   rollout engines: in-process, or a vLLM-style server with versioned LoRA adapters (`marl serve`),
              and the sampler/trainer mismatch correction
    team/     the multi-agent trainer (its StepResult), team metrics and the held-out evaluation
    stages/   warm-up (and the stage plan), reflection, safety
    reward/   reward models: preference pairs, Bradley-Terry training (`marl rm train`)
    ray/      the Ray backend: cluster connection, rollout workers, the player driving them, judge gates
    runs/     run directories, checkpoints, their layout and manifests, atomic writes, tracking (the only
              wandb import), report, progress
    cli/      the `marl` command: main registers the commands, one module per command

May import: marl, judges, and rooms here in the order cli -> jobs -> stages -> team -> grpo -> policy
-> runs (never the other way); policy and engine use each other (an actor's engine, the engines' sampler)
at file level without a cycle. Heavy libraries (torch, transformers, wandb) are imported per module.
"""
