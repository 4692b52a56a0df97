"""Rule verifiers: deterministic scorers under the same `Scorer` interface as model judges.

Every verifier is a `RuleVerifier` whose `score(item, candidates)` maps `check(item, candidate)`. A
wrong candidate gets `passed(0.0, why)`; a verifier that cannot decide (no reference answer, a broken
callable, an unexpected exception) gets `failed(...)`, which downstream is masked, never read as 0.
What the candidate produced is parsed and compared inside `candidate_input`: an exception there (its
text made a parser or a comparison raise) is the candidate's failure, a 0 with the reason, so no
candidate can turn its own 0 into a masked reward.

Answer extraction (`extract_answer`), used by exact, numeric, regex and json_schema:
1. if the text contains an answer marker (default "Final answer:", "Answer:", "####", any case), what
   follows the LAST marker on its line (when nothing does, the next non-empty line);
2. else, if the text contains LaTeX `\\boxed{...}`, the content of the last one; 3. else the last
   non-empty line. Surrounding whitespace, markdown bold, quotes/backticks and a trailing period go.
"""

from __future__ import annotations

import json
import math
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

from judges.rules.patterns import compile_pattern, escape as pattern_escape
from judges.types import Candidate, CandidateError, Item, Judgment, candidate_input, failed, passed

DEFAULT_MARKERS = ("final answer:", "answer:", "####")


def _boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for index in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth < 0:
            return text[begin:index]
    return None


def _clean(answer: str) -> str:
    previous = None
    while answer != previous:
        previous, answer = answer, answer.strip()
        if answer.endswith(".") and not answer.endswith(".."):
            answer = answer[:-1]
        if len(answer) >= 4 and answer.startswith("**") and answer.endswith("**"):
            answer = answer[2:-2]
        elif answer[:1] in ("\"", "'", "`"):
            quote = answer[0]
            lead, trail = len(answer) - len(answer.lstrip(quote)), len(answer) - len(answer.rstrip(quote))
            inner = answer[lead:len(answer) - trail]
            answer = inner if lead == trail and inner and quote not in inner else answer
    return answer


def extract_answer(text: str, markers: Sequence[str] = DEFAULT_MARKERS) -> str:
    """The final answer in `text` (see the module docstring for the rule)."""
    text = text or ""
    last = max((match.end() for marker in markers
                for match in re.finditer(re.escape(marker), text, flags=re.IGNORECASE)), default=None)
    if last is not None:
        line, _, after = text[last:].partition("\n")
        if line.strip():
            return _clean(line)
        following = [candidate for candidate in after.splitlines() if candidate.strip()]
        return _clean(following[0]) if following else ""
    boxed = _boxed(text)
    if boxed is not None:
        return _clean(boxed)
    lines = [line for line in text.splitlines() if line.strip()]
    return _clean(lines[-1]) if lines else ""


class RuleVerifier:
    """Base of the rule verifiers: `score` maps `check` over the candidates, catching failures."""

    kind = "rule"

    def __init__(self, name: str | None = None):
        self.name = name or self.kind

    def check(self, item: Item, candidate: Candidate) -> Judgment:
        """The judgment on one candidate (subclasses implement this)."""
        raise NotImplementedError

    def score(self, item: Item, candidates: Sequence[Candidate]) -> list[Judgment]:
        """One judgment per candidate. A CandidateError (the candidate's output made its parsing or
        comparison fail) is a 0 with its reason; any other exception is the verifier's failure:
        failed('error'), masked downstream, never 0."""
        judgments = []
        for candidate in candidates:
            try:
                judgment = self.check(item, candidate)
                if not isinstance(judgment, Judgment):
                    judgment = failed("error", f"{self.name}: check returned {type(judgment).__name__}")
            except CandidateError as error:  # the candidate's own failure: the 0 it earned
                judgment = passed(0.0, f"{self.name}: {error}", candidate_error=True)
            except Exception as error:  # the verifier's failure, not the candidate's
                judgment = failed("error", f"{self.name}: {type(error).__name__}: {error}")
            judgments.append(judgment)
        return judgments

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _strings(value: str | Sequence[str] | None, label: str) -> tuple[str, ...]:
    if value is None or isinstance(value, str):
        return () if value is None else (value,)
    if not all(isinstance(entry, str) for entry in value):
        raise TypeError(f"{label} must be a string or a list of strings, got {value!r}")
    return tuple(value)


class ExactVerifier(RuleVerifier):
    """The extracted answer equals the reference (item.answer, or `expected`, any of a list) after
    normalisation: case folding unless case_sensitive, whitespace runs collapsed to one space
    (collapse_whitespace), ASCII punctuation removed (strip_punctuation)."""

    kind = "exact"

    def __init__(self, expected: str | Sequence[str] | None = None, *, case_sensitive: bool = False,
                 collapse_whitespace: bool = True, strip_punctuation: bool = False,
                 markers: Sequence[str] = DEFAULT_MARKERS, name: str | None = None):
        super().__init__(name)
        self.expected = _strings(expected, "expected")
        self.case_sensitive, self.collapse_whitespace = case_sensitive, collapse_whitespace
        self.strip_punctuation, self.markers = strip_punctuation, _strings(markers, "markers")

    def normalise(self, text: str) -> str:
        """The comparison form of `text` under this verifier's options."""
        if self.strip_punctuation:
            text = text.translate(str.maketrans("", "", string.punctuation))
        if self.collapse_whitespace:
            text = " ".join(text.split())
        return text.strip() if self.case_sensitive else text.strip().casefold()

    def check(self, item: Item, candidate: Candidate) -> Judgment:
        if not self.expected and item.answer is None:
            return failed("error", "no reference answer: the item has no `answer` and no `expected` was given")
        references = self.expected or (str(item.answer),)
        with candidate_input("the answer"):
            answer = extract_answer(candidate.text, self.markers)
            if any(self.normalise(answer) == self.normalise(reference) for reference in references):
                return passed(1.0, "exact match", answer=answer)
            return passed(0.0, f"answer {answer[:80]!r} does not match the reference", answer=answer)


_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?", re.IGNORECASE)
_GROUPED = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def parse_number(text: str) -> float | None:
    """The number written in `text` (the whole text), or None.

    Accepts ints, decimals, scientific notation, fractions `a/b`, thousands separators (`1,234,567`,
    `1_000`), a leading currency sign ($, €, £) and a trailing `%` (kept as written: "50%" -> 50).
    Anything else ("42 or 43", "about 42") is not a number.
    """
    text = text.strip().replace("\u2212", "-")
    text = text[1:].strip() if text[:1] in ("$", "€", "£") else text
    text = text[:-1].strip() if text.endswith("%") else text
    if _GROUPED.fullmatch(text):
        text = text.replace(",", "")
    text = text.replace("_", "") if re.fullmatch(r"[+-]?\d+(?:_\d+)+", text) else text
    if _NUMBER.fullmatch(text):
        return float(text)
    fraction = re.fullmatch(r"([+-]?\d+)/(\d+)", text)
    if fraction and int(fraction.group(2)) != 0:
        return float(Fraction(int(fraction.group(1)), int(fraction.group(2))))
    return None


class NumericVerifier(RuleVerifier):
    """The extracted answer is a number within tolerance of the reference:
    |answer - reference| <= max(abs_tol, rel_tol * |reference|). See `parse_number` for the forms
    accepted; a non-number answer scores 0 (with a rationale), a non-number reference fails."""

    kind = "numeric"

    def __init__(self, expected: float | str | None = None, *, abs_tol: float = 1e-6, rel_tol: float = 1e-6,
                 markers: Sequence[str] = DEFAULT_MARKERS, name: str | None = None):
        super().__init__(name)
        if abs_tol < 0 or rel_tol < 0:
            raise ValueError(f"tolerances must be >= 0, got abs_tol={abs_tol}, rel_tol={rel_tol}")
        self.expected = None if expected is None else str(expected)
        self.abs_tol, self.rel_tol, self.markers = abs_tol, rel_tol, _strings(markers, "markers")

    def check(self, item: Item, candidate: Candidate) -> Judgment:
        reference_text = self.expected if self.expected is not None else item.answer
        reference = parse_number(str(reference_text)) if reference_text is not None else None
        if reference is None or not math.isfinite(reference):  # an infinite reference: any number is "within"
            return failed("error", f"the reference {str(reference_text)[:80]!r} is not a finite number")
        with candidate_input("the answer"):
            answer = extract_answer(candidate.text, self.markers)
            value = parse_number(answer)
            if value is None or math.isnan(value):
                return passed(0.0, f"answer {answer[:80]!r} is not a number", answer=answer)
            ok = abs(value - reference) <= max(self.abs_tol, self.rel_tol * abs(reference))  # inf - inf: NaN, not ok
            return passed(1.0 if ok else 0.0, f"{value:g} {'is' if ok else 'is not'} within tolerance of "
                          f"{reference:g}", answer=answer, value=value)


class RegexVerifier(RuleVerifier):
    """`re.fullmatch(pattern, extracted answer)` (never a search). `{answer}` in the pattern is replaced
    by the item's answer, regex-escaped. ignore_case adds re.IGNORECASE; whole_text matches the whole
    stripped text instead of the extracted answer."""

    kind = "regex"

    def __init__(self, pattern: str, *, ignore_case: bool = False, whole_text: bool = False,
                 markers: Sequence[str] = DEFAULT_MARKERS, name: str | None = None):
        super().__init__(name)
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a string, got {type(pattern).__name__}")
        self.ignore_case = ignore_case
        compile_pattern(pattern.replace("{answer}", "x"), ignore_case=ignore_case)  # RE2: linear-time matching
        self.pattern, self.whole_text, self.markers = pattern, whole_text, _strings(markers, "markers")

    def check(self, item: Item, candidate: Candidate) -> Judgment:
        pattern = self.pattern
        if "{answer}" in pattern:
            if item.answer is None:
                return failed("error", "the pattern uses {answer} but the item has no answer")
            pattern = pattern.replace("{answer}", pattern_escape(str(item.answer)))
        try:
            compiled = compile_pattern(pattern, dot_all=True, ignore_case=self.ignore_case)
        except ValueError as error:
            return failed("error", str(error))
        with candidate_input("the answer"):
            answer = (candidate.text or "").strip() if self.whole_text else extract_answer(candidate.text, self.markers)
            ok = compiled.fullmatch(answer) is not None
        return passed(1.0 if ok else 0.0, f"{answer[:80]!r} {'matches' if ok else 'does not match'} {pattern!r}",
                      answer=answer)


class ContainsVerifier(RuleVerifier):
    """The candidate text contains the substrings (mode "all": every one; "any": at least one).
    A weak check: a text that lists many possibilities passes too. Prefer exact/regex on the final
    answer when there is one."""

    kind = "contains"

    def __init__(self, substrings: str | Sequence[str], *, mode: str = "all", case_sensitive: bool = False,
                 name: str | None = None):
        super().__init__(name)
        self.substrings, self.mode, self.case_sensitive = _strings(substrings, "substrings"), mode, case_sensitive
        if not self.substrings or mode not in ("all", "any"):
            raise ValueError(f"contains needs at least one substring and mode 'all' or 'any' (got {substrings!r}, "
                             f"{mode!r})")

    def check(self, item: Item, candidate: Candidate) -> Judgment:
        text = candidate.text or ""
        fold = (lambda value: value) if self.case_sensitive else str.casefold
        with candidate_input("the text"):
            found = [s for s in self.substrings if fold(s) in fold(text)]
        missing = [s for s in self.substrings if s not in found]
        ok = not missing if self.mode == "all" else bool(found)
        return passed(1.0 if ok else 0.0, f"found {len(found)}/{len(self.substrings)} ({self.mode})",
                      found=found, missing=missing)


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool), "null": lambda v: v is None,
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer(),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}
SCHEMA_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "enum", "const", "items", "minItems", "maxItems",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "pattern",
    "title", "description", "$schema", "$id", "$comment", "default", "examples"})


def check_schema(schema: Any, path: str = "$") -> None:
    """Raise ValueError when `schema` uses keywords outside the supported subset (SCHEMA_KEYWORDS)."""
    if not isinstance(schema, dict):
        raise ValueError(f"schema at {path} must be an object, got {type(schema).__name__}")
    unknown = set(schema) - SCHEMA_KEYWORDS
    if unknown:
        raise ValueError(f"schema at {path} uses unsupported keywords {sorted(unknown)}; "
                         f"supported: {sorted(SCHEMA_KEYWORDS)}")
    types = schema.get("type", [])
    for name in [types] if isinstance(types, str) else types:
        if name not in _JSON_TYPES:
            raise ValueError(f"schema at {path}: unknown type {name!r} (known: {sorted(_JSON_TYPES)})")
    if "pattern" in schema:
        compile_pattern(schema["pattern"])  # refused now, not when the first answer is checked
    nested = [(key, sub) for key, sub in schema.get("properties", {}).items()]
    nested += [(key, schema[key]) for key in ("items", "additionalProperties") if isinstance(schema.get(key), dict)]
    for key, sub in nested:
        check_schema(sub, f"{path}.{key}")


def validate_json(value: Any, schema: dict, path: str = "$") -> str | None:
    """The first violation of `schema` by `value` as a message, or None when valid (supported subset)."""
    types = schema.get("type")
    if types is not None and not any(_JSON_TYPES[t](value) for t in ([types] if isinstance(types, str) else types)):
        return f"{path}: expected {types}, got {type(value).__name__}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path}: {value!r} is not one of {schema['enum']}"
    if "const" in schema and value != schema["const"]:
        return f"{path}: expected {schema['const']!r}"
    bounds = (("minimum", lambda b: value < b), ("maximum", lambda b: value > b),
              ("exclusiveMinimum", lambda b: value <= b), ("exclusiveMaximum", lambda b: value >= b))
    for key, bad in bounds if _JSON_TYPES["number"](value) else ():
        if key in schema and bad(schema[key]):
            return f"{path}: {value} violates {key} {schema[key]}"
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", math.inf):
            return f"{path}: length {len(value)} outside [minLength, maxLength]"
        if "pattern" in schema and not compile_pattern(schema["pattern"]).search(value):
            return f"{path}: {value[:40]!r} does not match pattern {schema['pattern']!r}"
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", math.inf):
            return f"{path}: {len(value)} items outside [minItems, maxItems]"
        for index, entry in enumerate(value):
            if isinstance(schema.get("items"), dict) and (error := validate_json(entry, schema["items"],
                                                                                 f"{path}[{index}]")):
                return error
    if isinstance(value, dict):
        return _validate_object(value, schema, path)
    return None


def _validate_object(value: dict, schema: dict, path: str) -> str | None:
    missing = [key for key in schema.get("required", []) if key not in value]
    if missing:
        return f"{path}: missing required {missing}"
    properties, extra = schema.get("properties", {}), schema.get("additionalProperties", True)
    for key, entry in value.items():
        if key in properties:
            error = validate_json(entry, properties[key], f"{path}.{key}")
        elif extra is False:
            error = f"{path}: unexpected property {key!r}"
        else:
            error = validate_json(entry, extra, f"{path}.{key}") if isinstance(extra, dict) else None
        if error:
            return error
    return None


def extract_json(text: str, markers: Sequence[str] = DEFAULT_MARKERS) -> Any:
    """The JSON value in `text`: the last ```json fence, else the extracted answer, else the span from
    the first '{' to the last '}'. Raises ValueError when none parses."""
    fences = re.findall(r"```(?:json)?\s*\n(.*?)```", text or "", flags=re.DOTALL | re.IGNORECASE)
    attempts = fences[-1:] + [extract_answer(text, markers)]
    if "{" in (text or "") and "}" in text:
        attempts.append(text[text.index("{"):text.rindex("}") + 1])
    for attempt in attempts:
        try:
            return json.loads(attempt)
        except (ValueError, TypeError):
            continue
    raise ValueError("no parsable JSON found")


class JSONSchemaVerifier(RuleVerifier):
    """The candidate's JSON (see `extract_json`) validates against `schema`, a JSON Schema restricted
    to SCHEMA_KEYWORDS (type, properties, required, additionalProperties, enum, const, items,
    min/maxItems, minimum/maximum, exclusiveMinimum/Maximum, min/maxLength, pattern (a search, as
    in JSON Schema)). Unsupported keywords are refused when the verifier is built."""

    kind = "json_schema"

    def __init__(self, schema: dict, *, markers: Sequence[str] = DEFAULT_MARKERS, name: str | None = None):
        super().__init__(name)
        check_schema(schema)
        self.schema, self.markers = schema, _strings(markers, "markers")

    def check(self, item: Item, candidate: Candidate) -> Judgment:
        with candidate_input("the JSON answer"):
            try:
                value = extract_json(candidate.text, self.markers)
            except ValueError:
                return passed(0.0, "no parsable JSON in the answer")
            error = validate_json(value, self.schema)  # deep nesting: RecursionError, the candidate's 0
            return passed(0.0 if error else 1.0, error or "valid", value=value)


class CallableVerifier(RuleVerifier):
    """A Python function `fn(item, candidate)` returning a bool, a number in [0, 1] or a Judgment.
    A return outside that (None, NaN, 1.5, a string) is the function's failure: failed('error'), as
    is an exception it raises, except a judges.types.CandidateError (raise it, or parse the
    candidate's output inside `candidate_input`, for a failure the candidate caused: a 0)."""

    kind = "callable"

    def __init__(self, function: Callable[[Item, Candidate], Any], *, name: str | None = None):
        if not callable(function):
            raise TypeError(f"function must be callable, got {type(function).__name__} (the registry resolves "
                            "'module:function' strings)")
        super().__init__(name or getattr(function, "__name__", None))
        self.function = function

    def check(self, item: Item, candidate: Candidate) -> Judgment:
        result = self.function(item, candidate)
        if isinstance(result, Judgment):
            return result
        if isinstance(result, (bool, int, float)) and 0.0 <= result <= 1.0:  # NaN fails the test
            return passed(float(result), f"{self.name} returned {result}")
        return failed("error", f"{self.name} returned {result!r}; expected a bool, a number in [0, 1] or a Judgment")


def _matched_in_order(required: Sequence[str], calls: Sequence[str]) -> int:
    """Length of the longest common subsequence of `required` and `calls`."""
    previous = [0] * (len(calls) + 1)
    for need in required:
        current = [0]
        for index, call in enumerate(calls):
            current.append(previous[index] + 1 if need == call else max(previous[index + 1], current[-1]))
        previous = current
    return previous[-1]


class ToolUseVerifier(RuleVerifier):
    """The candidate made the required tool calls; only successful calls (ok=True) count, optionally
    only those of one agent (`caller`). Score = fraction of `required` satisfied: unordered, each
    required name (with multiplicity) matched by a call; ordered, the longest subsequence of
    `required` found in call order. A call to a `forbidden` tool makes the score 0."""

    kind = "tool_use"

    def __init__(self, required: Sequence[str], *, ordered: bool = False, forbidden: Sequence[str] = (),
                 caller: str | None = None, name: str | None = None):
        super().__init__(name)
        self.required, self.forbidden = _strings(required, "required"), _strings(forbidden, "forbidden")
        if not self.required:
            raise ValueError("tool_use needs at least one required tool name")
        self.ordered, self.caller = ordered, caller

    def check(self, item: Item, candidate: Candidate) -> Judgment:
        with candidate_input("the tool calls"):
            calls = [str(call.name) for call in candidate.tool_calls
                     if call.ok and (self.caller is None or call.agent == self.caller)]
        banned = sorted(set(calls) & set(self.forbidden))
        if banned:
            return passed(0.0, f"called forbidden tools {banned}", calls=calls)
        matched = _matched_in_order(self.required, calls) if self.ordered else sum(
            (Counter(self.required) & Counter(calls)).values())
        return passed(matched / len(self.required), f"{matched}/{len(self.required)} required tool calls "
                      f"{'in order ' if self.ordered else ''}made successfully", calls=calls)


def process_text(candidate: Candidate) -> str:
    """The text process markers are looked for in: the reasoning, else the transcript's messages joined."""
    return candidate.reasoning or "\n".join(message.get("text", "") for message in candidate.transcript)


class ProcessVerifier(RuleVerifier):
    """Key steps found in the reasoning (`process_text`): score = fraction of `markers` found. Markers
    are phrases (case-insensitive, any whitespace between words) or, with regex=True, regular
    expressions searched for. The credit for a correct answer without process markers (1/3) is
    applied by the reward layer (marl.rewards), not here."""

    kind = "process"

    def __init__(self, markers: Sequence[str], *, regex: bool = False, name: str | None = None):
        super().__init__(name)
        self.markers = _strings(markers, "markers")
        if not self.markers:
            raise ValueError("process needs at least one marker")
        self.patterns = [compile_pattern(marker if regex else r"\s+".join(map(pattern_escape, marker.split())),
                                         ignore_case=True) for marker in self.markers]

    def check(self, item: Item, candidate: Candidate) -> Judgment:
        with candidate_input("the reasoning"):
            text = process_text(candidate)
            found = [marker for marker, pattern in zip(self.markers, self.patterns) if pattern.search(text)]
        return passed(len(found) / len(self.markers), f"{len(found)}/{len(self.markers)} process markers found",
                      found=found, missing=[m for m in self.markers if m not in found])


class FormatVerifier(RuleVerifier):
    """Format checks on the whole text; score = fraction of the configured checks that pass:
    max_chars / min_chars (length of the stripped text), pattern (re.fullmatch on the stripped text,
    DOTALL), require_marker (an answer marker is present), forbidden (none of these substrings)."""

    kind = "format"

    def __init__(self, *, max_chars: int | None = None, min_chars: int | None = None, pattern: str | None = None,
                 require_marker: bool = False, forbidden: Sequence[str] = (),
                 markers: Sequence[str] = DEFAULT_MARKERS, name: str | None = None):
        super().__init__(name)
        self.max_chars, self.min_chars, self.require_marker = max_chars, min_chars, require_marker
        self.forbidden, self.markers = _strings(forbidden, "forbidden"), _strings(markers, "markers")
        self.pattern = compile_pattern(pattern, dot_all=True) if pattern is not None else None
        if not self._checks(""):
            raise ValueError("format needs at least one check: max_chars, min_chars, pattern, require_marker "
                             "or forbidden")

    def _checks(self, text: str) -> dict[str, bool]:
        stripped = text.strip()
        checks = {  # name -> (configured, passes)
            "max_chars": (self.max_chars is not None, lambda: len(stripped) <= self.max_chars),
            "min_chars": (self.min_chars is not None, lambda: len(stripped) >= self.min_chars),
            "pattern": (self.pattern is not None, lambda: self.pattern.fullmatch(stripped) is not None),
            "marker": (self.require_marker, lambda: any(m.casefold() in text.casefold() for m in self.markers)),
            "forbidden": (bool(self.forbidden), lambda: not any(word in text for word in self.forbidden))}
        return {name: test() for name, (configured, test) in checks.items() if configured}

    def check(self, item: Item, candidate: Candidate) -> Judgment:
        with candidate_input("the text"):
            checks = self._checks(candidate.text or "")
        failures = [name for name, ok in checks.items() if not ok]
        return passed(1 - len(failures) / len(checks), f"failed: {failures}" if failures else "format ok",
                      checks=checks)
