"""Code-tests verifier: run the candidate's code against hidden tests, with every verdict made outside it.

Tests (`tests=` or item.metadata["tests"]) are a list of entries, each one test:
- {"call": "add(2, 3)", "expected": "5"}: a call test. The call is evaluated in the candidate's
  sandboxed process and only the value's repr comes back (judges.rules.code_harness); the comparison with
  `expected` (a Python literal written as text, e.g. "5", "'abc'", "[1, 2]"; a non-string value such as
  5 or [1, 2] from YAML is taken as that value) happens OUTSIDE the sandbox, so the expected value never
  reaches the candidate's process. Plain data is compared with Python equality (floats within 1e-9,
  bools only with bools); a value that is not plain data matches only a non-literal expected text.
- "assert add(2, 3) == 5": a statement. `assert <expr> == <literal>` (either side) becomes a call
  test as above. Any other statement (`assert add(1, 1) > 1`, `assert not is_odd(2)`) is split: each
  expression rooted at a name the candidate defines (a call, attribute or subscript of it) is evaluated
  in the candidate's process, and the statement itself runs in a SECOND sandbox process that holds no
  candidate code, only those values as plain data. It passes when it runs without raising. So no
  object of the candidate's (an `__eq__` that always says True, a patched builtin) takes part in a check.
  Every such expression is evaluated, in order, even where the statement would short-circuit; one that
  uses a name the statement binds (a comprehension variable) is an error at parse time.
A single string is split into one statement per non-empty, non-comment line.

What the candidate writes (stdout, the result channel) can only be claims of values: no nonce, marker
or expected value exists in its process to forge or read. Score: the fraction of tests passed
(require_all=True: 1 only when all pass, else 0). It is 0 when the code does not load (syntax error,
exception at import, sys.exit), lacks the `entry` function (default: item.metadata["entry"]), times
out, runs out of memory, attempts a blocked action, or when its report is inconsistent (records it
forged). Running is not rewarded: code that defines nothing fails every test. A sandbox failure is a
failed Judgment, never a score. Rationales use fixed words, numbers and built-in exception names only,
so no text of the candidate's choosing reaches feedback built from them; details list, per test,
whether it passed and what came back (at most 200 characters), never the expected value.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from judges.rules import code_harness as harness
from judges.rules.code_harness import Claim, Evaluation, decode_literal, equal, is_literal
from judges.rules.basic import RuleVerifier
from judges.rules.sandbox import SandboxError
from judges.types import Candidate, Item, Judgment, candidate_input, failed, passed

_BUILTIN_NAMES = frozenset(dir(builtins))
_PLACEHOLDER = "__marl_value_{}"


@dataclass(frozen=True)
class TestCase:
    """One hidden test. kind "value": `source` is an expression, `expected` its repr. kind
    "statement": `source` the statement, `expressions` what runs in the candidate's process and
    `check` the statement with those replaced by placeholders (run without candidate code)."""

    kind: str
    source: str
    expected: str | None = None
    expressions: tuple[str, ...] = ()
    check: str = ""

    @property
    def calls(self) -> tuple[str, ...]:
        """The expressions evaluated in the candidate's process for this test."""
        return (self.source,) if self.kind == "value" else self.expressions


def _literal(node: ast.AST) -> bool:
    return is_literal(ast.unparse(node))


def _rooted(node: ast.AST, bound: set[str]) -> bool:
    """Whether `node` is a name the candidate defines, or a call/attribute/subscript chain on one."""
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in _BUILTIN_NAMES \
        and node.id not in bound and not node.id.startswith("__marl_")


class _Extractor(ast.NodeTransformer):
    def __init__(self, bound: set[str], statement: str):
        self.bound, self.statement, self.found = bound, statement, []

    def visit(self, node):
        if isinstance(node, ast.expr) and _rooted(node, self.bound):
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} & self.bound
            if used:
                raise ValueError(f"test {self.statement!r} calls the candidate's code with {sorted(used)[0]!r}, "
                                 "a name the statement binds; write one assert per value instead")
            self.found.append(ast.unparse(node))
            return ast.copy_location(ast.Name(id=_PLACEHOLDER.format(len(self.found) - 1), ctx=ast.Load()), node)
        return self.generic_visit(node)


def _split_statement(statement: str, tree: ast.Module) -> TestCase:
    if len(tree.body) != 1 or not isinstance(tree.body[0], (ast.Assert, ast.Expr, ast.Assign)):
        raise ValueError(f"test {statement!r} must be one assert, expression or assignment")
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    bound |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
    extractor = _Extractor(bound, statement)
    rewritten = extractor.visit(tree)
    return TestCase("statement", statement, None, tuple(extractor.found), ast.unparse(ast.fix_missing_locations(rewritten)))


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
                    return TestCase("value", ast.unparse(call), repr(decode_literal(ast.unparse(literal))))
    return _split_statement(statement, tree)


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


def values_match(got: str, expected: str) -> bool:
    """Whether a returned repr matches the expected literal (module docstring); texts that are not
    literals are compared as text."""
    try:
        return equal(decode_literal(got), decode_literal(expected))
    except ValueError:
        return got.strip() == expected.strip()


_CHECKER = r"""
def _check(cases):
    import os
    for index, (check, values) in enumerate(cases):
        try:
            scope = {"nan": float("nan"), "inf": float("inf")}
            data = {"__builtins__": {"set": set, "frozenset": frozenset}, "nan": scope["nan"], "inf": scope["inf"]}
            for number, text in enumerate(values):
                scope["__marl_value_%d" % number] = eval(text, data)
            exec(compile(check, "<test>", "exec"), scope)
            line = "%d pass" % index
        except BaseException as error:
            line = "%d raise %s" % (index, type(error).__name__)
        os.write(3, line.encode("ascii", "replace") + b"\n")

_check(__CASES__)
"""


def check_statements(batch: list[tuple[str, list[Claim]]], *, timeout_s: float, memory_mb: int) -> list[str]:
    """Run each (rewritten statement, claims of its expressions) in a sandbox process that holds no
    candidate code, only the claimed values re-written as literals; per statement, "pass" or
    "raise <built-in exception name or ?>" ("missing" when the run ended first). SandboxError propagates."""
    with candidate_input("the values the code returned"):
        cases = [(check, [repr(decode_literal(claim.text)) for claim in claims]) for check, claims in batch]
    result = harness.run_python(_CHECKER.replace("__CASES__", repr(cases)), timeout_s=timeout_s, cpu_s=timeout_s, memory_mb=memory_mb,
                                output_limit=64_000, channel=True)
    outcomes = ["missing"] * len(batch)
    for line in result.channel.decode("ascii", "replace").split("\n")[:-1]:
        index, _, outcome = line.partition(" ")
        if index.isdigit() and int(index) < len(batch):
            verb, _, name = outcome.partition(" ")
            outcomes[int(index)] = "pass" if verb == "pass" else "raise " + harness.exception_name(name)
    return outcomes


def _entry_of(configured: str | None, item: Item) -> str | None:
    entry = configured if configured is not None else item.metadata.get("entry")
    if entry is not None and not (isinstance(entry, str) and entry.isidentifier()):
        raise ValueError(f"entry must be a Python identifier (a function name), got {entry!r}")
    return entry


def _load_phrase(evaluation: Evaluation) -> str:
    name = evaluation.load_error
    return {"": "no report", "?": "an exception of a class it defined"}.get(name, name)


class CodeTestsVerifier(RuleVerifier):
    """Hidden tests run against the candidate's code in the sandbox (module docstring for the rules).

    tests: the tests for every item (default: item.metadata["tests"]). entry: the function the code
    must define (default: item.metadata["entry"], if any). timeout_s / cpu_s / memory_mb: sandbox
    limits for the whole run (cpu_s defaults to timeout_s). require_all: all-or-nothing instead of the
    fraction passed. output_limit: bytes of the result channel kept (the records must fit).
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
            cases, entry = self._cases(item), _entry_of(self.entry, item)
        except ValueError as error:
            return failed("error", str(error))
        if not cases:
            return failed("error", "the test list is empty")
        with candidate_input("the answer's code"):
            code = extract_code(candidate.text, entry)
        if not code.strip():
            return passed(0.0, "no code in the answer")
        try:
            evaluation = harness.evaluate(code, [call for case in cases for call in case.calls], entry=entry,
                                          timeout_s=self.timeout_s, cpu_s=self.cpu_s, memory_mb=self.memory_mb,
                                          output_limit=self.output_limit)
            refusal = self._refusal(evaluation, entry)
            return refusal if refusal is not None else self._grade(cases, evaluation)
        except SandboxError as error:
            return failed("error", f"sandbox failure: {error}")

    def _refusal(self, evaluation: Evaluation, entry: str | None) -> Judgment | None:
        """A zero for a run that did not report every test (None when it did)."""
        if evaluation.status == "tampered":
            return passed(0.0, "the code's report was inconsistent (it wrote result records itself)")
        if evaluation.status != "ok":
            why = harness.STATUS_WORDS.get(evaluation.status, evaluation.status)
            return passed(0.0, f"the code {why}" + (f" ({evaluation.blocked})" if evaluation.blocked else ""),
                          sandbox=evaluation.status, stderr=evaluation.stderr)
        if evaluation.no_entry:
            return passed(0.0, f"the code does not define {entry!r}")
        if not evaluation.loaded:
            return passed(0.0, f"the code failed to load ({_load_phrase(evaluation)})", stderr=evaluation.stderr)
        if not evaluation.done:
            return passed(0.0, "the run ended before all tests reported", stderr=evaluation.stderr)
        return None

    def _grade(self, cases: list[TestCase], evaluation: Evaluation) -> Judgment:
        with candidate_input("the values the code returned"):
            results, batch = self._compare(cases, evaluation)
        if batch:
            outcomes = check_statements([(check, claims) for _, check, claims in batch],
                                        timeout_s=self.timeout_s, memory_mb=self.memory_mb)
            for (index, _, _), outcome in zip(batch, outcomes):
                results[index].update(passed=outcome == "pass", outcome=outcome)
        count = sum(result["passed"] for result in results)
        score = float(count == len(cases)) if self.require_all else count / len(cases)
        return passed(score, f"{count}/{len(cases)} hidden tests passed", passed_tests=count, total=len(cases),
                      results=results, sandbox_layers=list(evaluation.layers))

    @staticmethod
    def _compare(cases: list[TestCase], evaluation: Evaluation) -> tuple[list[dict], list[tuple]]:
        """Per test, whether its value claim matches; statement tests whose claims are all plain data
        go in the batch for check_statements (they fail here until it says otherwise)."""
        results, batch, position = [], [], 0
        for index, case in enumerate(cases):
            claims = evaluation.claims[position:position + len(case.calls)]
            position += len(case.calls)
            shown = " ".join(f"{c.kind} {c.text}".strip() for c in claims)[:200]
            if case.kind == "value":
                results.append({"index": index, "passed": harness.claim_matches(claims[0], case.expected),
                                "returned": shown})
            elif all(claim.kind == "value" and is_literal(claim.text) for claim in claims):
                batch.append((index, case.check, claims))
                results.append({"index": index, "passed": False, "returned": shown})
            else:
                results.append({"index": index, "passed": False, "returned": shown})
        return results, batch
