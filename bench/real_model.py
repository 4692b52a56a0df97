"""Real-model benches on SmolLM2-135M-Instruct: a small judge with signal, then its bias (`judge`); a team of
real LLM agents that learns on a CPU (`team`).

Run from a checkout:
    python bench/real_model.py --part judge      # the full judge part on the CPU (about an hour on one thread)
    python bench/real_model.py --quick           # every part, tiny: the test suite's mode (well under a minute)

Judge part. Data: examples/judge_pairs/make_pairs.py (seeded): 400 short questions (arithmetic, unit
conversions, facts, Python output) with one correct and one subtly wrong answer, in styles drawn so that
neither length nor markdown says which is right; 200 train pairs, 200 held-out items with the correct
answer first in exactly half. Judges, both from `marl rm train` on SmolLM2-135M-Instruct (the packaged
GGUF, converted once): the trained one (LoRA, merged) and the untrained baseline (`--epochs 0`: the
same base and seeded head, no step). Each is probed with `marl judges report` on the held-out items.
Calibration: `marl judges calibrate` (Platt, pointwise scores, as a scenario would use the reward model)
on the held-out items, then the report again through the calibrated judge (pairwise P = sigmoid of the
calibrated logit difference); the calibration figures (ECE, Brier, accuracy at 0.5 of the pointwise
scores) are cross-fitted: a Platt fit on one seeded half of the held-out items scores the other half.
Also measured on the held-out items themselves: the flip rate when the two candidates are swapped, and
how often the judge picks the long-style or the markdown answer where exactly one is (balanced against
correctness by the design, so 0.5 is no preference). Accuracy CIs are Clopper-Pearson (exact).

Every command is run in this process through marl's CLI entry (`trainers.cli.main.main`) and printed
as the `marl ...` line that reproduces it. Training time is wall seconds and this process's CPU seconds
(all threads) around `marl rm train`. The last line, `ratio: ...`, is the trained judge's held-out
accuracy over the untrained baseline's (the anchor, measured in this run on the same items).

Team part. `marl run shop` (scenarios/shop.yaml: a clerk reads a price list and says one price, a cashier
multiplies it by the quantity; SmolLM2 with one LoRA adapter per role on one shared base, Shapley credit,
warm-up SFT on the expert's demonstrations, then GRPO) for each of --team-seeds, and the same seed with the
warm-up alone (`train.stages=[warmup]`, with its one low-lr RL check step), so that what RL adds is told apart from what SFT gives. Figures:
held-out team success and each agent's well-formed rate (a bare number) at temperature 0 on the
scenario's 200 held-out tasks, before and after; wall and CPU seconds of each run (CPU: this process, all
threads). The last line's ratio is the CPU seconds of warm-up + RL over the warm-up alone (the success comparison
is printed on the line before it: the anchor's success may be 0).

`--quick` runs the same steps on the benches' tiny random Qwen2 model (bench/support/real_model.py) with
24 + 24 pairs, one epoch and 8 probes per kind: it checks the plumbing, its figures mean nothing.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SMOLLM2 = "smollm2-135m-instruct"
PAIRS_SCRIPT = ROOT / "examples" / "judge_pairs" / "make_pairs.py"


def load_pair_maker():
    """examples/judge_pairs/make_pairs.py, imported by path (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("make_pairs", PAIRS_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def marl(argv: list[str]) -> float:
    """Run `marl ARGV` in this process (marl's CLI entry), print the command; its wall seconds. A non-zero
    exit stops the bench (SystemExit with the command)."""
    from trainers.cli.main import main

    print("$ marl " + " ".join(_quote(a) for a in argv), flush=True)
    started = time.perf_counter()
    code = main(argv)
    if code != 0:
        raise SystemExit(f"marl {' '.join(argv)} exited {code}")
    return time.perf_counter() - started


def _quote(text: str) -> str:
    return text if text and all(c.isalnum() or c in "-_./=:" for c in text) else repr(text)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


# -- figures ---------------------------------------------------------------------------------------------------
def rate(successes: int, trials: int) -> dict:
    """{estimate, ci_low, ci_high, n}: a rate with its exact (Clopper-Pearson) 95% CI."""
    from judges.stats.inference import clopper_pearson

    if trials == 0:
        return {"estimate": None, "ci_low": None, "ci_high": None, "n": 0}
    estimate = clopper_pearson(successes, trials)
    return {"estimate": estimate.estimate, "ci_low": estimate.ci_low, "ci_high": estimate.ci_high, "n": trials}


def show(value) -> str:
    """`0.550 [0.478, 0.620]` for an estimate with a CI, a plain number, or `-`."""
    def number(x):
        return f"{x:.3f}" if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else "-"

    if isinstance(value, dict):
        if value.get("estimate") is None:
            return "-"
        return f"{number(value['estimate'])} [{number(value['ci_low'])}, {number(value['ci_high'])}]"
    return number(value)


def rewards_of(judge, items) -> list[tuple[float, float]]:
    """(reward of candidate 0, reward of candidate 1) per held-out item."""
    return [tuple(judge.raw_rewards(item["prompt"], item["candidates"])) for item in items]


def held_out_figures(judge, items, prefer=None) -> dict:
    """Accuracy, the swapped-pair flip rate and the natural length / format preferences on the held-out items.
    `prefer(item, rewards)` -> index the judge picks (default: the higher reward; a tie picks neither)."""
    from judges.model.backend import run_sync
    from judges.types import Candidate, Item

    async def both_orders():
        import asyncio

        calls = []
        for item in items:
            a, b = (Candidate(text) for text in item["candidates"])
            calls += [judge.compare(Item(prompt=item["prompt"]), a, b), judge.compare(Item(prompt=item["prompt"]), b, a)]
        return await asyncio.gather(*calls)

    pairs = run_sync(both_orders())
    picks, flips = [], 0
    for index, item in enumerate(items):
        forward, swapped = pairs[2 * index], pairs[2 * index + 1]
        first = {"a": 0, "b": 1}.get(forward.verdicts[0] if forward.verdicts else None)
        second = {"a": 1, "b": 0}.get(swapped.verdicts[0] if swapped.verdicts else None)  # back in item order
        flips += first != second
        picks.append(first)
    right = sum(p == item["gold"] for p, item in zip(picks, items))
    long_items = [(p, item) for p, item in zip(picks, items) if item["length"] in ("correct", "wrong")]
    md_items = [(p, item) for p, item in zip(picks, items) if item["format"] in ("correct", "wrong")]

    def picked_styled(p, item, key):  # the judge picked the candidate that has the style (long, markdown)
        styled = item["gold"] if item[key] == "correct" else 1 - item["gold"]
        return p == styled

    kinds = sorted({item["kind"] for item in items})
    return {"accuracy": rate(right, len(items)), "flip_rate": rate(flips, len(items)),
            "prefers_long": rate(sum(picked_styled(p, i, "length") for p, i in long_items), len(long_items)),
            "prefers_markdown": rate(sum(picked_styled(p, i, "format") for p, i in md_items), len(md_items)),
            "by_kind": {kind: rate(sum(p == i["gold"] for p, i in zip(picks, items) if i["kind"] == kind),
                                   sum(i["kind"] == kind for i in items)) for kind in kinds},
            "undecided": sum(p is None for p in picks)}


def pointwise_rows(judge, items) -> tuple:
    """(scores, gold) arrays: each held-out answer's [0, 1] score and whether it is the correct one (the rows
    `marl judges calibrate --reward-model` fits), in item order, two per item."""
    import numpy as np

    from judges.types import Candidate, Item

    scores, gold = [], []
    for item in items:
        for index, judgment in enumerate(judge.score(Item(prompt=item["prompt"]), [Candidate(c) for c in item["candidates"]])):
            scores.append(judgment.score)
            gold.append(float(index == item["gold"]))
    return np.clip(np.array(scores, dtype=float), 1e-4, 1 - 1e-4), np.array(gold)


def cross_fitted_calibration(judge, items, seed: int) -> dict:
    """Pointwise ECE, Brier and accuracy at 0.5, raw and after Platt fitted on the other seeded half of the
    items (each half scored by the fit on the other: out of sample)."""
    import numpy as np

    from judges.stats.calibration import PlattCalibrator
    from judges.stats.inference import brier_score, expected_calibration_error

    scores, gold = pointwise_rows(judge, items)
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    halves = [sorted(order[: len(order) // 2]), sorted(order[len(order) // 2:])]
    rows = [[2 * i, 2 * i + 1] for i in range(len(items))]
    calibrated = np.empty_like(scores)
    slopes = []
    for fit_half, apply_half in ((halves[0], halves[1]), (halves[1], halves[0])):
        fit_rows = [r for i in fit_half for r in rows[i]]
        apply_rows = [r for i in apply_half for r in rows[i]]
        calibrator = PlattCalibrator().fit(scores[fit_rows], gold[fit_rows], judge_id=judge.identity)
        calibrated[apply_rows] = calibrator.apply(scores[apply_rows], judge_id=judge.identity)
        slopes.append(calibrator.slope)
    correct = lambda p: rate(int(((p > 0.5) == (gold == 1)).sum()), len(gold))  # noqa: E731
    return {"raw": {"ece": expected_calibration_error(scores, gold), "brier": brier_score(scores, gold),
                    "accuracy_at_half": correct(scores)},
            "calibrated": {"ece": expected_calibration_error(calibrated, gold), "brier": brier_score(calibrated, gold),
                           "accuracy_at_half": correct(calibrated)},
            "platt_slopes": slopes}


class CalibratedPairwise:
    """A reward-model judge seen through a calibrator of its pointwise scores: P(a better) = sigmoid(logit
    q_a - logit q_b), q the calibrated scores (for Platt: the reward difference times the slope). Its
    verdict follows that probability; both orders agree, as the reward model's."""

    orders = "both"

    def __init__(self, judge, calibrator):
        self.judge, self.calibrator = judge, calibrator
        self.identity = f"calibrated({calibrator.kind})|{judge.identity}"

    async def compare(self, item, a, b):
        import numpy as np

        from judges.model.prompted import PairJudgment
        from judges.stats.inference import logit, sigmoid

        scored = await self.judge.ascore(item, [a, b])
        if not all(j.ok for j in scored):
            bad = next(j for j in scored if not j.ok)
            return PairJudgment(None, (), None, bad.status, bad.rationale)
        raw = np.clip(np.array([j.score for j in scored]), 1e-4, 1 - 1e-4)  # as `marl judges calibrate` fits
        q = self.calibrator.apply(raw, judge_id=self.judge.identity)
        p_a = float(sigmoid(logit(q[0]) - logit(q[1])))
        verdict = "a" if p_a > 0.5 else "b" if p_a < 0.5 else "tie"
        return PairJudgment(p_a, (verdict, verdict), True, "ok", rationale=f"calibrated P(a) {p_a:.4g}",
                            slot1_probabilities=(p_a, 1.0 - p_a))


def report_row(report: dict, section: str, name: str):
    value = (report.get(section) or {}).get(name)
    return value if isinstance(value, dict) else None


def reusable(directory: Path, args, epochs: int) -> bool:
    """A reward model --reuse may keep: written by `marl rm train` with these settings (the pairs file is
    checked by the caller, byte for byte)."""
    try:
        settings = json.loads((directory / "marl_reward_model.json").read_text())["settings"]
    except (OSError, ValueError, KeyError):
        return False
    wanted = {"epochs": epochs, "lr": args.lr, "lora_r": args.lora_r, "batch_size": args.batch_size, "seed": args.seed,
              "eval_fraction": 0.0}
    return all(settings.get(key) == value for key, value in wanted.items())


# -- the judge part --------------------------------------------------------------------------------------------
def judge_part(args, work: Path) -> dict:
    """Train, probe and calibrate the judge (see the module doc); print its table; return its figures."""
    import resource

    import torch

    from judges.model.reward_model import RewardModelJudge
    from judges.stats.bias_report import ReportItem, run_bias_report
    from judges.stats.calibration import Calibrator

    work.mkdir(parents=True, exist_ok=True)
    maker = load_pair_maker()
    train_rows, heldout = maker.make_pairs(args.pair_seed)
    if args.extra_train:  # more questions of the three generated kinds, none of the 400 (a data-size experiment)
        train_rows = train_rows + maker.extra_train_pairs(args.extra_train, args.pair_seed)
    if args.quick:
        train_rows, heldout = train_rows[:24], heldout[:24]
    if args.quick:
        from support.real_model import build_model_dir

        cache = Path(os.environ.get("MARL_CACHE", Path.home() / ".cache" / "marl")) / "bench"
        base, base_name = str(build_model_dir("tiny", cache / "qwen2-tiny")), "the benches' tiny random Qwen2"
    else:
        base, base_name = SMOLLM2, "SmolLM2-135M-Instruct (packaged GGUF, converted once)"
    earlier = (work / "train.jsonl").read_bytes() if (work / "train.jsonl").is_file() else None
    train_file = write_jsonl(work / "train.jsonl", [{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in train_rows])
    same_pairs = earlier == train_file.read_bytes()
    items_file = write_jsonl(work / "heldout.jsonl", heldout)
    golds = [item["gold"] for item in heldout]
    print(f"judge part: base {base_name}; pairs {PAIRS_SCRIPT.relative_to(ROOT)} seed {args.pair_seed}: "
          f"{len(train_rows)} train" + (f" ({args.extra_train} of them extra_train_pairs)" if args.extra_train else "")
          + f", {len(heldout)} held out (correct first in {golds.count(0)}); LoRA r {args.lora_r}, "
          f"lr {args.lr:g}, {args.epochs} epoch(s), batch {args.batch_size} pairs, training seed {args.seed}; probes "
          f"{args.per_kind} per kind, probe seed {args.seed}; calibration cross-fit seed {args.seed}; "
          f"{args.threads} torch thread(s)")
    common = ["--pairs", str(train_file), "--base", base, "--batch-size", str(args.batch_size), "--eval-fraction", "0",
              "--seed", str(args.seed), "--threads", str(args.threads), "--tracker", "none", "--lora-r", str(args.lora_r),
              "--lr", f"{args.lr:g}", "--overwrite"]
    trained_dir, untrained_dir = work / "rm-trained", work / "rm-untrained"
    wall = cpu = None
    if args.reuse and same_pairs and reusable(trained_dir, args, args.epochs):
        print(f"reusing {trained_dir} (--reuse: trained earlier on these pairs with these settings)")
    else:
        cpu_before, wall_before = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        marl(["rm", "train", *common, "--out", str(trained_dir), "--epochs", str(args.epochs), "--log-every", "5"])
        wall = time.perf_counter() - wall_before
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    record = json.loads((trained_dir / "marl_reward_model.json").read_text())
    if args.reuse and same_pairs and reusable(untrained_dir, args, 0):
        print(f"reusing {untrained_dir}")
    else:
        marl(["rm", "train", *common, "--out", str(untrained_dir), "--epochs", "0"])
    torch.set_num_threads(args.threads)  # the judges below score in this process too
    reports = {}
    for name, directory in (("untrained", untrained_dir), ("trained", trained_dir)):
        marl(["judges", "report", "--items", str(items_file), "--reward-model", str(directory), "--out",
              str(work / f"report-{name}.json"), "--per-kind", str(args.per_kind), "--seed", str(args.seed)])
        reports[name] = json.loads((work / f"report-{name}.json").read_text())
    calibration_file = work / "calibration-trained.json"
    marl(["judges", "calibrate", "--items", str(items_file), "--reward-model", str(trained_dir), "--out",
          str(calibration_file), "--method", "platt"])

    figures, judges = {}, {}
    for name, directory in (("untrained", untrained_dir), ("trained", trained_dir)):
        judges[name] = RewardModelJudge.load(directory)
        figures[name] = held_out_figures(judges[name], heldout)
    calibrator = Calibrator.load(calibration_file)
    calibrated_judge = CalibratedPairwise(judges["trained"], calibrator)
    figures["calibrated"] = held_out_figures(calibrated_judge, heldout)
    report_items = [ReportItem(id=i["id"], prompt=i["prompt"], candidates=tuple(i["candidates"]), gold=i["gold"])
                    for i in heldout]
    reports["calibrated"] = run_bias_report(calibrated_judge, report_items, per_kind=args.per_kind, seed=args.seed)
    calibration = cross_fitted_calibration(judges["trained"], heldout, args.seed)

    columns = ("untrained", "trained", "calibrated")
    rows = [("held-out accuracy [95% CI]", lambda c: figures[c]["accuracy"])]
    rows += [(f"  accuracy, {kind}", lambda c, kind=kind: figures[c]["by_kind"][kind])
             for kind in figures["trained"]["by_kind"]]
    rows += [("flip rate, candidates swapped", lambda c: figures[c]["flip_rate"]),
             ("picks the long answer (n where one is)", lambda c: figures[c]["prefers_long"]),
             ("picks the markdown one (n where one is)", lambda c: figures[c]["prefers_markdown"]),
             ("report: position log-odds (see below)", lambda c: report_row(reports[c], "position", "log_odds")),
             ("report: length slope (logit)", lambda c: report_row(reports[c], "length", "slope")),
             ("report: format effect (logit)", lambda c: report_row(reports[c], "format", "effect")),
             ("report: authority effect (logit)", lambda c: report_row(reports[c], "authority", "effect")),
             ("report: master-key FPR", lambda c: report_row(reports[c], "master_key", "fpr")),
             ("report: null-answer win rate", lambda c: report_row(reports[c], "null_answer", "win_rate")),
             ("report: injection success", lambda c: report_row(reports[c], "injection", "success_rate"))]
    width = 42
    print(f"\nheld-out table ({len(heldout)} items; calibrated = Platt from `marl judges calibrate` on these items)")
    print(f"{'quantity':<{width}}" + "".join(f"{c:>26}" for c in columns))
    for label, get in rows:
        print(f"{label:<{width}}" + "".join(f"{show(get(c)):>26}" for c in columns))
    for name in columns:
        report = reports[name]
        verdicts = ", ".join(f"{k} {v}" for k, v in report.get("verdicts", {}).items())
        statement = (report.get("accuracy") or {}).get("statement")
        print(f"report verdicts, {name}: {verdicts}" + (f"\n  report's accuracy line: {statement}" if statement else ""))
    print("position: a reward model scores each answer alone, so both orders always agree (flip rate 0 by "
          "construction); the report's position CI then comes from zero counts and bounds nothing")
    print(f"Platt (marl judges calibrate, on the held-out items): slope {calibrator.slope:.3f}, intercept "
          f"{calibrator.intercept:.3f}; pairwise accuracy and flip rate cannot move under a monotone map with a "
          "positive slope, the logit effects scale by the slope")
    print(f"pointwise calibration, cross-fitted on two seeded halves (Platt slopes "
          f"{', '.join(f'{s:.3f}' for s in calibration['platt_slopes'])}):")
    for name in ("raw", "calibrated"):
        part = calibration[name]
        print(f"  {name:<11} ECE {part['ece']:.3f}  Brier {part['brier']:.3f}  accuracy at 0.5 "
              f"{show(part['accuracy_at_half'])} (n={part['accuracy_at_half']['n']} answers)")
    held = record.get("held_out") or {}
    timed = (f"wall {wall:.1f} s, CPU {cpu:.1f} s (this process, all threads)" if wall is not None else
             "reused, not timed in this run")
    print(f"training (marl rm train, {record['steps']} steps): {timed}; {record['seconds_per_epoch']:.1f} s/epoch "
          "(its record)" + (f"; its own held-out {held}" if held else ""))
    return {"figures": figures, "reports": reports, "calibration": calibration, "train_wall_s": wall,
            "train_cpu_s": cpu}


# -- the team part ---------------------------------------------------------------------------------------------
TEAM_SCENARIO = "shop"
QUICK_TEAM_SETS = ["train.steps=2", "train.prompts_per_step=2", "train.group_size=2", "train.eval_tasks=6",
                   "train.warmup.sft_max_steps=2", "train.warmup.sft_batch_size=2", "train.warmup.probe_tasks=2",
                   "train.checkpoint_every=100"]


def run_team(out: Path, seed: int, sets: list[str]) -> dict:
    """`marl run shop` with `sets` in this process: its before/after figures, wall and CPU seconds."""
    argv = ["run", TEAM_SCENARIO, "--set", f"train.seed={seed}", "--tracker", "none", "--out", str(out)]
    for setting in sets:
        argv += ["--set", setting]
    cpu = time.process_time()
    wall = marl(argv)
    cpu = time.process_time() - cpu
    before, after = (json.loads((out / f"{name}.json").read_text()) for name in ("before", "after"))
    return {"before": before, "after": after, "wall_s": wall, "cpu_s": cpu}


def team_part(args, work: Path) -> dict:
    """Item 3 of the real-model bench: the shop team (SmolLM2, one LoRA adapter per role, Shapley credit)
    trained with `marl run shop` per seed, and the same seed's warm-up alone (`train.stages=[warmup]`), so
    what RL adds is told apart from what SFT on the expert's demonstrations gives; held-out figures at
    temperature 0 on the scenario's 200 held-out tasks, team success and each agent's well-formed rate."""
    work.mkdir(parents=True, exist_ok=True)
    sets = list(QUICK_TEAM_SETS) if args.quick else []
    if args.quick:
        from support.real_model import build_model_dir

        sets.append(f"train.model={build_model_dir('tiny', work / 'tiny-model')}")
    sets += [f"train.threads={args.team_threads}"]
    print(f"team part: marl run {TEAM_SCENARIO} (scenarios/{TEAM_SCENARIO}.yaml as committed), seeds "
          f"{args.team_seeds}, settings {sets or 'none'}", flush=True)
    rows = []
    for seed in args.team_seeds:
        full = run_team(work / f"s{seed}", seed, sets)
        # the warm-up stage with one low-lr RL check step (train.warmup.rl_steps=1, lr x rl_lr_scale): a run
        # needs at least one step, and the stage's own check is the nearest thing to the warm-up alone
        warm = run_team(work / f"s{seed}-warmup", seed, [*sets, "train.stages=[warmup]", "train.warmup.rl_steps=1"])
        rows.append({"seed": seed, "full": full, "warmup_only": warm})
    print_team_table(rows)
    return {"scenario": TEAM_SCENARIO, "settings": sets, "rows": rows}


def _figure(figures: dict, key: str) -> str:
    value = figures.get(key)
    return "-" if value is None else f"{value:.3f}"


def print_team_table(rows: list[dict]) -> None:
    """One line per seed: team success and well-formed rate before, after the warm-up alone, after RL."""
    print("| seed | success before | after warm-up | after warm-up + RL | well formed before | after warm-up | "
          "after warm-up + RL | clerk / cashier well formed after | wall s (warm-up + RL) | CPU s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        full, warm = row["full"], row["warmup_only"]
        print(f"| {row['seed']} | {_figure(full['before'], 'team_success')} | {_figure(warm['after'], 'team_success')} "
              f"| {_figure(full['after'], 'team_success')} | {_figure(full['before'], 'well_formed')} | "
              f"{_figure(warm['after'], 'well_formed')} | {_figure(full['after'], 'well_formed')} | "
              f"{_figure(full['after'], 'well_formed/clerk')} / {_figure(full['after'], 'well_formed/cashier')} | "
              f"{full['wall_s']:.0f} | {full['cpu_s']:.0f} |")


def team_ratio_line(team: dict) -> str:
    """The success comparison, then `ratio:` the CPU seconds of warm-up + RL over the warm-up alone (the
    anchor, same seeds, same run): what the RL steps cost on top of the warm-up. The success ratio is not
    the ratio line because the anchor's success may be 0 (it is with --quick's random model)."""
    rows = team["rows"]
    after = sum(r["full"]["after"].get("team_success", 0.0) for r in rows) / len(rows)
    anchor = sum(r["warmup_only"]["after"].get("team_success", 0.0) for r in rows) / len(rows)
    cost = sum(r["full"]["cpu_s"] for r in rows) / sum(r["warmup_only"]["cpu_s"] for r in rows)
    return (f"team success (mean over seeds): {after:.3f} after warm-up + RL, {anchor:.3f} after the warm-up alone "
            f"(change {after - anchor:+.3f})\n"
            f"ratio: {cost:.3f} (CPU seconds of warm-up + RL over the warm-up alone; anchor: the same seeds with "
            "train.stages=[warmup] and one low-lr check step, measured in this run)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("judge", "team", "all"), default="all")
    parser.add_argument("--quick", action="store_true", help="the tiny fixture model, 24 + 24 pairs, 1 epoch, 8 probes "
                                                             "per kind (the test suite's mode)")
    parser.add_argument("--pair-seed", type=int, default=0, help="make_pairs.py seed (default 0: the committed files)")
    parser.add_argument("--extra-train", type=int, default=0, metavar="N",
                        help="add N generated training pairs (arithmetic, units, code; no question of the 400)")
    parser.add_argument("--seed", type=int, default=0, help="training, probe and cross-fit seed")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--per-kind", type=int, default=100, help="bias probes per kind")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--keep", metavar="DIR", help="keep the models, reports and calibrator here")
    parser.add_argument("--reuse", action="store_true", help="with --keep: reuse the reward models already there when "
                                                             "they were trained on the same pairs with the same settings "
                                                             "(their training is then not timed)")
    parser.add_argument("--team-seeds", type=int, nargs="+", default=[0, 1], help="team part: training seeds "
                                                                                  "(default 0 1)")
    parser.add_argument("--team-threads", type=int, default=2, help="team part: train.threads (default 2)")
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs, args.per_kind, args.team_seeds = 1, 8, args.team_seeds[:1]
    return args


def main(argv=None) -> int:
    from support.runtime import one_quiet_thread

    args = parse_args(argv)
    one_quiet_thread()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.part in ("judge", "all"):
            judge = judge_part(args, work / "judge")
            (work / "judge" / "figures.json").write_text(json.dumps(judge, indent=2, default=str) + "\n")
            trained, untrained = (judge["figures"][n]["accuracy"]["estimate"] for n in ("trained", "untrained"))
            print(f"ratio: {trained / untrained:.3f} (trained judge's held-out accuracy {trained:.3f} over the "
                  f"untrained baseline's {untrained:.3f}; anchor: the same base and seeded head with no training "
                  "step, marl rm train --epochs 0, same held-out items, measured in this run)")
        if args.part in ("team", "all"):  # its own ratio line comes last
            team = team_part(args, work / "team")
            (work / "team" / "figures.json").write_text(json.dumps(team, indent=2, default=str) + "\n")
            print(team_ratio_line(team))
    return 0


if __name__ == "__main__":
    sys.exit(main())
