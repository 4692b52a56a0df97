"""Connecting to a Ray cluster for a run: a local one started here, or an existing one by address.

Every failure is a `RayBackendError` with one line saying what is wrong and how to fix it, raised
before training starts (the CLI prints it and exits 2).
"""

from __future__ import annotations

import os
import socket
import sys


_STARTED_HERE = False  # whether `connect` opened the current Ray session (then the run closes it)


class RayBackendError(ValueError):
    """The Ray backend cannot run as configured (the message names the cause and the fix)."""


def import_ray():
    """The `ray` module, or a RayBackendError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise RayBackendError("train.backend=ray needs Ray: pip install -e '.[ray]' (or use train.backend=local)") \
            from None
    return ray


def connect(settings, *, log=print):
    """Initialise Ray for `settings` (a RaySpec) unless it already is; returns the ray module.

    No address: a local cluster on this machine (loopback only, no dashboard, a bounded object store).
    'auto' or 'ray://HOST:PORT': that running cluster; an unreachable one is a RayBackendError.
    """
    global _STARTED_HERE
    ray = import_ray()
    if ray.is_initialized():
        return ray
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local, loopback-only cluster needs no token
    options = dict(include_dashboard=False, log_to_driver=False, configure_logging=False,
                   runtime_env={"env_vars": _worker_environment()})
    try:
        if settings.address is None:
            ray.init(num_cpus=_local_cpus(settings), object_store_memory=settings.object_store_mb * 2 ** 20,
                     _node_ip_address="127.0.0.1", **options)
            _STARTED_HERE = True
            log(f"ray: started a local cluster ({_local_cpus(settings)} CPUs)")
        else:
            _check_reachable(settings.address)
            ray.init(address=settings.address, **options)
            _STARTED_HERE = True  # our connection: released with the run (the cluster itself stays up)
            log(f"ray: connected to {settings.address}")
    except RayBackendError:
        raise
    except Exception as error:  # ray raises ConnectionError, RuntimeError, ValueError... by version
        where = settings.address or "a local cluster"
        raise RayBackendError(f"train.ray.address: cannot start or reach {where} "
                              f"({_first_line(error)}); start one with `ray start --head` and pass "
                              "--set train.ray.address=auto, or leave the address out for a local one") from None
    return ray


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """A RayBackendError unless HOST:PORT of the address accepts a TCP connection within `timeout`
    seconds (Ray itself retries an unreachable head for a minute or more). 'auto' is Ray's to find."""
    if address == "auto":
        return
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise RayBackendError(f"train.ray.address={address!r} is not 'auto', HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as error:
        raise RayBackendError(f"train.ray.address: nothing answers at {target} ({error.strerror or error}); start "
                              "the cluster (`ray start --head`) or fix the address; leave it out for a local "
                              "cluster") from None


def check_resources(settings) -> None:
    """A RayBackendError when the cluster cannot hold `rollout_workers` workers of the requested size."""
    ray = import_ray()
    total = ray.cluster_resources()
    for name, each in (("CPU", settings.num_cpus), ("GPU", settings.num_gpus)):
        needed = each * settings.rollout_workers
        if needed > total.get(name, 0.0) + 1e-9:
            raise RayBackendError(
                f"train.ray: {settings.rollout_workers} rollout workers x {each:g} {name} need {needed:g} {name}, "
                f"the cluster has {total.get(name, 0.0):g}; lower train.ray.rollout_workers or "
                f"train.ray.num_{name.lower()}s, or add nodes")


def shutdown(*, only_if_started_here: bool = False) -> None:
    """Disconnect from Ray (a local cluster started here stops with it). With `only_if_started_here`,
    a Ray session the caller opened before (a notebook's ray.init) is left alone."""
    global _STARTED_HERE

    ray = sys.modules.get("ray")  # never imported: nothing to shut down (and no import for a local run)
    if ray is None:
        return
    if ray.is_initialized() and (_STARTED_HERE or not only_if_started_here):
        ray.shutdown()
    _STARTED_HERE = False


def _local_cpus(settings) -> int:
    """CPUs of a local cluster: this machine's (workers asking for more are refused, not oversubscribed)."""
    return os.cpu_count() or 1


def _worker_environment() -> dict[str, str]:
    """The variables workers inherit: thread counts and offline switches (nothing is downloaded)."""
    names = ("OMP_NUM_THREADS", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM", "PYTHONPATH",
             "WANDB_MODE", "MARL_CACHE")
    return {name: os.environ[name] for name in names if name in os.environ}


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:200]
