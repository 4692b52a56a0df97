"""What a resumed run must share with the run that wrote its checkpoint: the scenario, as a fingerprint.

`resume_fingerprint(spec)` is the scenario as plain data minus what a resume may change (step counts,
threads, tracking, where episodes are played); a checkpoint records it, and `fingerprint_changes(saved,
spec)` lists what differs ('key.path: saved -> current'). Model directories are recorded by content, so a
run resumes after its base model moved and still refuses a different model at the old path.
"""

from __future__ import annotations

from pathlib import Path

from trainers.policy.adapters import base_fingerprint

STEP_KEYS = {("train", "steps"), ("train", "threads"), ("train", "checkpoint_every"), ("train", "eval_every"),
             ("train", "tracking"), ("train", "warmup", "rl_steps"), ("train", "reflection", "steps"),
             ("train", "safety", "steps"), ("train", "max_masked_fraction"),  # a stopped run may resume with a new limit
             ("train", "truncation_warn_fraction"), ("train", "tool_silence_steps"),  # warnings only
             # where episodes are played changes nothing (staleness 0): a run resumes on either backend
             ("train", "backend"), ("train", "ray", "address"), ("train", "ray", "rollout_workers"),
             ("train", "ray", "num_cpus"), ("train", "ray", "num_gpus"), ("train", "ray", "max_retries"),
             ("train", "ray", "object_store_mb")}


def resume_fingerprint(spec) -> dict:
    """The scenario as plain data, minus what a resumed run may change (step counts, threads, tracking).

    A model directory (train.model, an agent's own policy) is recorded by its content, not its path, so
    a run resumes after its base model moved (a new cache folder, another disk) and still refuses a
    different model at the old path.
    """
    data = spec.model_dump(mode="json")
    for path in STEP_KEYS:
        node = data
        for key in path[:-1]:
            node = node[key]
        node.pop(path[-1], None)
    data["train"]["model"] = model_identity(data["train"]["model"])
    for agent in data.get("agents", []):
        agent["policy"] = model_identity(agent["policy"])
    return data


def _identified(saved: dict) -> dict:
    """A saved fingerprint with its model directories as `model_identity`s (a checkpoint written before
    they were recorded by content holds their paths)."""
    if isinstance(saved.get("train"), dict) and isinstance(saved["train"].get("model"), str):
        saved["train"]["model"] = model_identity(saved["train"]["model"])
    for agent in saved.get("agents", []) if isinstance(saved.get("agents"), list) else []:
        if isinstance(agent, dict) and isinstance(agent.get("policy"), str):
            agent["policy"] = model_identity(agent["policy"])
    return saved


def model_identity(name: str) -> str:
    """'sha256:<config and weights>' of a model directory (trainers/policy/adapters.py:base_fingerprint);
    anything else ('tiny', 'shared', a scripted policy) as it is."""
    if name in ("tiny", "shared", "own") or ":" in name or not (Path(name).expanduser() / "config.json").is_file():
        return name

    return "sha256:" + base_fingerprint(Path(name).expanduser())


def _differences(saved, current, path: str = "") -> list[str]:
    """'key.path: saved -> current' for every leaf that differs. A key the checkpoint does not have is a
    setting added to marl since it was written (e.g. train.packing): not a change, so an upgrade can resume."""
    if isinstance(saved, dict) and isinstance(current, dict):
        return [line for key in sorted(set(saved) | set(current)) if key in saved
                for line in _differences(saved.get(key), current.get(key), f"{path}.{key}" if path else key)]
    return [] if saved == current else [f"{path}: {saved!r} -> {current!r}"]


def fingerprint_changes(saved: dict, spec) -> list[str]:
    """'key.path: saved -> current' for every setting a checkpoint's fingerprint `saved` holds that the
    scenario `spec` sets differently (settings added to marl since the checkpoint was written are not
    changes)."""
    return _differences(_identified(saved), resume_fingerprint(spec))
