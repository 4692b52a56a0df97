"""Credit assignment: split a team's value among its agents (research/credit.md).

    estimators.py  Shapley, Myerson, Banzhaf, Owen, difference rewards: the public estimators
    exact.py       coalition values and exact credit from one table of all coalitions
    sampling.py    sampled estimators over one evaluation cache, and the `auto` choice
    coalitions.py  coalition values of a scenario: what the team earns when only some agents play
    replay.py      per-episode credit from counterfactual replays of a played batch

May import: marl's core nouns (types, rollout). Torch-free.
"""
