"""trainers: the torch edge. The jobs sit on top, the library rooms below.

Jobs, read these first: `run.py` (`marl run`, a team on a scenario; its settings resolved once by
`config.py`), `demo.py` (`marl demo`: marl run on the one-agent addition scenario),
`estimate.py` (what a run would cost), `checkpoint_eval.py` (`marl eval`: a checkpoint's team on the
held-out set). Rooms:

    grpo/     the single-policy GRPO core: config, objective (advantages, loss), learner, safeguards
    policy/   models: the tiny default, GGUF files, sampling with a KV cache, actors (who speaks for an agent)
    engine/   rollout engines: in-process, or a vLLM-style server with versioned LoRA adapters (`marl serve`),
              and the sampler/trainer mismatch correction
    team/     the training step marl run executes (trainer.py: play -> score -> credit -> advantages ->
              update), self-play as a plug-in, team metrics and the held-out evaluation
    stages/   the step loop over the stages (loop.py), warm-up, reflection, safety
    reward/   reward models: preference pairs, Bradley-Terry training (`marl rm train`)
    ray/      the Ray backend: cluster connection, rollout workers, the player driving them, judge gates
    records/  what a run leaves on disk: run directories, checkpoints, their layout and manifests,
              tracking (the only wandb import), report, progress
    cli/      the `marl` command: main registers the commands, one module per command

Public names (imported on first use, so `import trainers` loads no torch): `run_scenario`, `RunOptions`
(what `marl run` runs), `resolve_config`, `TrainConfig`, `MultiAgentTrainer`, `StepPlan`, `GRPOConfig`,
`group_advantages`, `demo_options`, `run_demo`.

May import: common, marl, judges, and rooms here in the order cli -> jobs -> stages -> team -> grpo -> policy
-> records (never the other way); policy and engine use each other (an actor's engine, the engines' sampler)
at file level without a cycle. Heavy libraries (torch, transformers, wandb) are imported per module.
"""

from common.lazy import lazy_names  # the one eager import: a few lines, no library

_PUBLIC = {  # public name -> "module:attribute", imported on first use (PEP 562)
    "GRPOConfig": "trainers.grpo.config:GRPOConfig",
    "group_advantages": "trainers.grpo.objective:group_advantages",
    "demo_options": "trainers.demo:demo_options",
    "run_demo": "trainers.demo:run_demo",
    "RunOptions": "trainers.run:RunOptions",
    "run_scenario": "trainers.run:run_scenario",
    "resolve_config": "trainers.config:resolve_config",
    "TrainConfig": "trainers.config:TrainConfig",
    "MultiAgentTrainer": "trainers.team.trainer:MultiAgentTrainer",
    "StepPlan": "trainers.team.trainer:StepPlan",
}
__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_names(__name__, _PUBLIC, globals())
