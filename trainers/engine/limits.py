"""What one client of `marl serve` may send and hold (`ServeLimits`, a `marl serve` flag each), and the file
descriptors those bounds need (`fd_budget`), checked before the server opens any.

The server that enforces them is trainers/engine/connections.py (connections, threads, deadlines) with
trainers/engine/server.py and serving.py (bodies, prompts, new tokens).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

LINGER_MAX = 256  # refused connections lingering at once, at most (fewer when the file limit leaves less room)
FD_RESERVE = 64  # descriptors besides the connections: selector, model and adapter files, stdio, the unforeseen


_RANGES = {"max_body_bytes": (1, 2 ** 40), "max_prompt_tokens": (1, 2 ** 31), "max_new_tokens": (1, 4096),
           "read_timeout": (0, 3600), "idle_timeout": (0, 3600), "workers": (1, 1024), "queue": (0, 2 ** 16),
           "max_connections": (1, 2 ** 16), "max_connections_per_client": (1, 2 ** 16)}
# each limit's range (a timeout: more than its low end); these two may be None (a default worked out later)
_OPTIONAL = ("max_prompt_tokens", "max_connections_per_client")


def _help(text: str) -> dict:
    return {"help": text}


@dataclass(frozen=True)
class ServeLimits:
    """Every bound `marl serve` puts on a client (a flag each, named like the field). ValueError, naming
    the flag and its range, for a value out of range."""

    max_body_bytes: int = field(default=2 ** 20, metadata=_help(
        "largest request body in bytes (default 1 MiB); a larger Content-Length is answered 413 and the body "
        "is not read"))
    max_prompt_tokens: int | None = field(default=None, metadata=_help(
        "longest prompt in tokens (default: the model's context length); a longer one is answered 400"))
    max_new_tokens: int = field(default=4096, metadata=_help(
        "largest max_tokens a request may ask for (1-4096, default 4096); a request asking more is answered 400, "
        "never cut silently"))
    read_timeout: float = field(default=30.0, metadata=_help(
        "seconds a client has to send its whole request from its first byte (and to take each answer); a slow "
        "or short request gets 408 when they are up (default 30)"))
    idle_timeout: float = field(default=30.0, metadata=_help(
        "seconds a connection may stay silent before its request starts; it is then answered 408 and closed "
        "(default 30; a silent connection holds no thread)"))
    workers: int = field(default=64, metadata=_help(
        "threads serving requests (default 64, what the HTTP rollout engine sends at once; concurrent "
        "requests are batched on the model)"))
    queue: int = field(default=256, metadata=_help(
        "requests that may wait for a worker (default 256); beyond them a request gets 503 with Retry-After"))
    max_connections: int = field(default=512, metadata=_help(
        "open connections at a time (default 512; each is a file descriptor, checked against ulimit -n at "
        "start); a new one takes the place of the oldest that has not sent its request (408), else gets 503"))
    max_connections_per_client: int | None = field(default=None, metadata=_help(
        "open connections from one client address (default: no bound but --max-connections, as a rollout "
        "engine on this machine opens one per row); beyond it a connection gets 503 with Retry-After"))

    def __post_init__(self):
        for name, (low, high) in _RANGES.items():
            value = getattr(self, name)
            if value is None and name in _OPTIONAL:
                continue
            if name.endswith("timeout"):  # seconds: more than 0 (NaN and infinity fail the comparison)
                if isinstance(value, bool) or not isinstance(value, int | float) or not low < value <= high:
                    raise ValueError(f"--{name.replace('_', '-')} {value}: seconds, more than 0 and at most {high}")
            elif isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"--{name.replace('_', '-')} {value}: an integer in [{low}, {high}]")

    @classmethod
    def flags(cls) -> list[tuple[str, str, type, object, str]]:
        """(field, --flag, type, default, help) per limit, for the `marl serve` parser."""
        kinds = {"float": float, "int": int, "int | None": int}
        return [(f.name, "--" + f.name.replace("_", "-"), kinds[str(f.type)], f.default, f.metadata["help"])
                for f in fields(cls)]


def _open_files() -> int:
    """How many file descriptors this process holds now (a guess of 32 where /proc and /dev/fd are not)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return 32


def fd_budget(limits: ServeLimits) -> int:
    """How many refused connections may linger (at most LINGER_MAX) beside `max_connections` and the server's
    own files under the soft file limit, which is raised towards the hard one when they need more. ValueError
    in one line, naming --max-connections and ulimit -n, when not even the connections fit: accept() would
    fail with EMFILE long before the server's own bound."""
    try:
        import resource  # lazy: Unix only
    except ImportError:  # no rlimits to read (Windows): trust the flags
        return LINGER_MAX
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    own = _open_files() + FD_RESERVE
    need = own + limits.max_connections + LINGER_MAX
    if soft != unlimited and soft < need and (hard == unlimited or hard > soft):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == unlimited else min(need, hard), hard))
        except (ValueError, OSError):  # a platform cap below the hard limit (macOS OPEN_MAX): keep what there is
            pass
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    room = LINGER_MAX if soft == unlimited else soft - own - limits.max_connections
    if room < 0:
        raise ValueError(f"--max-connections {limits.max_connections}: with the server's own {own} files that is "
                         f"{own + limits.max_connections} file descriptors, and this process may open {soft} "
                         f"(ulimit -n; hard limit {'unlimited' if hard == unlimited else hard}); lower "
                         "--max-connections or raise ulimit -n")
    return min(LINGER_MAX, room)
