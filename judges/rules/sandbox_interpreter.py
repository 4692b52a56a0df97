"""Which Python the sandbox's child runs, and whether it may score code for this project.

The child is launched as `sys.executable`, but it is not always that interpreter which runs: as another
uid, a virtualenv whose base interpreter sits in a home folder of mode 0700 cannot be read, and the
kernel or the dynamic loader then falls back (pyenv's binary, say, loading the system's libpython and
standard library). So the child names what it is (judges/rules/sandbox_child.py, `_interpreter`)
before any candidate code is read, and the parent refuses a run whose major.minor differs from its
own: the standard library's behaviour, and so a candidate's score, would depend on it. A different
patch release (3.11.2 for 3.11.7) is allowed, and named in every result.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

# The probe isolation() launches once per level (the same facts as the child's first report).
PROBE_CODE = ("import json, os, sys\ntry:\n    exe = os.readlink('/proc/self/exe')\nexcept OSError:\n"
              "    exe = sys.executable\nprint(json.dumps({'executable': exe, 'version': sys.version.split()[0], "
              "'prefix': sys.prefix}))")


@dataclass(frozen=True)
class Interpreter:
    """A Python the sandbox ran: the file the kernel executed, its full version ("3.11.2") and the
    prefix whose standard library it imports."""

    executable: str
    version: str
    prefix: str

    @property
    def major_minor(self) -> tuple[int, int] | None:
        """(major, minor) read from `version`, or None when it cannot be read."""
        parts = self.version.split(".")
        digits = [int("".join(ch for ch in part if ch.isdigit()) or "-1") for part in parts[:2]]
        return (digits[0], digits[1]) if len(digits) == 2 and min(digits) >= 0 else None

    def __str__(self) -> str:
        return f"Python {self.version} ({self.executable}, standard library under {self.prefix})"


def ours() -> Interpreter:
    """The interpreter this process (the trainer, the verifier) runs."""
    return Interpreter(os.path.realpath(sys.executable), sys.version.split()[0], sys.prefix)


def parse(text: str) -> Interpreter | None:
    """The Interpreter of a child's JSON report, or None when it is not one."""
    try:
        found = json.loads(text)
    except ValueError:
        return None
    fields = ("executable", "version", "prefix")
    if not isinstance(found, dict) or not all(isinstance(found.get(name), str) for name in fields):
        return None
    return Interpreter(*(found[name][:1000] for name in fields))


def mismatch(found: Interpreter, ours_is: tuple[int, int] | None = None) -> str:
    """"" when `found` may run code for this process (the same major.minor as `ours_is`, by default this
    interpreter's; the patch release may differ), else one line saying what ran and how to fix it."""
    want_version = tuple(ours_is or sys.version_info[:2])
    if found.major_minor == want_version:
        return ""
    want = f"{want_version[0]}.{want_version[1]}"
    return (f"the sandbox ran Python {found.version} ({found.executable}), not Python {want} like this project "
            f"({ours().version}, {sys.executable}): let other users read and run {sys.base_prefix} "
            f"(chmod o+rx on it and the folders above it), or install Python {want} system-wide")
