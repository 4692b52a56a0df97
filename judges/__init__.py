"""judges: everything that scores; imports neither marl nor trainers.

Top: `types.py` (the Scorer interface and Judgment), `imports.py` ('module:function' references),
`strict_json.py` (strict JSON and the atomic file writers every layer uses). Rooms:

    rules/   rule verifiers: registry, basic rules, patterns (RE2), SQL, code tests, the sandbox
    model/   model judges, prompts, backends (openai_backend: the only openai import; local; simulated),
             the response cache and the factory that builds a judge from a scenario's config
    stats/   agreement, inference, calibration, probes and the bias report

May import: nothing of marl or trainers. rules/ imports only the top; model/ and stats/ use each other (a calibrated judge, the bias report
running a judge) at function level, so no file imports one that imports it back.
"""
