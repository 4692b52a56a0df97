"""`marl eval`'s work: a checkpoint's models in place of the base model, on the held-out set at temperature 0.

The checkpoint's `model/` plays every 'shared' agent and `model-<agent>/` the agent with that name
(the layout is read by trainers/records/layout.py); model agents the checkpoint has no directory for
play the base model (train.model). A LoRA checkpoint's directories are adapters: they go on the base
model (train.model), which must be the base they were trained on (else one line naming both). The
metrics are trainers/team/evaluation.py's.
"""

from __future__ import annotations

from pathlib import Path

from common.model_files import adapter_folder_problem, model_folder_problem
from marl.rollout import EpisodePlayer
from trainers.config import resolve_config
from trainers.policy.actors import SCRIPTED, build_actors
from trainers.policy.adapters import is_adapter_dir
from trainers.records.layout import checkpoint_models
from trainers.run import base_model_dir, check_context
from trainers.team.budgets import budget_curve
from trainers.team.evaluation import evaluate_scenario
from trainers.team.served import SERVED, MixturePlayer, ServedAverage


def load_actors(scenario, checkpoint: Path | None, cache_dir: str | None, log=print) -> tuple[dict, dict]:
    """The scenario's actors and seats, the checkpoint's models in place of the base (module docstring).

    CheckpointError when no model agent of the scenario is played by a model the checkpoint holds.
    """
    from trainers.policy.loading import ModelLoadError, place_autocast, placement
    from trainers.policy.tinylm import load_policy
    from trainers.policy.prompts import directory_context
    from trainers.records.checkpoint import CheckpointError

    if scenario.spec.train.engine.kind != "inprocess":
        log(f"train.engine.kind {scenario.spec.train.engine.kind} applies to marl run: this evaluation generates "
            "in-process")
    trained = checkpoint_models(checkpoint) if checkpoint is not None else {}
    for directory in trained.values():  # before any of their files is read (a FIFO config.json would hang it)
        problem = adapter_folder_problem(directory) if is_adapter_dir(directory) else model_folder_problem(directory)
        if problem is not None:
            raise ModelLoadError(problem)
    adapters = {key: directory for key, directory in trained.items() if is_adapter_dir(directory)}
    keys = {"shared" if a.policy == "shared" else a.name for a in scenario.spec.agents if _model_played(a)}
    if checkpoint is not None and not keys & set(trained):
        raise CheckpointError(f"--checkpoint {checkpoint}: no agent of {scenario.spec.name!r} is played by a model "
                              f"it holds (it has {', '.join(d.name + '/' for d in trained.values())}; agents: "
                              f"{', '.join(f'{a.name}={a.policy}' for a in scenario.spec.agents)})")
    on_base = {"shared" if a.policy == "shared" else a.name for a in scenario.spec.agents
               if a.policy in ("shared", "own")}  # actors build_actors makes from the base model
    base = None
    if adapters or on_base - set(trained):  # adapters go on the run's base model
        base = base_model_dir(scenario, cache_dir, log)
    elif on_base:  # every base-model actor is in the checkpoint: build from one of its models, not the base
        base = trained.get("shared", trained[min(on_base)])
    if base is not None:  # as `marl run` checks it: a prompt and answer past the model's context is one line
        check_context(scenario, directory_context(base))
    config = resolve_config(scenario)  # the scenario's settings, as marl run resolves them
    grpo = config.grpo
    device, dtype = placement(grpo.device, grpo.dtype, purpose="evaluate")
    actors, seats = build_actors(scenario, base, temperature=grpo.temperature, top_p=grpo.top_p, seed=grpo.seed,
                                 lora=config.lora, adapters={key: d for key, d in adapters.items() if key in on_base},
                                 device=device, dtype=dtype)
    for key, directory in trained.items():
        if key in adapters:
            continue  # loaded on the base by build_actors
        if key in actors and hasattr(actors[key], "model") and not (key == "shared" and directory == base):
            actors[key].model, actors[key].tokenizer = load_policy(directory, device=device, dtype=dtype)
    place_autocast(actors, grpo.dtype, device, log)  # evaluated in the precision it was trained in
    return actors, seats


def _model_played(agent) -> bool:
    return agent.policy in ("shared", "own") or not (agent.policy in SCRIPTED or ":" in agent.policy)


def served_player(player, actors: dict, checkpoint: Path | None):
    """(player, what it serves): with a checkpoint of a train.selfplay.converge: average run (its state.pt
    keeps the iterates' snapshots; the caller passes None for a cooperative scenario), a player whose
    learner plays the mixture of the run's iterates (the snapshots its state.pt keeps, one drawn per game,
    as the run's held-out figures played it: trainers/team/served.py), and "mixture of N iterates (steps
    0..T)"; else the player itself and "last iterate" (the checkpoint's own weights)."""
    from trainers.records.checkpoint import CheckpointError, read_state

    if checkpoint is None or SERVED not in actors or not hasattr(actors[SERVED], "model") \
            or not (Path(checkpoint) / "state.pt").exists():  # a folder of models only: nothing else to serve
        return player, "last iterate"
    state = read_state(checkpoint)
    pool = state.get("pool") if isinstance(state, dict) else None
    average = pool.get("average") if isinstance(pool, dict) else None
    if not average:
        return player, "last iterate"
    try:
        served = ServedAverage(actors[SERVED].model, int(average["every"]), int(average["seed"]))
        served.load_state_dict(average)
        live = set(actors[SERVED].model.state_dict())
        fits = all(set(entry["snapshot"]) == live for entry in average["entries"])
        step = int(state["step"])
    except (KeyError, TypeError, ValueError, AttributeError):
        fits = False
    if not fits:
        raise CheckpointError(f"checkpoint {checkpoint}: the iterates' snapshots in state.pt do not fit the "
                              "model it holds; pass --last-iterate to play its own weights")
    mixture = MixturePlayer(player, served, step)
    return mixture, f"mixture of {len(mixture.components)} iterates (steps 0..{step})"


def reseat(seats: dict[str, str], played_by: dict[str, str] | None) -> dict[str, str]:
    """Seats with each agent of `played_by` (agent -> other agent) played by the other agent's actor.

    The role-swap test: `{"left": "final", "final": "left"}` has each of the two roles played by the
    other's policy, while each seat keeps its own observation and role prompt. ValueError (one line)
    for a name that is not an agent of the scenario.
    """
    if not played_by:
        return dict(seats)
    for agent, other in played_by.items():
        for name in (agent, other):
            if name not in seats:
                raise ValueError(f"--seat {agent}={other}: {name!r} is not an agent of this scenario "
                                 f"(agents: {', '.join(seats)})")
    return {agent: seats[played_by.get(agent, agent)] for agent in seats}


def evaluate_checkpoint(scenario, tasks: list, checkpoint: Path | None, cache_dir: str | None, *, seed: int = 0,
                        credit: bool = True, retries: int = 1, played_by: dict[str, str] | None = None,
                        budgets: list[int] = (), last_iterate: bool = False) -> dict:
    """The held-out metrics of the checkpoint's team (the base model's for None), with the checkpoint named.

    A checkpoint of a run with train.selfplay.converge: average plays what that run served: the mixture of
    its iterates' snapshots, one drawn per game (`served_player`); `last_iterate` plays its own weights.

    `played_by` (agent -> other agent) reseats the team first (`reseat`: the role-swap test). With
    `budgets`, the result also holds `budget_curve`: the same team at each per-turn token budget
    (trainers/team/budgets.py).
    Raises RunError, CheckpointError, FileNotFoundError or ValueError for a model that cannot be built.
    """
    import torch

    torch.set_num_threads(scenario.spec.train.threads)
    actors, seats = load_actors(scenario, checkpoint, cache_dir)
    seats = reseat(seats, played_by)
    credit_spec = scenario.spec.credit
    default = scenario.resolve(credit_spec.default_policy) if credit_spec.default_policy else None
    player = EpisodePlayer(scenario, actors, seats, default_policy=default)
    # whether the run served an average is the checkpoint's to say (its run may have set it with --set):
    # only self-play's scenarios can have, so a cooperative checkpoint's state.pt is never read here
    served_from = checkpoint if not last_iterate and scenario.spec.mode != "cooperative" else None
    player, served = served_player(player, actors, served_from)
    result = evaluate_scenario(player, tasks, seed=seed, credit=credit, retries=retries)
    named = {"checkpoint": str(checkpoint) if checkpoint is not None else "base model",
             "played_by": dict(played_by or {}), "served": served}
    if budgets:
        named["budget_curve"] = {**budget_curve(player, tasks, budgets, seed=seed), **named}
    return {**result, **named}
