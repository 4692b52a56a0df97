"""Credit assignment: split a team's value among its agents (cooperative game theory; docs/credit.md).

    estimators.py  Shapley, Myerson, Banzhaf, Owen, difference rewards: the public estimators
    exact.py       coalition values and exact credit from one table of all coalitions
    montecarlo.py  sampled (Monte Carlo) estimators over one evaluation cache, and the `auto` choice
    coalitions.py  coalition values of a scenario: what the team earns when only some agents play
    replay.py      per-episode credit from counterfactual replays of a played batch; the figures logged
    explain.py     one episode's credit split told in words (a run report's credit section)

Public names (imported on first use): the estimators `shapley`, `banzhaf`, `owen`, `myerson`,
`difference_rewards`, `least_core`, and their result `CreditEstimate`.

May import: marl's core nouns (types, rollout). Torch-free.
"""

from common.lazy import lazy_names  # the one eager import: a few lines, no library

_PUBLIC = {  # public name -> "module:attribute", imported on first use (PEP 562)
    "shapley": "marl.credit.estimators:shapley",
    "banzhaf": "marl.credit.estimators:banzhaf",
    "owen": "marl.credit.estimators:owen",
    "myerson": "marl.credit.estimators:myerson",
    "difference_rewards": "marl.credit.estimators:difference_rewards",
    "least_core": "marl.credit.estimators:least_core",
    "CreditEstimate": "marl.credit.exact:CreditEstimate",
}
__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_names(__name__, _PUBLIC, globals())
