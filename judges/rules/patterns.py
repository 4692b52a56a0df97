"""Regular expressions from scenario files, compiled with RE2 (google-re2): matching is linear time.

A backtracking engine (Python's `re`) can take exponential time on patterns like `(a+)+$` and model
output chosen to defeat them; RE2 cannot. RE2 has no backreferences or lookaround, so such a pattern
is refused when the scenario is validated, with the reason, rather than when it is first matched.

    pattern = compile_pattern(r"(?:DONE|ANSWER:.*)", dot_all=True)   # ValueError if RE2 refuses it
    pattern.fullmatch(text) is not None
"""

from __future__ import annotations

import re2

MAX_PATTERN_CHARS = 10_000
MAX_PROGRAM_BYTES = 8 << 20  # RE2's memory budget per pattern


def compile_pattern(pattern: str, *, dot_all: bool = False, ignore_case: bool = False):
    """`pattern` compiled by RE2; ValueError (one line, with the fix) when it cannot be."""
    if not isinstance(pattern, str):
        raise ValueError(f"a pattern must be text, got {type(pattern).__name__}")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"the pattern is {len(pattern):,} characters (at most {MAX_PATTERN_CHARS:,})")
    options = re2.Options()
    options.log_errors = False  # RE2 would print its own copy of the error on stderr
    options.dot_nl, options.case_sensitive = dot_all, not ignore_case
    options.max_mem = MAX_PROGRAM_BYTES
    try:
        return re2.compile(pattern, options)
    except re2.error as error:
        reason = error.args[0].decode(errors="replace") if error.args and isinstance(error.args[0], bytes) \
            else str(error)
        raise ValueError(f"pattern {pattern!r} is not a valid regular expression for RE2 ({reason}); RE2 has no "
                         "backreferences or lookaround: rewrite it without them") from None


def escape(text: str) -> str:
    """`text` as a pattern that matches it literally."""
    return re2.escape(text)
