"""The sandboxed half of the code-tests verifier: a harness that reports claimed values, nothing more.

`evaluate(code, expressions)` runs one sandbox process (judges.rules.sandbox) that loads `code` and
evaluates each expression (a test's call to the candidate's code, e.g. "add(2, 3)") in its namespace.
The harness sends, over the sandbox's result channel (file descriptor 3, never stdout), one record
per expression: the value's repr when it is plain data, or the name of the exception it raised.

Why it cannot be forged: what a candidate writes (to the channel, stdout, anywhere) is at most a claim
about what its code returned. Expected values, reference solutions and the checks themselves never
enter the process; the caller compares the claims with them OUTSIDE the sandbox. A candidate that
writes its own records only makes the report inconsistent (duplicates: `tampered`, scored 0), and
a claim it fabricates passes only if it is the right answer, which it would have to compute.

The harness binds what it uses (os.write, repr, type, ...) and a copy of the builtins before the
candidate's first line runs, and evaluates expressions with those builtins, so replacing
`builtins.enumerate` or `builtins.repr` changes nothing. A returned value counts as plain data only
if it is built of exact built-in types (checked by identity: an int subclass whose `__eq__` always
says True, or an object whose repr looks like the answer, is not the answer); its repr is then made
by the built-in types, never by code of the candidate. Other values are reported as their repr text
(kind "text"), which matches only an expected value that is not a literal. Exception names are
checked against the built-in exception classes, so no text of the candidate's choosing (a class it
named after an instruction) reaches a reason or a prompt.
"""

from __future__ import annotations

import ast
import builtins
import math
from fractions import Fraction
from dataclasses import dataclass, field
from typing import Any

from judges.rules.sandbox import SandboxError, run_python
from judges.types import candidate_input

REPR_LIMIT = 10_000
BUILTIN_EXCEPTIONS = frozenset(name for name, value in vars(builtins).items()
                               if isinstance(value, type) and issubclass(value, BaseException))
STATUS_WORDS = {"timeout": "timed out", "memory": "ran out of memory", "killed": "was killed by a signal",
                "error": "exited with an error", "blocked": "attempted a blocked action"}

_PROGRAM = r'''
def _harness(source, entry, expressions, limit):
    import builtins, os
    globals().pop("_harness", None)
    pristine = dict(builtins.__dict__)
    write, type_, repr_, len_, isinstance_ = os.write, type, repr, len, isinstance
    str_encode, dict_items, range_, compile_, exec_, eval_ = str.encode, dict.items, range, compile, exec, eval
    base, issubclass_ = BaseException, issubclass
    exceptions = [(value, name) for name, value in dict_items(pristine)
                  if isinstance_(value, type) and issubclass_(value, base)]
    str_encode("\u00e9", "unicode_escape"), str_encode("", "ascii")  # codec lookups run Python code: done now
    atoms = (int, float, complex, bool, str, bytes, type_(None))
    sequences = (list, tuple, set, frozenset)

    def emit(line):
        try:
            write(3, line + b"\n")
        except base:
            pass

    def name_of(error):
        kind = type_(error)
        for cls, name in exceptions:
            if cls is kind:
                return str_encode(name, "ascii")
        return b"?"

    def plain(value, depth, budget):
        kind = type_(value)
        budget[0] -= 1
        if budget[0] < 0 or depth > 50:
            return False
        for atom in atoms:
            if kind is atom:
                return True
        for sequence in sequences:
            if kind is sequence:
                for item in value:
                    if not plain(item, depth + 1, budget):
                        return False
                return True
        if kind is dict:
            for key, item in dict_items(value):
                if not plain(key, depth + 1, budget) or not plain(item, depth + 1, budget):
                    return False
            return True
        return False

    def record(value):
        verb = b"value " if plain(value, 0, [100000]) else b"text "
        shown = repr_(value)
        if type_(shown) is not str or len_(shown) > limit:
            return b"big"
        return verb + str_encode(shown, "unicode_escape")

    namespace = {"__name__": "solution", "__builtins__": builtins}
    try:
        exec_(compile_(source, "solution.py", "exec"), namespace)
    except base as error:
        emit(b"load-error " + name_of(error))
        return
    if entry is not None and entry not in namespace:
        emit(b"no-entry")
        return
    emit(b"loaded")
    view = dict(namespace)
    view.update(pristine)
    view["__builtins__"] = pristine
    for index in range_(len_(expressions)):
        head = str_encode(repr_(index)) + b" "
        try:
            value = eval_(compile_(expressions[index], "<test>", "eval"), view)
            line = record(value)
        except base as error:
            line = b"raise " + name_of(error)
        emit(head + line)
    emit(b"done")

_harness(__ARGUMENTS__)
'''


def build_program(code: str, expressions: list[str], entry: str | None = None) -> str:
    """The sandboxed program that loads `code` and reports each expression's value on fd 3."""
    arguments = ", ".join(map(repr, (code, entry, [str(e) for e in expressions], REPR_LIMIT)))
    return _PROGRAM.replace("__ARGUMENTS__", arguments)


@dataclass
class Claim:
    """What the candidate's process said one expression gave: kind value (plain data; `text` is its
    repr), text (repr of something else), raise (`text` is a built-in exception name or '?'), big
    (a repr over REPR_LIMIT), missing (no record: the run ended first)."""

    kind: str
    text: str = ""


@dataclass
class Evaluation:
    """One harness run: status (ok, or a sandbox status, or tampered), whether the code loaded, the
    load error's name, a missing entry, and one Claim per expression (only when status is ok)."""

    status: str
    loaded: bool = False
    load_error: str = ""
    no_entry: bool = False
    done: bool = False
    claims: list[Claim] = field(default_factory=list)
    blocked: str = ""
    stderr: str = ""
    layers: tuple[str, ...] = ()  # the sandbox layers that were active in the run


def exception_name(text: str) -> str:
    """`text` when it names a built-in exception class, else "?"."""
    return text if text in BUILTIN_EXCEPTIONS else "?"


def parse_channel(data: bytes, count: int) -> Evaluation:
    """The harness's records; a repeated, unknown or out-of-order record marks the run as tampered."""
    report, claims = Evaluation("ok"), {}
    for raw in data.decode("ascii", "replace").split("\n")[:-1]:  # a torn last line is left out
        verb, _, rest = raw.partition(" ")
        if verb == "load-error" and not (report.loaded or report.load_error):
            report.load_error = exception_name(rest)
        elif verb == "no-entry" and not (report.loaded or report.no_entry):
            report.no_entry = True
        elif verb == "loaded" and not (report.loaded or report.load_error or report.no_entry):
            report.loaded = True
        elif verb == "done" and report.loaded and not report.done and len(claims) == count:
            report.done = True
        elif verb.isdigit() and int(verb) == len(claims) and int(verb) < count and report.loaded:
            claims[int(verb)] = _claim(rest)
        else:
            return Evaluation("tampered")
    report.claims = [claims.get(index, Claim("missing")) for index in range(count)]
    return report


def _claim(rest: str) -> Claim:
    kind, _, payload = rest.partition(" ")
    if kind in ("value", "text"):
        return Claim(kind, payload.encode("ascii", "replace").decode("unicode_escape", "replace"))
    if kind == "raise":
        return Claim("raise", exception_name(payload))
    return Claim("big") if kind == "big" else Claim("missing")


def evaluate(code: str, expressions: list[str], *, entry: str | None = None, timeout_s: float = 10.0,
             cpu_s: float | None = None, memory_mb: int = 512, output_limit: int = 256_000) -> Evaluation:
    """Run `code` and report what each expression gave (module docstring). SandboxError propagates:
    the sandbox failing is not the candidate's fault and must not become a score."""
    result = run_python(build_program(code, expressions, entry), timeout_s=timeout_s,
                        cpu_s=cpu_s if cpu_s is not None else timeout_s, memory_mb=memory_mb,
                        output_limit=output_limit, channel=True)
    with candidate_input("the code's report"):  # bytes the candidate's process wrote: parsing them is its risk
        report = parse_channel(result.channel, len(expressions))
    if result.status != "ok" and report.status == "ok":
        report.status = result.status  # the records so far stay (a later expression hung or crashed)
    report.blocked, report.stderr, report.layers = result.blocked, result.stderr[-2000:], result.layers
    return report


# -- plain data outside the sandbox ---------------------------------------------------------------

_NAMED_FLOATS = {"nan": math.nan, "inf": math.inf}


def decode_literal(text: str) -> Any:
    """The plain value a repr text denotes (literals, nan/inf, set(), frozenset(...)); ValueError if
    it is anything else. Never runs code: it walks the parsed tree."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
        return _literal_node(tree.body)
    except (SyntaxError, MemoryError, RecursionError, TypeError, OverflowError) as error:
        raise ValueError(f"not a literal: {type(error).__name__}") from None


def _literal_node(node: ast.AST) -> Any:
    if isinstance(node, ast.Name) and node.id in _NAMED_FLOATS:
        return _NAMED_FLOATS[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _literal_node(node.operand)
        if isinstance(inner, (int, float, complex)) and not isinstance(inner, bool):
            return -inner if isinstance(node.op, ast.USub) else +inner
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        if node.func.id in ("set", "frozenset") and len(node.args) <= 1:
            kind = set if node.func.id == "set" else frozenset
            return kind(_literal_node(node.args[0])) if node.args else kind()
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [_literal_node(item) for item in node.elts]
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_literal_node(key): _literal_node(value) for key, value in zip(node.keys, node.values)}
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        left, right = _literal_node(node.left), _literal_node(node.right)
        if isinstance(right, complex) and isinstance(left, (int, float)) and not isinstance(left, bool):
            return left + right if isinstance(node.op, ast.Add) else left - right
    if isinstance(node, ast.Constant) and node.value is not Ellipsis:
        return node.value
    raise ValueError(f"not a literal: {ast.unparse(node)[:60]}")


def is_literal(text: str) -> bool:
    """Whether `text` is a plain-data literal (decode_literal accepts it)."""
    try:
        decode_literal(text)
        return True
    except ValueError:
        return False


def equal(got: Any, want: Any) -> bool:
    """Plain-data equality: floats within 1e-9 (nan equals nan), bools only equal bools, containers
    of the same kind compared item by item."""
    if isinstance(got, bool) or isinstance(want, bool):
        return isinstance(got, bool) and isinstance(want, bool) and got == want
    if isinstance(got, float) or isinstance(want, float):
        if isinstance(got, (int, float)) and isinstance(want, (int, float)):
            both_nan = isinstance(got, float) and isinstance(want, float) and math.isnan(got) and math.isnan(want)
            return both_nan or got == want or _close(got, want)
        return False
    if isinstance(got, (list, tuple)) and type(got) is type(want):
        return len(got) == len(want) and all(equal(g, w) for g, w in zip(got, want))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(equal(got[key], want[key]) for key in got)
    return type(got) is type(want) and got == want if isinstance(got, (set, frozenset, str, bytes)) else got == want


def _close(got: int | float, want: int | float) -> bool:
    """math.isclose (1e-9) of two numbers, one a float; an int too large for a float (10**400) is
    compared exactly as a fraction, so it is close only to what is as large (never OverflowError)."""
    try:
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)
    except OverflowError:
        if not all(math.isfinite(value) for value in (got, want) if isinstance(value, float)):
            return False  # inf or nan against an int: never close (equal ints and floats returned above)
        got_exact, want_exact = Fraction(got), Fraction(want)
        return abs(got_exact - want_exact) <= max(Fraction(1, 10**9), Fraction(1, 10**9) * max(abs(got_exact),
                                                                                             abs(want_exact)))


def claim_matches(claim: Claim, expected: str) -> bool:
    """Whether a claim is the expected value: plain data against a literal; repr text only against
    an expected value that is not a literal."""
    if claim.kind == "value":
        try:
            return equal(decode_literal(claim.text), decode_literal(expected))
        except ValueError:
            return False
    if claim.kind == "text":
        return not is_literal(expected) and claim.text.strip() == expected.strip()
    return False


__all__ = ["BUILTIN_EXCEPTIONS", "Claim", "Evaluation", "REPR_LIMIT", "SandboxError", "STATUS_WORDS",
           "build_program", "claim_matches", "exception_name", "decode_literal", "equal", "evaluate", "is_literal",
           "parse_channel"]
