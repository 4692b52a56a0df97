"""Experiment tracking: one small `Tracker` interface with JSONL, W&B and no-op backends.

Every metric dict carries its own step key (`{"train/step": 3, "train/reward": 0.5}`); nothing here
ever passes `step=` to W&B, so independent loops (train, eval) can never drop each other's rows.

This is the only module in the project that imports `wandb`, and it does so lazily inside
`WandbTracker`, so `import trainers.records.tracking` stays cheap and works without wandb installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.files import write_text_atomically
from judges.strict_json import plain
from marl.options import TRACKERS as TRACKER_KINDS
from trainers.records.report import STEP_KEY
from trainers.records.rundir import wandb_run_id
from trainers.records.runfiles import read_run_json, read_run_rows

# (glob, step metric): every namespace is plotted against its own loop's step key.
STEP_METRICS = (
    ("train/*", "train/step"),
    ("eval/*", "eval/step"),
    ("credit/*", "train/step"),
    ("guard/*", "train/step"),
    ("bucket/*", "train/step"),
    ("policy/*", "train/step"),
    ("judge/*", "train/step"),
    ("selfplay/*", "train/step"),
    ("time/*", "train/step"),
    ("rm/*", "rm/step"),  # `marl rm train`
)

Cell = str | int | float


class Tracker:
    """Base tracker: every method is a no-op. Backends override what they support.

    Usable as a context manager; `finish()` runs on exit and must be safe to call twice.
    """

    def __init__(self, run_dir: Path | str | None = None) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else None

    def log(self, metrics: Mapping[str, float | int]) -> None:
        """Record one row of metrics; the row carries its own step key (e.g. `train/step`)."""

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]]) -> None:
        """Append `rows` (cells str/int/float; anything else becomes str) to the table `key`."""

    def log_artifact(self, path: Path | str, name: str, type: str = "model",
                     metadata: dict[str, Any] | None = None, aliases: list[str] | None = None) -> None:
        """Upload a file or directory as a versioned artifact (W&B only; a no-op elsewhere)."""

    def summary(self, values: Mapping[str, Any]) -> None:
        """Set run-level summary values (merged with earlier ones)."""

    def finish(self, exit_code: int = 0) -> None:
        """Flush and close the run; a non-zero exit code marks it as failed where the backend can."""

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type, *exc_info: object) -> None:
        self.finish(exit_code=0 if exc_type is None else 1)


class NullTracker(Tracker):
    """`--tracker none`: records nothing beyond what the trainer writes itself."""


def json_safe(value: Any) -> Any:
    """Return `value` with NaN/inf floats replaced by None, numpy and torch numbers and arrays as plain
    numbers and lists, recursively, so it is valid JSON (`judges.strict_json.plain`, the one converter)."""
    return plain(value)


def coerce_cell(value: Any) -> Cell:
    """Keep str/int/float table cells as they are; turn anything else (None, bool, objects) into str."""
    if type(value) in (str, int, float):
        return value
    return str(value)


def table_file_name(key: str) -> str:
    """File name of a table's JSONL mirror: `samples/completions` -> `samples__completions.jsonl`."""
    return key.replace("/", "__") + ".jsonl"


def _dump_line(record: Any) -> str:
    return json.dumps(json_safe(record), allow_nan=False) + "\n"


def _append(path: Path, lines: list[str]) -> None:
    """Append lines in one write; a failure (full disk, `ulimit -f`) names the file it hit."""
    try:
        with path.open("a", encoding="utf-8") as handle:
            handle.write("".join(lines))
    except OSError as error:
        if error.filename is None:
            error.filename = str(path)
        raise


class JsonlTracker(Tracker):
    """Writes metrics, tables and the summary as plain files under `run_dir`.

    * `metrics.jsonl`: one JSON object per `log` call;
    * `tables/<key with / -> __>.jsonl`: one JSON object per table row, columns as keys;
    * `summary.json`: the merged summary values.
    NaN and infinities are written as `null` so every file is valid JSON.
    """

    def __init__(self, run_dir: Path | str) -> None:
        super().__init__(run_dir)
        self.run_dir: Path = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.tables_dir = self.run_dir / "tables"
        self.summary_path = self.run_dir / "summary.json"
        self._summary: dict[str, Any] = {}

    def log(self, metrics: Mapping[str, float | int]) -> None:
        """Append one JSON line to `metrics.jsonl` (a line cut short by a full disk is dropped on resume)."""
        _append(self.metrics_path, [_dump_line(dict(metrics))])

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]]) -> None:
        """Append each row as a `{column: cell}` JSON line to `tables/<key>.jsonl`."""
        self.tables_dir.mkdir(exist_ok=True)
        lines = []
        for row in rows:
            if len(row) != len(columns):
                raise ValueError(f"table {key!r}: row has {len(row)} cells, expected {len(columns)} {columns}")
            lines.append(_dump_line({column: coerce_cell(cell) for column, cell in zip(columns, row)}))
        _append(self.tables_dir / table_file_name(key), lines)

    def summary(self, values: Mapping[str, Any]) -> None:
        """Merge `values` into `summary.json` (replaced atomically each call)."""
        self._summary.update(values)
        write_text_atomically(self.summary_path, json.dumps(json_safe(self._summary), indent=2, allow_nan=False) + "\n")


def resolve_wandb_mode(environ: Mapping[str, str] | None = None) -> str | None:
    """The `mode=` to pass to `wandb.init`.

    An explicit `mode=` beats `WANDB_MODE`, so when the environment sets it we pass None and let
    wandb honour it. Otherwise: online when an API key is present, else offline (no account needed).
    """
    env = os.environ if environ is None else environ
    if env.get("WANDB_MODE"):
        return None
    return "online" if env.get("WANDB_API_KEY") else "offline"


_ARTIFACT_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def artifact_name(name: str) -> str:
    """A W&B-legal artifact name (letters, digits, `-`, `_`, `.`): other runs of characters become `-`."""
    cleaned = _ARTIFACT_NAME_BAD.sub("-", name).strip("-")
    if not cleaned:
        raise ValueError(f"artifact name {name!r} has no usable characters")
    return cleaned


class TrackerError(RuntimeError):
    """The tracker cannot start (wandb missing, or its run would not initialise): one line naming the fix."""


def _import_wandb() -> Any:
    """Import wandb on demand, with an error that names the fix."""
    try:
        import wandb
    except ImportError as error:
        raise TrackerError(
            f"--tracker wandb needs the `wandb` package ({error}); install it (pip install wandb) "
            "or use --tracker jsonl") from error
    return wandb


class WandbTracker(Tracker):
    """A W&B run plus an always-on JSONL mirror in the same `run_dir`.

    The mode follows `resolve_wandb_mode`: `WANDB_MODE` when set, else online with
    `WANDB_API_KEY`, else offline (sync later with `wandb sync <run_dir>/wandb/offline-run-*`).
    With `run_id` a resumed training run stays one W&B run: online it continues the run of that id
    (`resume="allow"`); offline, where wandb cannot resume, `run_tracker` rebuilds it from the mirror
    into one new `offline-run-*-<run_id>` folder and removes the older ones, so a sync uploads the
    run's record exactly. `resumed_at` > 0 records the step it resumed from in the summary
    (`resume/from_step`).
    """

    def __init__(self, run_dir: Path | str, project: str, config: Mapping[str, Any] | None = None,
                 name: str | None = None, group: str | None = None, job_type: str = "train",
                 run_id: str | None = None, resumed_at: int = 0) -> None:
        super().__init__(run_dir)
        self.run_dir: Path = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._wandb = _import_wandb()
        self.offline = (resolve_wandb_mode() or os.environ.get("WANDB_MODE", "")) in ("offline", "dryrun")
        self.run = self._init_run(project, dict(config or {}), name, group, job_type, run_id)
        self.mirror = JsonlTracker(self.run_dir)
        self._tables: dict[str, Any] = {}
        self._finished = False
        if resumed_at:  # marks where the interrupted part ends (its later rows, if any, are logged again)
            self.run.summary.update({"resume/from_step": resumed_at})

    def _init_run(self, project: str, config: dict[str, Any], name: str | None,
                  group: str | None, job_type: str, run_id: str | None = None) -> Any:
        """`wandb.init` with our settings, then one `define_metric` per step namespace."""
        # Online, a resume continues the same W&B run. Offline, wandb cannot resume (wandb issue 4624:
        # every start is a new offline folder, `_step` from 0): the run is rebuilt from the mirror instead
        # (`rebuild_offline_run`), under the same id.
        resume = ({"id": run_id} if self.offline else {"id": run_id, "resume": "allow"}) if run_id else {}
        try:
            run = self._wandb.init(project=project, config=config, dir=str(self.run_dir), name=name,
                                   group=group, job_type=job_type, mode=resolve_wandb_mode(),
                                   reinit="finish_previous", **resume)
        except Exception as error:  # wandb raises many types (UsageError, CommError, timeouts)
            raise TrackerError(f"wandb.init failed: {error}. Check WANDB_MODE / WANDB_API_KEY, "
                               "or use --tracker jsonl") from error
        for step_key in sorted({step for _, step in STEP_METRICS}):
            run.define_metric(step_key)
        for glob, step_key in STEP_METRICS:
            run.define_metric(glob, step_metric=step_key, step_sync=True)
        return run

    def rebuild_offline_run(self) -> None:
        """A resumed offline run: log the mirror's record (metrics.jsonl and the tables, already cut
        back to the checkpoint) into this new offline run, then remove the run's older offline folders,
        so that `wandb sync` uploads exactly the run's record, once. The folders go last: a resume that
        dies midway leaves them, and the next resume rebuilds again from the mirror."""
        tables = _read_mirror_tables(self.mirror.tables_dir)
        for row in _read_jsonl(self.mirror.metrics_path):
            self.run.log(row)
            step = row.get(STEP_KEY)
            for key, (columns, rows) in tables.items():
                due = [cells for cells in rows if cells[0] == step] if step is not None else []
                if due:
                    self._log_table_rows(key, columns, due)
        summary = _read_json_object(self.mirror.summary_path)
        if summary:
            self.mirror._summary.update(summary)
            self.run.summary.update(summary)
        current = Path(self.run.dir).parent  # .../wandb/offline-run-<time>-<id>/files
        for folder in sorted((self.run_dir / "wandb").glob(f"offline-run-*-{self.run.id}")):
            if folder.resolve() != current.resolve():
                shutil.rmtree(folder, ignore_errors=True)

    def log(self, metrics: Mapping[str, float | int]) -> None:
        """Mirror to JSONL, then `run.log(metrics)`; the step lives inside `metrics`."""
        self.mirror.log(metrics)
        self.run.log(dict(metrics))

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]]) -> None:
        """Mirror to JSONL, then log the new rows to an INCREMENTAL `wandb.Table` under `key`."""
        self.mirror.log_table(key, columns, rows)
        self._log_table_rows(key, columns, rows)

    def _log_table_rows(self, key: str, columns: list[str], rows: list[list[Any]]) -> None:
        table = self._tables.get(key)
        if table is None or list(table.columns) != list(columns):
            table = self._wandb.Table(columns=list(columns), log_mode="INCREMENTAL", allow_mixed_types=True)
            self._tables[key] = table
        for row in rows:
            table.add_data(*(coerce_cell(cell) for cell in row))
        self.run.log({key: table})

    def log_artifact(self, path: Path | str, name: str, type: str = "model",
                     metadata: dict[str, Any] | None = None, aliases: list[str] | None = None) -> None:
        """Log a file or directory as artifact `name` (illegal characters become `-`) with `aliases`."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"artifact path {path} does not exist")
        artifact = self._wandb.Artifact(artifact_name(name), type=type, metadata=json_safe(metadata or {}))
        if path.is_dir():
            artifact.add_dir(str(path))
        else:
            artifact.add_file(str(path))
        self.run.log_artifact(artifact, aliases=list(aliases) if aliases else None)

    def summary(self, values: Mapping[str, Any]) -> None:
        """Mirror to `summary.json`, then update the W&B run summary."""
        self.mirror.summary(values)
        self.run.summary.update(dict(values))

    def finish(self, exit_code: int = 0) -> None:
        """Finish the W&B run once (the process-exit hook, or `wandb.teardown()`, flushes it to disk);
        a non-zero exit code marks an interrupted or crashed run as failed."""
        if self._finished:
            return
        self._finished = True
        self.run.finish(exit_code=exit_code)
        self.mirror.finish()


def _read_jsonl(path: Path) -> list[dict]:
    """The JSON-object lines of a mirror file (none when it is missing; a torn line is skipped); read as every
    file of a run folder is (trainers/records/runfiles.py: a FIFO or a hostile line is one line, exit 2)."""
    return [row for _, row in read_run_rows(path)[1]] if os.path.lexists(path) else []


def _read_json_object(path: Path) -> dict:
    """The mirror's summary.json ({} when there is none)."""
    return read_run_json(path, missing={})


def _read_mirror_tables(tables_dir: Path) -> dict[str, tuple[list[str], list[list[Any]]]]:
    """key -> (columns, rows) of every mirrored table whose rows carry a `step` (the run's tables)."""
    tables = {}
    for path in sorted(Path(tables_dir).glob("*.jsonl")):
        rows = _read_jsonl(path)
        if rows and "step" in rows[0]:
            columns = ["step", *(column for column in rows[0] if column != "step")]
            tables[path.stem.replace("__", "/")] = (columns, [[row.get(c) for c in columns] for row in rows])
    return tables


def make_tracker(kind: str, run_dir: Path | str, *, project: str = "marl",
                 config: Mapping[str, Any] | None = None, name: str | None = None,
                 group: str | None = None, run_id: str | None = None, resumed_at: int = 0) -> Tracker:
    """Build the tracker for `--tracker kind` (one of `TRACKER_KINDS`); `run_id` and `resumed_at`
    go to `WandbTracker` (one W&B run per run directory, continued on resume).

    Raises ValueError for an unknown kind and RuntimeError when wandb is missing or fails to start.
    """
    if kind == "wandb":
        return WandbTracker(run_dir, project=project, config=config, name=name, group=group, run_id=run_id,
                            resumed_at=resumed_at)
    if kind == "jsonl":
        return JsonlTracker(run_dir)
    if kind == "none":
        return NullTracker(run_dir)
    raise ValueError(f"unknown tracker {kind!r}; choose one of {', '.join(TRACKER_KINDS)}")


def run_tracker(kind: str, out: Path, step: int, *, config: Mapping[str, Any], group: str,
                project: str = "marl") -> Tracker:
    """The tracker of a run directory (`marl run` and `marl demo`): `none` still mirrors metrics to
    OUT/metrics.jsonl, and a W&B run keeps one id per run directory, so a resume at `step` continues it."""
    if kind == "none":
        return JsonlTracker(out)
    run_id = wandb_run_id(out, step) if kind == "wandb" else None
    tracker = make_tracker(kind, out, project=project, config=config, name=Path(out).name, group=group,
                           run_id=run_id, resumed_at=step)
    if isinstance(tracker, WandbTracker) and step and tracker.offline:
        tracker.rebuild_offline_run()
    return tracker
