"""Run report: PNG plots and a short `report.md` built from a run directory's `metrics.jsonl`.

Only rows that carry `train/step` are used. Each plot is drawn only for the keys present (a missing
family is skipped silently): reward and team success, Self-BLEU, pass rate per difficulty bucket,
credit shares and KL. Every series is drawn raw (faint) plus a rolling mean.

matplotlib is imported lazily and only through its object-oriented API (`Figure` + Agg canvas), so
importing this module is cheap and no global pyplot backend is touched.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from common.files import atomic_file, write_text_atomically
from trainers.records.runfiles import read_run_rows

STEP_KEY = "train/step"
ROLLING_WINDOW = 5
EDGE_ROWS = 5  # the summary compares the mean of the first and the last EDGE_ROWS values


@dataclass(frozen=True)
class PlotSpec:
    """One figure: the keys it draws (a full-match regex), its file name and labels."""

    file_name: str
    title: str
    ylabel: str
    key_pattern: str


PLOTS = (
    PlotSpec("reward.png", "Reward and team success", "value",
             r"train/reward|train/team_success|train/agent/[^/]+/reward"),
    PlotSpec("self_bleu.png", "Self-BLEU (diversity guard; lower = more diverse)", "Self-BLEU",
             r"guard/self_bleu"),
    PlotSpec("pass_rate.png", "Pass rate per difficulty bucket", "pass rate", r"bucket/\d+/pass_rate"),
    PlotSpec("credit.png", "Credit per agent: value and share", "credit", r"credit/[^/]+/(value|share)"),
    PlotSpec("kl.png", "KL to the reference policy", "KL", r"train/kl|policy/[^/]+/kl"),
    PlotSpec("wins.png", "Win rate per agent (competitive)", "win rate", r"train/agent/[^/]+/win_rate"),
    PlotSpec("ratings.png", "Self-play ratings", "rating", r"selfplay/rating/learner"),
    PlotSpec("eval.png", "Held-out evaluation (temperature 0, train.eval_every)", "value",
             r"eval/team_success|eval/team_reward|eval/agent/[^/]+/reward"),
    PlotSpec("games.png", "Games: not lost against fixed opponents, and the scenario's own figures", "value",
             r"eval/vs/[^/]+/not_lost|eval/game/.+"),
)

Series = tuple[list[float], list[float]]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Rows of a `metrics.jsonl` that carry `train/step`; lines that are not JSON (a torn tail) are skipped.
    Read as every file of a run folder is (trainers/records/runfiles.py): a FIFO, a device, bytes that are not
    UTF-8 or a line nested too deep is a RunFileProblem (one line), never a hang or a traceback."""
    if not Path(path).exists():
        raise FileNotFoundError(2, "No such file or directory", str(path))
    _, rows = read_run_rows(path)
    return [row for _, row in rows if _is_number(row.get(STEP_KEY))]


def truncate_metrics(path: Path, steps_done: int) -> None:
    """Drop metric rows logged after the checkpoint a run resumes from, so no step appears twice
    (a torn last line is dropped too). The kept rows are written to a temporary file that replaces
    the old one, so a write that fails (a full disk, `ulimit -f`) leaves every row where it was."""
    path = Path(path)
    if path.exists():
        _keep_lines(path, lambda row: not (_is_number(row.get(STEP_KEY)) and row[STEP_KEY] > steps_done))


def truncate_tables(tables_dir: Path, steps_done: int) -> None:
    """The same for the JSONL mirror of tables: rows whose `step` is past the checkpoint are dropped."""
    for path in sorted(Path(tables_dir).glob("*.jsonl")):
        _keep_lines(path, lambda row: not (_is_number(row.get("step")) and row["step"] > steps_done))


def _keep_lines(path: Path, keep) -> None:
    """Rewrite `path` (atomically) with the JSON-object lines `keep(row)` accepts; unparsable lines
    (a torn tail) go. Nothing is written when every line stays."""
    text, rows = read_run_rows(path)
    new = "".join(line + "\n" for line, row in rows if keep(row))
    if new != text:
        write_text_atomically(path, new)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _natural_key(text: str) -> tuple[int, list[Any]]:
    """Shallow keys first (`train/reward` before `train/agent/a/reward`), and `bucket/10` after `bucket/2`."""
    return text.count("/"), [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def matching_keys(rows: Iterable[Mapping[str, Any]], pattern: str) -> list[str]:
    """Keys (in natural order) that full-match `pattern` in at least one row."""
    compiled = re.compile(pattern)
    keys = {key for row in rows for key in row if compiled.fullmatch(key)}
    return sorted(keys, key=_natural_key)


def series(rows: Iterable[Mapping[str, Any]], key: str) -> Series:
    """(steps, values) of `key`, keeping only finite numbers (None/NaN/missing are gaps)."""
    steps, values = [], []
    for row in rows:
        value = row.get(key)
        if _is_number(value):
            steps.append(float(row[STEP_KEY]))
            values.append(float(value))
    return steps, values


def rolling_mean(values: list[float], window: int = ROLLING_WINDOW) -> list[float]:
    """Trailing rolling mean; the first points average over what is available so far."""
    out, total = [], 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        out.append(total / min(index + 1, window))
    return out


def plot_family(rows: list[dict[str, Any]], spec: PlotSpec, plots_dir: Path) -> Path | None:
    """Draw every key of `spec` into `plots_dir/spec.file_name`; None when no key has data."""
    named = {key: series(rows, key) for key in matching_keys(rows, spec.key_pattern)}
    named = {key: data for key, data in named.items() if data[0]}
    if not named:
        return None
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4), dpi=100)
    axes = figure.add_subplot()
    for index, (key, (steps, values)) in enumerate(named.items()):
        color = f"C{index % 10}"
        axes.plot(steps, values, color=color, alpha=0.25, linewidth=1)
        axes.plot(steps, rolling_mean(values), color=color, linewidth=2, label=key)
    axes.set_title(spec.title)
    axes.set_xlabel(STEP_KEY)
    axes.set_ylabel(spec.ylabel)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small", loc="best")
    figure.tight_layout()

    path = plots_dir / spec.file_name
    with atomic_file(path, "wb") as handle:
        figure.savefig(handle, format="png")
    return path


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.4g}"


def _change(first: float | None, last: float | None) -> str:
    return "n/a" if first is None or last is None else f"{last - first:+.4g}"


def summary_lines(rows: list[dict[str, Any]], keys: list[str]) -> list[str]:
    """Markdown: step count and range, then first-5 vs last-5 means of each plotted key."""
    steps = [row[STEP_KEY] for row in rows]
    lines = [f"- logged steps: {len(rows)}"
             + (f" (train/step {_fmt(min(steps))} to {_fmt(max(steps))})" if steps else "")]
    if not keys:
        return lines + ["- no plotted metrics were found"]
    lines += ["", f"| metric | first {EDGE_ROWS} mean | last {EDGE_ROWS} mean | change |",
              "|---|---|---|---|"]
    for key in keys:
        values = series(rows, key)[1]
        first, last = _mean(values[:EDGE_ROWS]), _mean(values[-EDGE_ROWS:])
        lines.append(f"| `{key}` | {_fmt(first)} | {_fmt(last)} | {_change(first, last)} |")
    return lines


def held_out_lines(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[str]:
    """Markdown table of held-out metrics before and after training (empty when neither is given)."""
    if not before and not after:
        return []
    before, after = dict(before or {}), dict(after or {})
    lines = ["| metric | before | after | change |", "|---|---|---|---|"]
    for key in list(dict.fromkeys([*before, *after])):
        first = before.get(key) if _is_number(before.get(key)) else None
        last = after.get(key) if _is_number(after.get(key)) else None
        lines.append(f"| {key} | {_fmt(first)} | {_fmt(last)} | {_change(first, last)} |")
    return lines


def write_report(run_dir: Path, title: str = "Run report", before: Mapping[str, Any] | None = None,
                 after: Mapping[str, Any] | None = None, extra: str = "",
                 titles: Mapping[str, str] | None = None) -> Path:
    """Write `run_dir/plots/*.png` and `run_dir/report.md` from `run_dir/metrics.jsonl`; return the report path.

    `before` / `after` are held-out figures (metric name -> value) shown side by side when given;
    `extra` (markdown) ends the report; `titles` (file name -> title) replaces plots' titles, e.g. to
    say what credit is measured against. Every file replaces its old version atomically.
    """
    run_dir = Path(run_dir)
    metrics_path = run_dir / "metrics.jsonl"
    if not metrics_path.exists():
        raise FileNotFoundError(f"{metrics_path} not found; run training with --tracker jsonl or wandb first")
    rows = sorted(read_metrics(metrics_path), key=lambda row: row[STEP_KEY])
    plots_dir = run_dir / "plots"
    plots_dir.mkdir(exist_ok=True)
    specs = [replace(spec, title=(titles or {}).get(spec.file_name, spec.title)) for spec in PLOTS]
    plotted = [(spec, plot_family(rows, spec, plots_dir)) for spec in specs]
    keys = [key for spec, path in plotted if path is not None
            for key in matching_keys(rows, spec.key_pattern) if series(rows, key)[0]]
    lines = [f"# {title}", "", f"Run directory: `{run_dir}`", "", "## Summary", ""]
    lines += summary_lines(rows, keys)
    held_out = held_out_lines(before, after)
    if held_out:
        lines += ["", "## Held-out evaluation", "", *held_out]
    figures = [(spec, path) for spec, path in plotted if path is not None]
    if figures:
        lines += ["", "## Plots", ""]
        lines += [f"### {spec.title}\n\n![{spec.title}](plots/{path.name})\n" for spec, path in figures]
    if extra:
        lines += ["", extra.strip()]
    report_path = run_dir / "report.md"
    write_text_atomically(report_path, "\n".join(lines).rstrip() + "\n")
    return report_path
