"""Code-tests verifier: run the candidate's code against hidden tests in the sandbox (judges.sandbox).

Tests (`tests=` or item.metadata["tests"]) are a list of entries, each one test:
- {"call": "add(2, 3)", "expected": "5"}: the call is evaluated in the sandbox and its repr is sent
  out; the comparison with `expected` (a Python literal written as text, e.g. "5", "'abc'", "[1, 2]";
  a non-string value such as 5 or [1, 2] from YAML is taken as that value) happens OUTSIDE the
  sandbox, so the expected value never reaches the candidate's process. Literals are compared with
  Python equality (floats with a relative/absolute tolerance of 1e-9); anything else by its repr text.
- "assert add(2, 3) == 5": a statement. `assert <expr> == <literal>` (either side) becomes a call
  test as above; any other statement passes when it runs without raising.
A single string is split into one statement per non-empty, non-comment line.

The harness prints one result line per test tagged with a random nonce (read from a file it deletes
before the candidate's code runs; the candidate's stdout goes to /dev/null), so printing "PASSED"
earns nothing. Statement tests rely on that nonce staying secret, which the sandbox makes hard but
cannot promise; call tests are unforgeable either way, so prefer them.

Score: the fraction of tests passed (require_all=True: 1 only when all pass, else 0). It is 0 when the
code does not load (syntax error, exception at import, sys.exit), lacks the `entry` function, times
out, runs out of memory, attempts a blocked action, or when the harness does not finish or its
output is tampered with. Running is not rewarded: code that defines nothing (or only `pass`) fails
every test. Judgment details list, per test, whether it passed and what came back, never the expected
value (so that feedback built from details cannot leak hidden answers).
"""

from __future__ import annotations

import ast
import math
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from judges.rules import RuleVerifier
from judges.sandbox import SandboxError, run_python
from judges.types import Candidate, Item, Judgment, failed, passed

_REPR_LIMIT = 10_000


@dataclass(frozen=True)
class TestCase:
    """One hidden test: kind "value" (source is an expression, expected its repr) or "statement"."""

    kind: str
    source: str
    expected: str | None = None


def _literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
        return True
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return False


def _statement_case(statement: str) -> TestCase:
    try:
        tree = ast.parse(statement)
    except SyntaxError as error:
        raise ValueError(f"test {statement!r} is not valid Python: {error.msg}") from None
    if len(tree.body) == 1 and isinstance(tree.body[0], ast.Assert) and tree.body[0].msg is None:
        test = tree.body[0].test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            for call, literal in ((test.left, test.comparators[0]), (test.comparators[0], test.left)):
                if _literal(literal) and not _literal(call):
                    return TestCase("value", ast.unparse(call), repr(ast.literal_eval(literal)))
    return TestCase("statement", statement)


def parse_tests(tests: Any) -> list[TestCase]:
    """The test cases of a `tests` value (format in the module docstring); ValueError when malformed."""
    if isinstance(tests, str):
        tests = [line for line in tests.splitlines() if line.strip() and not line.strip().startswith("#")]
    if not isinstance(tests, (list, tuple)):
        raise ValueError(f"tests must be a list (of {{call, expected}} objects or statements), got "
                         f"{type(tests).__name__}")
    cases = []
    for entry in tests:
        if isinstance(entry, TestCase):
            cases.append(entry)
        elif isinstance(entry, str):
            cases.append(_statement_case(entry))
        elif isinstance(entry, dict) and set(entry) == {"call", "expected"} and isinstance(entry["call"], str):
            try:
                ast.parse(entry["call"], mode="eval")
            except SyntaxError as error:
                raise ValueError(f"test call {entry['call']!r} is not a Python expression: {error.msg}") from None
            expected = entry["expected"] if isinstance(entry["expected"], str) else repr(entry["expected"])
            cases.append(TestCase("value", entry["call"], expected))
        else:
            raise ValueError(f"test {entry!r} must be a statement string or {{'call': ..., 'expected': ...}}")
    return cases


def extract_code(text: str, entry: str | None = None) -> str:
    """The candidate's code: among ```python (or ```py, or bare ```) fences, the last that defines
    `entry` (else the last with a def/class, else the last); without fences, the whole text."""
    text = text or ""
    fences = re.findall(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", text, flags=re.DOTALL)
    blocks = [body for language, body in fences if language.lower() in ("python", "py", "python3", "")]
    if not blocks:
        unclosed = re.match(r"\s*```[ \t]*(?:python3?|py)?[ \t]*\n(.*)\Z", text, flags=re.DOTALL)
        return unclosed.group(1) if unclosed else text
    if entry:
        defining = [b for b in blocks if re.search(rf"\b(def|class)\s+{re.escape(entry)}\b", b)]
        if defining:
            return defining[-1]
    with_definitions = [b for b in blocks if re.search(r"^\s*(def|class)\s", b, flags=re.MULTILINE)]
    return (with_definitions or blocks)[-1]


_HARNESS = '''
def _harness():
    import builtins, os
    globals().pop("_harness", None)
    write, encode, text, base, kind_of, is_callable = os.write, str.encode, str, BaseException, type, callable
    compile_, exec_, eval_, repr_ = compile, exec, eval, repr
    with open(".nonce", "rb") as handle:
        nonce = handle.read().strip()
    os.remove(".nonce")
    out, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)

    def emit(line):
        try:
            write(out, b"\\n" + nonce + b" " + line + b"\\n")
        except base:
            pass

    def name_of(error):
        try:
            return encode(text.__str__(kind_of(error).__name__), "ascii", "replace")[:80]
        except base:
            return b"?"

    namespace = {{"__name__": "solution", "__builtins__": builtins}}
    try:
        exec_(compile_({source!r}, "solution.py", "exec"), namespace)
    except base as error:
        emit(b"load-error " + name_of(error))
        return
    emit(b"loaded")
    if {entry!r} is not None and not is_callable(namespace.get({entry!r})):
        emit(b"no-entry")
        return
    for index, (kind, source) in enumerate({cases!r}):
        head = encode(text(index)) + b" "
        try:
            if kind == "value":
                value = eval_(compile_(source, "<test>", "eval"), namespace)
                shown = text.__getitem__(repr_(value), slice(0, {limit}))
                emit(head + b"value " + encode(shown, "unicode_escape"))
            else:
                exec_(compile_(source, "<test>", "exec"), namespace)
                emit(head + b"pass")
        except base as error:
            emit(head + b"raise " + name_of(error))
    emit(b"done")

_harness()
'''


def build_harness(code: str, cases: Sequence[TestCase], entry: str | None = None) -> str:
    """The sandboxed program that loads `code` and reports each test (expected values stay out)."""
    return _HARNESS.format(source=code, entry=entry, cases=[(case.kind, case.source) for case in cases],
                           limit=_REPR_LIMIT)


def _equal(got: Any, want: Any) -> bool:
    if isinstance(got, float) or isinstance(want, float):
        if isinstance(got, (int, float)) and isinstance(want, (int, float)):
            return got == want or math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)
        return False
    if isinstance(got, (list, tuple)) and type(got) is type(want):
        return len(got) == len(want) and all(_equal(g, w) for g, w in zip(got, want))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(_equal(got[key], want[key]) for key in got)
    return got == want


def values_match(got: str, expected: str) -> bool:
    """Whether a returned repr matches the expected literal (module docstring)."""
    try:
        return _equal(ast.literal_eval(got), ast.literal_eval(expected))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return got.strip() == expected.strip()


@dataclass
class _Report:
    loaded: bool = False
    load_error: str = ""
    no_entry: bool = False
    done: bool = False
    tampered: bool = False
    outcomes: dict[int, tuple[str, str]] | None = None


def parse_report(stdout: str, nonce: str, count: int) -> _Report:
    """The harness's nonce-tagged lines; any duplicate or unknown line marks the output as tampered."""
    report, outcomes = _Report(), {}
    for line in re.findall(rf"^{re.escape(nonce)} (.*)$", stdout, flags=re.MULTILINE):
        verb, _, rest = line.partition(" ")
        if verb in ("loaded", "done", "no-entry", "load-error"):
            attribute = {"loaded": "loaded", "done": "done", "no-entry": "no_entry", "load-error": "load_error"}[verb]
            report.tampered |= bool(getattr(report, attribute))
            setattr(report, attribute, rest or True)
        elif verb.isdigit() and int(verb) < count and int(verb) not in outcomes:
            kind, _, payload = rest.partition(" ")
            outcomes[int(verb)] = (kind, payload)
        else:
            report.tampered = True
    report.outcomes = outcomes
    return report


_STATUS_WORDS = {"timeout": "timed out", "memory": "ran out of memory", "killed": "was killed by a signal",
                 "error": "exited with an error", "blocked": "attempted a blocked action"}


class CodeTestsVerifier(RuleVerifier):
    """Hidden tests run against the candidate's code in the sandbox (module docstring for the rules).

    tests: the tests for every item (default: item.metadata["tests"]). entry: the function the code
    must define. timeout_s / cpu_s / memory_mb: sandbox limits for the whole run (cpu_s defaults to
    timeout_s). require_all: all-or-nothing instead of the fraction passed. output_limit: bytes of
    output kept (the result lines must fit).
    """

    kind = "code_tests"

    def __init__(self, tests: Any = None, *, entry: str | None = None, timeout_s: float = 10.0,
                 cpu_s: float | None = None, memory_mb: int = 512, require_all: bool = False,
                 output_limit: int = 256_000, name: str | None = None):
        super().__init__(name)
        if entry is not None and not str(entry).isidentifier():
            raise ValueError(f"entry must be a Python identifier (a function name), got {entry!r}")
        if timeout_s <= 0 or memory_mb < 64:
            raise ValueError(f"need timeout_s > 0 and memory_mb >= 64 (got {timeout_s}, {memory_mb})")
        self.cases = parse_tests(tests) if tests is not None else None
        self.entry, self.timeout_s, self.cpu_s = entry, timeout_s, cpu_s if cpu_s is not None else timeout_s
        self.memory_mb, self.require_all, self.output_limit = memory_mb, require_all, output_limit

    def _cases(self, item: Item) -> list[TestCase]:
        if self.cases is not None:
            return self.cases
        if "tests" not in item.metadata:
            raise ValueError("no tests: give `tests` to the verifier or item.metadata['tests']")
        return parse_tests(item.metadata["tests"])

    def check(self, item: Item, candidate: Candidate) -> Judgment:
        try:
            cases = self._cases(item)
        except ValueError as error:
            return failed("error", str(error))
        if not cases:
            return failed("error", "the test list is empty")
        code = extract_code(candidate.text, self.entry)
        if not code.strip():
            return passed(0.0, "no code in the answer")
        nonce = secrets.token_hex(16)
        try:
            result = run_python(build_harness(code, cases, self.entry), files={".nonce": nonce},
                                timeout_s=self.timeout_s, cpu_s=self.cpu_s, memory_mb=self.memory_mb,
                                output_limit=self.output_limit)
        except SandboxError as error:
            return failed("error", f"sandbox failure: {error}")
        if result.status != "ok":
            why = _STATUS_WORDS.get(result.status, result.status)
            return passed(0.0, f"the code {why}" + (f" ({result.blocked})" if result.blocked else ""),
                          sandbox=result.status, stderr=result.stderr[-2000:])
        return self._grade(parse_report(result.stdout, nonce, len(cases)), cases, result.stderr)

    def _grade(self, report: _Report, cases: list[TestCase], stderr: str) -> Judgment:
        if report.tampered:
            return passed(0.0, "the harness output was tampered with (duplicate or unknown result lines)")
        if not report.loaded:
            return passed(0.0, f"the code failed to load ({report.load_error or 'no result'})",
                          stderr=stderr[-2000:])
        if report.no_entry:
            return passed(0.0, f"the code does not define a callable {self.entry!r}")
        if not report.done:
            return passed(0.0, "the run ended before all tests reported", stderr=stderr[-2000:])
        results = []
        for index, case in enumerate(cases):
            kind, payload = report.outcomes.get(index, ("missing", ""))
            if kind == "value":
                shown = payload.encode("ascii", "replace").decode("unicode_escape", "replace")
                ok = case.kind == "value" and values_match(shown, case.expected)
                results.append({"index": index, "passed": ok, "returned": shown[:200]})
            else:
                ok = kind == "pass" and case.kind == "statement"
                results.append({"index": index, "passed": ok, "outcome": f"{kind} {payload}".strip()})
        count = sum(result["passed"] for result in results)
        score = float(count == len(cases)) if self.require_all else count / len(cases)
        return passed(score, f"{count}/{len(cases)} hidden tests passed", passed_tests=count, total=len(cases),
                      results=results)
