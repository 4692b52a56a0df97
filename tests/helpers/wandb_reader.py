"""Test helper: read an offline W&B run back from its `.wandb` transaction log, without network.

In offline mode wandb 0.31 writes no `wandb-summary.json` or `config.yaml`; the `.wandb` file is the
source of truth. It is a LevelDB-style log: a 7-byte header (`:W&B`, magic 0xBEE1, version 0), then
32 KiB blocks of records (`crc32 u32 | length u16 | type u8 | data`) of type FULL/FIRST/MIDDLE/LAST.
Each reassembled payload is a serialized `wandb.proto.wandb_internal_pb2.Record`.
(docs/runs.md shows a shorter reader of the same log for users.)
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_BLOCK_SIZE = 32768
_RECORD_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


class WandbLogError(ValueError):
    """The file is not a readable `.wandb` transaction log."""


def _check_file_header(data: bytes) -> None:
    if len(data) < _RECORD_HEADER:
        raise WandbLogError(f"{len(data)}-byte file is too short for a .wandb header")
    ident, magic, version = struct.unpack("<4sHB", data[:_RECORD_HEADER])
    if ident != b":W&B" or magic != 0xBEE1 or version != 0:
        raise WandbLogError(f"not a .wandb file (ident={ident!r}, magic={magic:#x}, version={version})")


def _iter_chunks(data: bytes) -> Iterator[bytes]:
    """Yield reassembled record payloads, checking each fragment's CRC."""
    pos, pending = _RECORD_HEADER, b""
    while pos + _RECORD_HEADER <= len(data):
        space_left = _BLOCK_SIZE - (pos % _BLOCK_SIZE)
        if space_left < _RECORD_HEADER:  # block trailer padding
            pos += space_left
            continue
        crc, length, record_type = struct.unpack("<IHB", data[pos:pos + _RECORD_HEADER])
        if record_type == 0 and length == 0:  # zero padding at the end of a block
            pos += space_left
            continue
        payload = data[pos + _RECORD_HEADER:pos + _RECORD_HEADER + length]
        if len(payload) < length:
            return  # truncated tail: run still writing, or crashed
        expected = zlib.crc32(payload, zlib.crc32(bytes([record_type]))) & 0xFFFFFFFF
        if crc != expected:
            raise WandbLogError(f"bad crc at offset {pos}")
        pos += _RECORD_HEADER + length
        if record_type == _FULL:
            yield payload
        elif record_type == _FIRST:
            pending = payload
        elif record_type == _MIDDLE:
            pending += payload
        else:
            yield pending + payload
            pending = b""


def iter_records(path: str | Path) -> Iterator[Any]:
    """Yield every `wandb_internal_pb2.Record` in the `.wandb` file at `path`."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    _check_file_header(data)
    for chunk in _iter_chunks(data):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(chunk)
        yield record


def _items(items: Any) -> dict[str, Any]:
    """History/summary items as a dict; wandb-core writes `nested_key` paths rather than `key`."""
    out: dict[str, Any] = {}
    for item in items:
        path = list(item.nested_key) or [item.key]
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = json.loads(item.value_json)
    return out


def _config_items(updates: Any) -> dict[str, Any]:
    return {update.key: json.loads(update.value_json) for update in updates}


def _run_info(run: Any) -> dict[str, Any]:
    return {"id": run.run_id, "project": run.project, "group": run.run_group, "job_type": run.job_type,
            "tags": list(run.tags), "name": run.display_name}


def _artifact_info(artifact: Any) -> dict[str, Any]:
    return {"name": artifact.name, "type": artifact.type, "aliases": list(artifact.aliases),
            "files": [entry.path for entry in artifact.manifest.contents],
            "metadata": json.loads(artifact.metadata or "{}")}


def read_run(path: str | Path) -> dict[str, Any]:
    """Return `{"run", "config", "history", "summary", "metrics", "artifacts", "exit_code"}` of one `.wandb` log."""
    out: dict[str, Any] = {"run": {}, "config": {}, "history": [], "summary": {}, "metrics": [],
                           "artifacts": [], "exit_code": None}  # None: the run never finished (killed)
    for record in iter_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run"] = _run_info(record.run)
            out["config"].update(_config_items(record.run.config.update))
        elif kind == "config":
            out["config"].update(_config_items(record.config.update))
        elif kind == "history":
            out["history"].append(_items(record.history.item))
        elif kind == "summary":
            out["summary"].update(_items(record.summary.update))
        elif kind == "metric":
            metric = record.metric
            out["metrics"].append({"name": metric.name or metric.glob_name, "step_metric": metric.step_metric})
        elif kind == "artifact":
            out["artifacts"].append(_artifact_info(record.artifact))
        elif kind == "exit":
            out["exit_code"] = record.exit.exit_code
    return out


def find_run_logs(wandb_dir: str | Path) -> list[Path]:
    """Every `run-*.wandb` file under `wandb_dir`, oldest start first (each process that ran, or
    resumed, a run writes its own `offline-run-<time>-<id>` directory)."""
    logs = {path.resolve() for path in Path(wandb_dir).glob("**/*run-*/run-*.wandb")}
    return sorted(logs, key=lambda path: path.parent.name)


def find_run_log(wandb_dir: str | Path) -> Path:
    """The single `run-*.wandb` file under `wandb_dir` (the `latest-run` symlink is de-duplicated)."""
    logs = {path.resolve() for path in Path(wandb_dir).glob("**/*run-*/run-*.wandb")}
    if len(logs) != 1:
        raise FileNotFoundError(f"expected one .wandb log under {wandb_dir}, found {sorted(logs)}")
    return logs.pop()


def read_offline_run(wandb_dir: str | Path) -> tuple[dict[str, Any], Path]:
    """Flush W&B, then read the single offline run under `wandb_dir`; returns (run, its files dir).

    `run.finish()` can return before wandb-core has flushed the log (wandb 0.31 sometimes left a
    7-byte, header-only file); `wandb.teardown()` waits for the flush.
    """
    import wandb

    wandb.teardown()
    log = find_run_log(wandb_dir)
    return read_run(log), log.parent / "files"


def table_rows(run: dict[str, Any], files_dir: Path, key: str) -> tuple[list[str], list[list[Any]]]:
    """Columns and all rows of table `key`, joining every logged increment in history order.

    A plain table is re-logged whole, so only its last logging counts; an INCREMENTAL table writes
    just the new rows each time, so its increments are concatenated.
    """
    refs = [row[key] for row in run["history"] if isinstance(row.get(key), dict)]
    if not refs:
        raise KeyError(f"no table {key!r} in the run history")
    if refs[-1].get("log_mode") != "INCREMENTAL":
        refs = refs[-1:]
    columns: list[str] = []
    rows: list[list[Any]] = []
    for ref in refs:
        table = json.loads((files_dir / ref["path"]).read_text())
        columns = table["columns"]
        rows.extend(table["data"])
    return columns, rows
