"""judges: everything that scores; imports neither marl nor trainers.

Top: `types.py` (the Scorer interface and Judgment), `strict_json.py` (strict JSON: no NaN or
Infinity). Atomic files, 'module:function' references and chat rendering live in common/. Rooms:

    rules/   rule verifiers: registry, basic rules, patterns (RE2), SQL, code tests, the sandbox
    model/   model judges, prompts, backends (openai_backend: the only openai import; local; simulated),
             the response cache and the factory that builds a judge from a scenario's config
    stats/   agreement, inference, calibration, probes and the bias report

`workflows.py` holds the bias report and calibration as functions (`marl judges` only calls them).
Public names (imported on first use): the workflows `report`, `calibrate`, `read_items`, `write_report`,
`simulated_judge`, `CalibrationResult`, `WorkflowError`, `ReportItem`; `build_judge` (a judge from a
scenario's config), `PairwiseJudge`, and the nouns `Item`, `Candidate`, `Judgment`.

May import: common; nothing of marl or trainers. rules/ imports only the top; model/ and stats/ use each other (a calibrated judge, the bias report
running a judge) at function level, so no file imports one that imports it back.
"""

from common.lazy import lazy_names  # the one eager import: a few lines, no library

_PUBLIC = {  # public name -> "module:attribute", imported on first use (PEP 562)
    "report": "judges.workflows:report",
    "calibrate": "judges.workflows:calibrate",
    "read_items": "judges.workflows:read_items",
    "write_report": "judges.workflows:write_report",
    "simulated_judge": "judges.workflows:simulated_judge",
    "CalibrationResult": "judges.workflows:CalibrationResult",
    "WorkflowError": "judges.workflows:WorkflowError",
    "ReportItem": "judges.stats.bias_report:ReportItem",
    "build_judge": "judges.model.factory:build_judge",
    "PairwiseJudge": "judges.model.prompted:PairwiseJudge",
    "Item": "judges.types:Item",
    "Candidate": "judges.types:Candidate",
    "Judgment": "judges.types:Judgment",
}
__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_names(__name__, _PUBLIC, globals())
