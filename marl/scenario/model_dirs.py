"""The model folders a scenario names, checked from their files' headers before anything loads them.

    model_dir_problems(scenario)   located Problems: train.model, each agent's model-folder policy, each local judge

`marl validate` runs these checks (common/model_files.py: torch-free, nothing unpickled or allocated), so a
folder with pickle-only weights, a truncated safetensors file, no tokenizer, or a FIFO or /dev/zero among its
files is one located line (`FILE:LINE:COL: train.model: ...`, or `FILE (--set train.model)`) rather than a
surprise when `marl run` loads it. The commands that load a model check the same folders when they load
them, adding the config-against-weights comparison that builds the model on torch's meta device (so
validate, which imports no torch, leaves that one to them).

Paths resolve as the commands that load them resolve them: train.model against the working directory (the
path a user types is the path used, trainers/run.py:base_model_dir), an agent's policy and a local judge's
model against the scenario's folder. A GGUF file or a packaged model's name is checked by its own reader at
load (marl/scenario/load.py), and 'tiny' is built, not read.
"""

from __future__ import annotations

from pathlib import Path

from common.model_files import model_folder_problem
from judges.model.gguf_source import is_gguf_source, local_model_path
from marl.scenario.problems import Problem, where

SCRIPTED = ("shared", "own", "expert", "null", "random")  # agent policies that are not a folder


def _named_folders(scenario) -> list[tuple[tuple, Path]]:
    """(key path, folder) of every local model folder the scenario names."""
    spec, base = scenario.spec, scenario.base_dir
    folders = []
    if spec.train.model != "tiny" and not is_gguf_source(spec.train.model):
        folders.append((("train", "model"), Path(spec.train.model).expanduser()))
    for index, agent in enumerate(spec.agents):
        if agent.policy not in SCRIPTED and ":" not in agent.policy:
            folders.append((("agents", index, "policy"), base / agent.policy))
    for index, judge in enumerate(spec.judges):
        if judge.backend == "local" and not is_gguf_source(judge.model):
            folders.append((("judges", index, "model"), Path(local_model_path(judge.model, base))))
    return folders


def model_dir_problems(scenario) -> list[Problem]:
    """A located Problem for each model folder of the scenario whose files cannot be loaded (module docstring)."""
    problems = []
    for path, folder in _named_folders(scenario):
        if (problem := model_folder_problem(folder)) is not None:
            problems.append(Problem(*where(path, scenario.positions, scenario.file, scenario.overridden), path,
                                    problem))
    return problems
