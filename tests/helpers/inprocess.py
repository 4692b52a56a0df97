"""The `marl` command called in this process, answering like `helpers.cli.run_marl`'s subprocess.

A fresh interpreter pays several seconds of imports (torch, transformers) on a small machine; calling
`trainers.cli.main.main` here costs a fraction of a second and checks the same contract: the exit status,
exactly what was printed on stdout and stderr, and what was written to disk. Use a subprocess instead
where the process itself is what is tested (signals, resource limits, import isolation, settings read
once at import time).

What a command may change for the rest of its process is put back afterwards, so that later tests see the
state they would have seen: the environment, the working directory, the SIGINT/SIGTERM handlers (`marl
serve` installs one), torch's thread count and default dtype, and a W&B run left open is finished.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys

from helpers.paths import ROOT

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _exit_status(code) -> int:
    """The process's exit status for `sys.exit(code)`, as the interpreter computes it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"): printed on stderr, status 1
    return 1


def marl_in_process(*args: str, cwd=None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`marl ARGS` run by `trainers.cli.main.main` here, from `cwd` (default: the repository), W&B off, one
    thread (run_marl's settings; `env` adds or overrides variables for the call). An exception that
    `main` lets out is raised here, with what the command had printed as a note: in a subprocess it would
    be a traceback and exit status 1, which every caller's assertions reject anyway."""
    import torch

    from trainers.cli.main import main

    environ, directory = dict(os.environ), os.getcwd()
    handlers = {number: signal.getsignal(number) for number in _SIGNALS}
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    stdout, stderr = io.StringIO(), io.StringIO()
    os.environ.update({"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", **(env or {})})
    os.chdir(cwd or ROOT)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                status = main([str(arg) for arg in args])
            except SystemExit as exit_:  # argparse's usage errors: status 2, its lines on stderr
                status = _exit_status(exit_.code)
    except BaseException as error:
        error.add_note(f"marl {' '.join(map(str, args))} printed:\nstdout:\n{stdout.getvalue()}\n"
                       f"stderr:\n{stderr.getvalue()}")
        raise
    finally:
        os.chdir(directory)
        os.environ.clear()
        os.environ.update(environ)
        for number, handler in handlers.items():
            if handler is not None:
                signal.signal(number, handler)
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        wandb = sys.modules.get("wandb")
        if wandb is not None and getattr(wandb, "run", None) is not None:
            wandb.run.finish()
    return subprocess.CompletedProcess(["marl", *map(str, args)], status, stdout.getvalue(), stderr.getvalue())
