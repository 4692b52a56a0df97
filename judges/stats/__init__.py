"""Statistics of judges: how much to trust them, and how to correct them.

    agreement.py    agreement between judges, humans and rule verifiers, with bootstrap CIs
    inference.py    exact binomial CIs, position-bias estimators, Dawid-Skene
    calibration.py  calibrators that turn a judge's raw output into P(good), bound to one judge
    probes.py       counterfactual probes: perturbations that leave quality unchanged
    bias_report.py  the bias report: a pairwise judge on items and probes, biases with CIs, grades

May import: common (atomic files), judges' top, judges.model (running a judge for the report) inside functions.
"""
