"""SQL verifier: run the predicted and the reference query on a SQLite database and its hidden variants.

`SQLVerifier` extracts the candidate's query (the last ```sql fence, else the text from the first line
starting with SELECT or WITH, else the whole text), runs it and the reference query on the original
database and on `variants` seeded, perturbed copies of it, and compares the result multisets (rows as
tuples, floats rounded to `float_digits`; lists in order when `ordered=True`). Column names are not
compared. Score 1 only when the results agree on the original and on every variant, else 0.

Hidden preprocessing (why a memorised answer fails): each variant is a copy of the data in which, per
table, some rows get new values (numbers jittered, text and small-domain columns re-drawn from the
column's own values), new rows are inserted (new primary keys, foreign-key and *_id columns copied
from existing rows so that joins stay consistent) and a few rows are deleted from tables no foreign
key points to. `SELECT 42` or a hard-coded list of names matches the original but not the variants.
Variants are built once per (database file, its mtime and size, seed) into a private temporary folder
that is removed at exit.

Safety: every query runs on a connection opened read-only (`mode=ro`, `PRAGMA query_only`) with an
authorizer that allows only reading (SELECT, READ, FUNCTION, RECURSIVE: no writes, ATTACH, PRAGMA or
transactions), one statement, a progress-handler deadline (`timeout_s`), a row cap (`max_rows`),
a length limit on values (1 MB), a cap on result columns and on the bytes fetched (32 MB: "result too
large"). Predicted SQL that errors, writes, times out or returns too many rows scores
0 (the candidate's fault); a reference that fails gives failed('error' or 'timeout').
"""

from __future__ import annotations

import atexit
import random
import re
import shutil
import sqlite3
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import quote

from judges.rules.basic import RuleVerifier
from judges.types import Candidate, Item, Judgment, failed, passed

_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
                              sqlite3.SQLITE_RECURSIVE})
_DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})
# What a query may make the trainer's process hold: a value (string or blob) of at most 1 MB, at most
# _MIN_COLUMNS result columns (or every column of the database, if more: `SELECT *` over a join of all
# tables still works), and at most _MAX_RESULT_BYTES fetched in all. Rows are fetched one at a time and
# measured, so a query that repeats a huge value (zeroblob) stops at the cap, never at the deadline.
_MAX_VALUE_BYTES = 1_000_000
_MIN_COLUMNS = 100
_MAX_RESULT_BYTES = 32_000_000


class QueryError(Exception):
    """A query that could not produce a result: kind is 'error', 'timeout', 'rows' (too many) or 'size'
    (its values hold more bytes than the cap)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def extract_sql(text: str) -> str:
    """The query in a candidate's text (see the module docstring), without trailing semicolons."""
    text = text or ""
    fences = re.findall(r"```[ \t]*([A-Za-z]*)[ \t]*\n(.*?)```", text, flags=re.DOTALL)
    sql_fences = [body for language, body in fences if language.lower() in ("sql", "sqlite", "")]
    if sql_fences:
        query = sql_fences[-1]
    else:
        lines = text.splitlines()
        starts = [i for i, line in enumerate(lines) if re.match(r"\s*(select|with)\b", line, re.IGNORECASE)]
        query = "\n".join(lines[starts[0]:]) if starts else text
    return query.strip().rstrip(";").strip()


def _authorize(action: int, arg1, arg2, database, source) -> int:
    if action not in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def run_query(path: str | Path, sql: str, *, timeout_s: float = 2.0, max_rows: int = 10_000,
              max_bytes: int = _MAX_RESULT_BYTES) -> list[tuple]:
    """The rows of `sql` on the database file at `path`, read-only; raises QueryError (kind 'size' when
    the result holds more than `max_bytes` of values)."""
    if not sql.strip():
        raise QueryError("error", "empty query")
    connection = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, check_same_thread=False)
    try:
        connection.execute("PRAGMA query_only = ON")
        _limit(connection)
        deadline = time.monotonic() + timeout_s
        connection.set_progress_handler(lambda: time.monotonic() > deadline, 1000)
        connection.set_authorizer(_authorize)
        return _fetch(connection.execute(sql), max_rows, max_bytes)
    except (sqlite3.Error, sqlite3.Warning, MemoryError, OverflowError, ValueError) as error:
        if "interrupted" in str(error):
            raise QueryError("timeout", f"timed out after {timeout_s:g} s") from None
        raise QueryError("error", f"{type(error).__name__}: {error}") from None
    finally:
        connection.close()


def _limit(connection: sqlite3.Connection) -> None:
    """Cap the length of a value, the number of result columns and ATTACH (see _MAX_VALUE_BYTES)."""
    if not hasattr(connection, "setlimit"):  # Python < 3.11: the fetch cap still holds
        return
    columns = connection.execute("SELECT count(*) FROM sqlite_master m, pragma_table_info(m.name) "
                                 "WHERE m.type = 'table'").fetchone()[0]
    connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)
    connection.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, max(_MIN_COLUMNS, columns))
    connection.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)


def _fetch(cursor: sqlite3.Cursor, max_rows: int, max_bytes: int) -> list[tuple]:
    """The cursor's rows, one at a time (a row is at most columns x _MAX_VALUE_BYTES), measured as
    they come: QueryError('rows') past `max_rows`, QueryError('size', 'result too large') past
    `max_bytes`, before the next row is fetched."""
    rows: list[tuple] = []
    size = 0
    for row in cursor:
        size += sum(len(value) if isinstance(value, (str, bytes)) else 8 for value in row)
        if size > max_bytes:
            raise QueryError("size", "result too large")
        rows.append(row)
        if len(rows) > max_rows:
            raise QueryError("rows", f"more than {max_rows} rows")
    return rows


def _table_facts(connection: sqlite3.Connection) -> tuple[list[str], set[str], dict[str, set[str]]]:
    tables = [name for (name,) in connection.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    referenced, foreign = set(), {}
    for table in tables:
        links = connection.execute(f'PRAGMA foreign_key_list("{table}")').fetchall()
        referenced |= {link[2] for link in links}
        foreign[table] = {link[3] for link in links}
    return tables, referenced, foreign


def _unique_columns(connection: sqlite3.Connection, table: str) -> set[str]:
    unique = set()
    for index in connection.execute(f'PRAGMA index_list("{table}")').fetchall():
        if index[2]:
            columns = connection.execute(f'PRAGMA index_info("{index[1]}")').fetchall()
            if len(columns) == 1:
                unique.add(columns[0][2])
    return unique


def _jitter(value, column_values: list, rng: random.Random):
    if isinstance(value, int):
        step = rng.randint(1, max(1, abs(value) // 5))
        new = value + rng.choice((-1, 1)) * step
    else:
        new = value * rng.uniform(0.75, 1.25) + rng.uniform(-1, 1)
        if all(round(v, 2) == v for v in column_values if isinstance(v, float)):
            new = round(new, 2)
    return abs(new) if all(v >= 0 for v in column_values if isinstance(v, (int, float))) else new


class _Column:
    """How a column's values are redrawn in a variant."""

    def __init__(self, name: str, values: list, role: str):
        self.name, self.values, self.role = name, [v for v in values if v is not None] or [None], role

    def draw(self, rng: random.Random, base, serial: int):
        if self.role == "copy":
            return base
        if self.role == "sample":
            return rng.choice(self.values)
        if self.role == "unique":
            if isinstance(base, (int, float)) and not isinstance(base, bool):
                return max(v for v in self.values if isinstance(v, (int, float))) + serial
            return f"{rng.choice(self.values)} {serial}"
        return _jitter(rng.choice(self.values), self.values, rng)  # "number"


def _id_like(name: str) -> bool:
    """Columns that probably hold keys (id, customer_id, customerId): never jittered."""
    return bool(re.search(r"(^|_)id$", name, re.IGNORECASE) or re.search(r"[a-z]Id$", name))


def _columns(connection, table: str, rows: list[tuple], info: list, foreign: set[str]) -> list[_Column]:
    unique = _unique_columns(connection, table) | {c[1] for c in info if c[5] > 0}
    if sum(1 for c in info if c[5] > 0) > 1:  # a composite key: draw its parts from existing values
        unique -= {c[1] for c in info if c[5] > 0}
        foreign = foreign | {c[1] for c in info if c[5] > 0}
    columns = []
    for position, column in enumerate(info):
        name, values = column[1], [row[position] for row in rows]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values if v is not None)
        if name in foreign or _id_like(name) and name not in unique:
            role = "sample"
        elif name in unique:
            role = "unique"
        elif numeric and len(set(values)) > 5:
            role = "number"
        elif numeric or all(isinstance(v, str) or v is None for v in values):
            role = "sample"
        else:
            role = "copy"
        columns.append(_Column(name, values, role))
    return columns


def _perturb_table(connection, table: str, rng: random.Random, referenced: set[str], foreign: set[str]) -> None:
    info = connection.execute(f'PRAGMA table_info("{table}")').fetchall()
    names = ", ".join(f'"{column[1]}"' for column in info)
    try:
        rows = connection.execute(f'SELECT rowid, {names} FROM "{table}" LIMIT 5000').fetchall()
        has_rowid = True
    except sqlite3.OperationalError:  # WITHOUT ROWID
        rows = [(None,) + row for row in connection.execute(f'SELECT {names} FROM "{table}" LIMIT 5000')]
        has_rowid = False
    if not rows:
        return
    columns = _columns(connection, table, [row[1:] for row in rows], info, foreign)
    changing = [c for c in columns if c.role in ("number", "sample") and c.name not in foreign
                and not _id_like(c.name)]
    if has_rowid and changing:
        for row in rng.sample(rows, max(1, len(rows) // 4))[:200]:
            assignments = ", ".join(f'"{c.name}" = ?' for c in changing)
            values = [c.draw(rng, None, 0) for c in changing]
            connection.execute(f'UPDATE OR IGNORE "{table}" SET {assignments} WHERE rowid = ?', values + [row[0]])
    placeholders = ", ".join("?" for _ in columns)
    for serial in range(1, min(200, max(2, len(rows) // 3)) + 1):
        base = rng.choice(rows)[1:]
        values = [column.draw(rng, base[i], serial) for i, column in enumerate(columns)]
        connection.execute(f'INSERT OR IGNORE INTO "{table}" ({names}) VALUES ({placeholders})', values)
    if has_rowid and table not in referenced and len(rows) >= 4:
        for row in rng.sample(rows, max(1, len(rows) // 10))[:100]:
            connection.execute(f'DELETE FROM "{table}" WHERE rowid = ?', (row[0],))


def build_variant(source: str | Path, target: str | Path, seed: int | str) -> None:
    """Write to `target` a perturbed copy of the database `source` (deterministic for a given seed)."""
    reader = sqlite3.connect(f"file:{quote(str(source))}?mode=ro", uri=True)
    writer = sqlite3.connect(str(target))
    try:
        reader.backup(writer)
        rng = random.Random(str(seed))
        tables, referenced, foreign = _table_facts(writer)
        for table in tables:
            _perturb_table(writer, table, rng, referenced, foreign.get(table, set()))
        writer.commit()
    finally:
        reader.close()
        writer.close()


class _VariantStore:
    """Variant files, built once per (database, mtime, size, seed, index), removed at exit."""

    def __init__(self):
        self.lock, self.folder, self.paths = threading.Lock(), None, {}

    def get(self, database: Path, seed: int, index: int) -> Path:
        stat = database.stat()
        key = (str(database), stat.st_mtime_ns, stat.st_size, seed, index)
        with self.lock:
            if key not in self.paths:
                if self.folder is None:
                    self.folder = Path(tempfile.mkdtemp(prefix="marl_sql_variants_"))
                    atexit.register(shutil.rmtree, self.folder, True)
                target = self.folder / f"v{len(self.paths)}.sqlite"
                build_variant(database, target, f"{seed}:{index}")
                self.paths[key] = target
            return self.paths[key]


_VARIANTS = _VariantStore()


def _normalise(rows: list[tuple], digits: int) -> list[tuple]:
    return [tuple(round(v, digits) if isinstance(v, float) else v for v in row) for row in rows]


def compare_results(predicted: list[tuple], reference: list[tuple], *, ordered: bool = False,
                    float_digits: int = 6) -> str | None:
    """None when the results agree (multisets, or lists when ordered), else what differs."""
    predicted, reference = _normalise(predicted, float_digits), _normalise(reference, float_digits)
    want, got = Counter(reference), Counter(predicted)
    if ordered and want == got:
        return None if predicted == reference else "the right rows in the wrong order"
    if want == got:
        return None
    missing, extra = sum((want - got).values()), sum((got - want).values())
    return f"{missing} expected rows missing and {extra} unexpected rows"


class SQLVerifier(RuleVerifier):
    """Predicted vs reference query results on a SQLite database and its hidden variants (module docstring).

    database: the SQLite file (the registry resolves it against the scenario folder).
    reference_field: item.metadata key of the reference query; item.answer is used when absent.
    variants: number of perturbed copies (0 compares on the original only: memorised answers pass).
    seed: seed of the perturbations. timeout_s / max_rows: limits per query run.
    ordered: compare rows in order. float_digits: floats are rounded to this many decimals.
    """

    kind = "sql"

    def __init__(self, database: str | Path, *, reference_field: str = "reference_query", variants: int = 2,
                 seed: int = 0, timeout_s: float = 2.0, max_rows: int = 10_000, ordered: bool = False,
                 float_digits: int = 6, name: str | None = None):
        super().__init__(name)
        self.database = Path(database).resolve()
        if not self.database.is_file():
            raise ValueError(f"database {str(self.database)!r} does not exist (give the path of a SQLite file)")
        if variants < 0 or max_rows < 1 or timeout_s <= 0:
            raise ValueError(f"need variants >= 0, max_rows >= 1, timeout_s > 0 (got {variants}, {max_rows}, "
                             f"{timeout_s})")
        self.reference_field, self.variants, self.seed = reference_field, variants, seed
        self.timeout_s, self.max_rows, self.ordered, self.float_digits = timeout_s, max_rows, ordered, float_digits
        self._reference_rows: dict[tuple[str, str], list[tuple]] = {}

    def _databases(self) -> list[tuple[str, Path]]:
        variants = [(f"variant {i + 1}", _VARIANTS.get(self.database, self.seed, i)) for i in range(self.variants)]
        return [("the original data", self.database)] + variants

    def _reference(self, path: Path, sql: str) -> list[tuple]:
        key = (str(path), sql)
        if key not in self._reference_rows:
            if len(self._reference_rows) > 64:
                self._reference_rows.clear()
            self._reference_rows[key] = run_query(path, sql, timeout_s=self.timeout_s, max_rows=self.max_rows)
        return self._reference_rows[key]

    def check(self, item: Item, candidate: Candidate) -> Judgment:
        reference = item.metadata.get(self.reference_field) or item.answer
        if not reference:
            return failed("error", f"no reference query: set item.metadata[{self.reference_field!r}] or item.answer")
        predicted = extract_sql(candidate.text)
        try:
            databases = self._databases()
        except (sqlite3.Error, OSError) as error:
            return failed("error", f"could not build the database variants: {error}")
        original, changed = None, 0
        for label, path in databases:
            try:
                wanted = self._reference(path, reference)
            except QueryError as error:
                status = "timeout" if error.kind == "timeout" else "error"
                return failed(status, f"the reference query failed on {label}: {error}")
            try:
                got = run_query(path, predicted, timeout_s=self.timeout_s, max_rows=self.max_rows)
            except QueryError as error:
                return passed(0.0, f"the predicted query failed on {label}: {error}", sql=predicted, failure=error.kind)
            difference = compare_results(got, wanted, ordered=self.ordered, float_digits=self.float_digits)
            if difference:
                return passed(0.0, f"results differ on {label}: {difference}", sql=predicted, mismatch=label)
            changed += original is not None and compare_results(wanted, original, ordered=self.ordered) is not None
            original = wanted if original is None else original
        return passed(1.0, f"same results on the original data and {self.variants} variants", sql=predicted,
                      discriminative_variants=changed)
