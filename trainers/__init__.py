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
    runs/     run directories, checkpoints, their layout and manifests, tracking (the only
              wandb import), report, progress
    cli/      the `marl` command: main registers the commands, one module per command

Public names (imported on first use, so `import trainers` loads no torch): `GRPOConfig`, `GRPOTrainer`,
`group_advantages`, `demo_config`, `run_demo`.

May import: common, marl, judges, and rooms here in the order cli -> jobs -> stages -> team -> grpo -> policy
-> runs (never the other way); policy and engine use each other (an actor's engine, the engines' sampler)
at file level without a cycle. Heavy libraries (torch, transformers, wandb) are imported per module.
"""

_PUBLIC = {  # public name -> "module:attribute", imported on first use (PEP 562)
    "GRPOConfig": "trainers.grpo.config:GRPOConfig",
    "GRPOTrainer": "trainers.grpo.trainer:GRPOTrainer",
    "group_advantages": "trainers.grpo.objective:group_advantages",
    "demo_config": "trainers.demo:demo_config",
    "run_demo": "trainers.demo:run_demo",
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
