"""SQL verifier on a real SQLite file: equivalence, hidden variants, read-only safety, timeouts."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest

from judges.rules.registry import build_scorer
from judges.rules.sql import QueryError, SQLVerifier, build_variant, compare_results, extract_sql, run_query
from judges.types import Candidate, Item

PARIS_NAMES = "SELECT name FROM customers WHERE city = 'Paris'"


@pytest.fixture
def database(tmp_path):
    path = tmp_path / "shop.sqlite"
    connection = sqlite3.connect(path)
    connection.executescript("""
        CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT, age INTEGER);
        CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id),
                             amount REAL, status TEXT);
    """)
    cities = ["Paris", "Lyon", "Nice", "Paris", "Lyon", "Nice", "Paris", "Lille", "Lyon", "Nice", "Lille", "Nice"]
    names = ["Alice", "Bob", "Chloe", "Denis", "Emma", "Farid", "Gina", "Hugo", "Ines", "Jules", "Karim", "Lea"]
    connection.executemany("INSERT INTO customers VALUES (?, ?, ?, ?)",
                           [(i + 1, name, city, 20 + 3 * i) for i, (name, city) in enumerate(zip(names, cities))])
    orders = [(i + 1, i % 12 + 1, round(10 + 7.5 * i, 2), ["paid", "shipped", "refunded"][i % 3]) for i in range(30)]
    connection.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", orders)
    connection.commit()
    connection.close()
    return path


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def score(verifier: SQLVerifier, text: str, reference: str = PARIS_NAMES):
    return verifier.score(Item("q", metadata={"reference_query": reference}), [Candidate(text)])[0]


def test_correct_and_equivalent_queries_pass(database):
    verifier = SQLVerifier(database)
    assert score(verifier, PARIS_NAMES).score == 1.0
    assert score(verifier, "```sql\nselect c.name from customers as c where c.city in ('Paris') order by age desc;\n```"
                 ).score == 1.0
    totals = "SELECT c.name, SUM(o.amount) FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.id"
    rewritten = ("SELECT name, (SELECT SUM(amount) FROM orders WHERE customer_id = customers.id) FROM customers "
                 "WHERE id IN (SELECT customer_id FROM orders)")
    judgment = score(verifier, rewritten, reference=totals)
    assert judgment.score == 1.0, judgment.rationale
    assert judgment.details["discriminative_variants"] == 2


def test_memorised_literal_results_fail_on_the_variants(database):
    verifier = SQLVerifier(database)
    literal = "SELECT 'Alice' UNION ALL SELECT 'Denis' UNION ALL SELECT 'Gina'"
    assert SQLVerifier(database, variants=0).score(
        Item("q", answer=PARIS_NAMES), [Candidate(literal)])[0].score == 1.0  # matches the original data
    judgment = score(verifier, literal)
    assert judgment.ok and judgment.score == 0.0 and "variant" in judgment.rationale
    count = score(verifier, "SELECT 30", reference="SELECT COUNT(*) FROM orders")
    assert count.score == 0.0 and "variant" in count.rationale


@pytest.mark.parametrize("text, reason", [
    ("SELECT name FROM customers WHERE city = 'Lyon'", "differ"),
    ("SELECT name, city FROM customers WHERE city = 'Paris'", "differ"),
    ("SELEC name FROM customers", "failed"),
    ("SELECT name FROM no_such_table", "failed"),
    ("", "failed"),
])
def test_wrong_or_broken_queries_score_zero(database, text, reason):
    judgment = score(SQLVerifier(database), text)
    assert judgment.ok and judgment.score == 0.0 and reason in judgment.rationale


@pytest.mark.parametrize("attack", [
    "DELETE FROM customers",
    "DROP TABLE customers",
    "UPDATE customers SET name = 'x'",
    "INSERT INTO customers VALUES (99, 'x', 'Paris', 1)",
    "SELECT name FROM customers WHERE city = 'Paris'; DROP TABLE customers",
    "CREATE TABLE t (x)",
    "ATTACH DATABASE 'other.sqlite' AS other",
    "PRAGMA query_only = OFF",
    "PRAGMA writable_schema = ON",
    "SELECT load_extension('x')",
    "BEGIN",
    "VACUUM",
])
def test_writes_are_impossible_and_score_zero(database, tmp_path, attack):
    before = digest(database)
    judgment = score(SQLVerifier(database, variants=1), attack)
    assert judgment.ok and judgment.score == 0.0
    assert digest(database) == before
    assert not (tmp_path / "other.sqlite").exists()
    rows = sqlite3.connect(database).execute("SELECT COUNT(*) FROM customers").fetchone()
    assert rows == (12,)


def test_an_endless_query_times_out_with_score_zero(database):
    endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT MAX(i) FROM n"
    judgment = score(SQLVerifier(database, timeout_s=0.3), endless)  # returns: the query was interrupted
    assert judgment.ok and judgment.score == 0.0 and "timed out" in judgment.rationale
    assert score(SQLVerifier(database), PARIS_NAMES).score == 1.0  # and scoring carries on


def test_too_many_rows_score_zero(database):
    cross = "SELECT a.id FROM orders a, orders b"
    judgment = score(SQLVerifier(database, max_rows=100), cross)
    assert judgment.score == 0.0 and "more than 100 rows" in judgment.rationale


def test_a_broken_or_missing_reference_is_a_failure_not_a_zero(database):
    verifier = SQLVerifier(database)
    broken = score(verifier, PARIS_NAMES, reference="SELECT nme FROM customers")
    assert broken.status == "error" and broken.score is None and "reference" in broken.rationale
    missing = verifier.score(Item("q"), [Candidate(PARIS_NAMES)])[0]
    assert missing.status == "error"
    endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT MAX(i) FROM n"
    assert score(SQLVerifier(database, timeout_s=0.2), PARIS_NAMES, reference=endless).status == "timeout"


def test_reference_from_item_answer_and_ordered_comparison(database):
    ordered_ref = "SELECT name FROM customers ORDER BY age"
    reversed_order = "SELECT name FROM customers ORDER BY age DESC"
    unordered, ordered = SQLVerifier(database), SQLVerifier(database, ordered=True)
    item = Item("q", answer=ordered_ref)
    assert unordered.score(item, [Candidate(reversed_order)])[0].score == 1.0
    assert ordered.score(item, [Candidate(reversed_order)])[0].score == 0.0
    assert ordered.score(item, [Candidate(ordered_ref)])[0].score == 1.0


def test_floats_compare_with_a_small_tolerance(database):
    reference = "SELECT AVG(amount) FROM orders"
    judgment = score(SQLVerifier(database), "SELECT SUM(amount) / COUNT(amount) + 1e-12 FROM orders", reference)
    assert judgment.score == 1.0
    assert compare_results([(1, 2.0)], [(1.0, 2)]) is None
    assert compare_results([(1,), (1,)], [(1,)]) is not None  # multisets, not sets


def test_variants_are_deterministic_cached_and_perturbed(database, tmp_path):
    first, second, other = tmp_path / "a.sqlite", tmp_path / "b.sqlite", tmp_path / "c.sqlite"
    build_variant(database, first, "0:0")
    build_variant(database, second, "0:0")
    build_variant(database, other, "1:0")
    query = "SELECT * FROM customers ORDER BY id"
    assert run_query(first, query) == run_query(second, query)
    assert run_query(first, query) != run_query(other, query) != run_query(database, query)
    orphans = "SELECT COUNT(*) FROM orders WHERE customer_id NOT IN (SELECT id FROM customers)"
    assert run_query(first, orphans) == [(0,)]  # joins stay consistent
    verifier = SQLVerifier(database)
    assert verifier._databases() == verifier._databases()


def test_extract_sql():
    assert extract_sql("Here:\n```sql\nSELECT 1;\n```\nthanks") == "SELECT 1"
    assert extract_sql("```\nSELECT 2\n```") == "SELECT 2"
    assert extract_sql("I would write\nSELECT a\nFROM t;") == "SELECT a\nFROM t"
    assert extract_sql("with x as (select 1) select * from x") == "with x as (select 1) select * from x"


def test_run_query_errors_have_kinds(database):
    with pytest.raises(QueryError) as error:
        run_query(database, "DROP TABLE customers")
    assert error.value.kind == "error"


def test_registry_resolves_the_database_against_the_scenario_folder(database):
    verifier = build_scorer("sql", {"database": database.name, "variants": 1}, base_dir=database.parent)
    assert score(verifier, PARIS_NAMES).score == 1.0


def _rows_of(blob_bytes: int, rows: int) -> str:
    return (f"SELECT zeroblob({blob_bytes}) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
            f"LIMIT {rows}) SELECT x FROM c)")


def test_a_result_past_the_byte_cap_stops_there_and_scores_zero(database):
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(QueryError) as error:  # 1000 rows of 100 kB (100 MB uncapped) against a 2 MB cap
            run_query(database, _rows_of(100_000, 1000), max_bytes=2_000_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (error.value.kind, str(error.value)) == ("size", "result too large")
    assert peak < 8_000_000  # the rows fetched were dropped at the cap, not all held
    assert len(run_query(database, _rows_of(1000, 100), max_bytes=2_000_000)) == 100  # under the cap: every row


def test_the_verifier_caps_a_repeated_blob_at_32_mb(database):
    judgment = score(SQLVerifier(database, variants=0), _rows_of(900_000, 10_000))  # 9 GB uncapped
    assert judgment.ok and judgment.score == 0.0 and judgment.rationale.endswith("result too large")


@pytest.mark.parametrize("query", [
    "SELECT zeroblob(2000000)",  # a value past the 1 MB length limit
    "SELECT " + ", ".join(["zeroblob(900000)"] * 200),  # more result columns than the database could need
])
def test_one_huge_value_or_row_is_refused_by_sqlite(database, query):
    with pytest.raises(QueryError) as error:
        run_query(database, query)
    assert error.value.kind == "error" and "too" in str(error.value)
