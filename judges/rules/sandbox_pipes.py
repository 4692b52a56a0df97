"""The pipes between the sandbox's parent and its child, and what the child's bootstrap reports.

`Pipes` makes the control pipe (the bootstrap's reports, fd sandbox_child.CONTROL_FD in the child) and
the optional result channel (fd CHANNEL_FD); `Capture` drains them with stdout and stderr, each capped;
`read_control` reads the bootstrap's lines (judges/rules/sandbox_child.py's docstring lists them).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
from dataclasses import dataclass

from judges.rules import sandbox_child as child
from judges.rules import sandbox_interpreter as interpreters
from judges.rules.sandbox_interpreter import Interpreter
from judges.rules.sandbox_layers import REPORTED_LAYERS

CONTROL_LIMIT = 4096
DIAGNOSTICS = ("audit",)


class Capture:
    """Reads the child's pipes without blocking: stdout and stderr (at most `limit` bytes each, else
    `truncated`), the control pipe (at most CONTROL_LIMIT) and the optional result channel (`limit`)."""

    def __init__(self, proc: subprocess.Popen, limit: int, control: int, channel: int | None):
        self.truncated = False
        streams = {"stdout": proc.stdout.fileno(), "stderr": proc.stderr.fileno(), "control": control}
        if channel is not None:
            streams["channel"] = channel
        self.names = {fd: name for name, fd in streams.items()}
        self.limits = {name: (CONTROL_LIMIT if name == "control" else limit) for name in streams}
        self.data = {name: bytearray() for name in streams}
        self.selector = selectors.DefaultSelector()
        for fd in self.names:
            self.selector.register(fd, selectors.EVENT_READ)

    @property
    def open(self) -> bool:
        """Whether a pipe is still open (its writers have not all closed it)."""
        return bool(self.selector.get_map())

    def pump(self, wait: float) -> None:
        """Read what is available within `wait` seconds."""
        for key, _ in self.selector.select(timeout=max(wait, 0.0)):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                self.selector.unregister(key.fileobj)
                continue
            name = self.names[key.fd]
            buffer = self.data[name]
            room = self.limits[name] - len(buffer)
            if name in ("stdout", "stderr"):
                self.truncated |= len(chunk) > room
            buffer += chunk[:max(room, 0)]

    def text(self, name: str) -> str:
        """What came through pipe `name`, decoded (undecodable bytes replaced)."""
        return bytes(self.data[name]).decode("utf-8", "replace")


class Pipes:
    """The control pipe (the bootstrap's reports) and the optional result channel; the parent keeps
    the read ends, the child inherits the write ends."""

    def __init__(self, channel: bool):
        self.control_r, self.control_w = os.pipe()
        self.channel_r, self.channel_w = os.pipe() if channel else (None, None)

    def child_ends(self) -> tuple[int, ...]:
        """The write ends, for the child to inherit."""
        return tuple(fd for fd in (self.control_w, self.channel_w) if fd is not None)

    def close_child_ends(self) -> None:
        """Closes the parent's copies of the write ends (so that the child's exit ends the pipes)."""
        for name in ("control_w", "channel_w"):
            self._close(name)

    def close(self) -> None:
        """Closes every end still open."""
        for name in ("control_r", "control_w", "channel_r", "channel_w"):
            self._close(name)

    def _close(self, name: str) -> None:
        fd = getattr(self, name)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
            setattr(self, name, None)


@dataclass(frozen=True)
class ControlReport:
    """What the bootstrap said: the interpreter (None: it never got that far), the kernel layers it
    confirmed, the diagnostics it turned on, a refusal of the audit hook (`blocked`, a phrase of
    BLOCK_REASONS) and a required layer that failed (`unconfined`)."""

    interpreter: Interpreter | None
    layers: tuple[str, ...]
    diagnostics: tuple[str, ...]
    blocked: str
    unconfined: str


def read_control(control: str) -> ControlReport:
    """Parses the control pipe. The bootstrap writes its lines before the candidate's first line runs,
    so only they count where they are (interpreter first, then layers or unconfined, then diagnostics),
    and names only from fixed vocabularies: a candidate writing to the pipe cannot put words of its
    own choosing in a report, nor add a layer; its own `blocked` line can only make its run fail."""
    lines = control.splitlines()
    first = lines[0] if lines else ""
    found = interpreters.parse(first[len("interpreter "):]) if first.startswith("interpreter ") else None
    bootstrap = lines[1:3] if found is not None else []
    second = bootstrap[0] if bootstrap else ""
    confined = second.startswith("layers ")  # then the next line is the bootstrap's too (written right after)
    layers = _names(second, "layers ", REPORTED_LAYERS)
    unconfined = second[len("unconfined "):] if second.startswith("unconfined ") else ""
    diagnostics = _names(bootstrap[1], "diagnostics ", DIAGNOSTICS) if confined and len(bootstrap) > 1 else ()
    later = lines[3:] if confined else lines[1:]
    blocked = next((line[len("blocked "):] for line in later if line.startswith("blocked ")), "")
    return ControlReport(found, layers, diagnostics, blocked if blocked in child.BLOCK_REASONS else "", unconfined)


def _names(line: str, prefix: str, vocabulary: tuple[str, ...]) -> tuple[str, ...]:
    if not line.startswith(prefix):
        return ()
    return tuple(name for name in line[len(prefix):].split(",") if name in vocabulary)
