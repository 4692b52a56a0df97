"""One concurrency cap and rate limit per judge endpoint across a Ray cluster.

`EndpointGate` is a named async Ray actor per endpoint (named from the backend's identity, model @
URL): every OpenAIBackend of that endpoint, in the driver or in any rollout worker, takes a slot and
a rate token from it before a request and gives the slot back after, so N workers send no more than
the one limit the scenario set (`judges[].concurrency`, `judges[].requests_per_second`), not N times
it. `install(ray)` makes judges.model.openai_backend route its limits through these gates in this
process; the driver installs it before it builds any judge, so the driver owns every gate.

The judge ledger (judges.model.ledger: the judge cache, the counts, the endpoints' health) lives in one
actor on the driver's node (`share_ledger`), the only writer of the run directory's sqlite file; the
driver and every worker reach it through a `LedgerHandle`, so no worker opens a file of its own and a
judgment paid for on one worker is read back on any other.
"""

from __future__ import annotations

import asyncio
import hashlib

import time
from judges.model import ledger as ledgers
from judges.model.openai_backend import TokenBucket, share_endpoint_limits


class EndpointGate:
    """The shared limits of one endpoint (made a Ray actor by `install`).

    A slot is a lease: `acquire` returns its id and `release(id)` gives it back. A lease not given back
    within `hold_s` seconds (longer than one request can take: the backend's timeout plus a margin) is
    taken back, so a worker killed while it held slots, or while its requests were queued here, cannot
    leave the endpoint with fewer slots for the rest of the run.
    """

    def __init__(self, requests_per_second: float | None, max_concurrency: int, hold_s: float = 120.0):
        self.bucket = TokenBucket(requests_per_second) if requests_per_second else None
        self.max_concurrency, self.hold_s = max_concurrency, hold_s
        self.leases: dict[int, float] = {}  # lease id -> the time it is taken back
        self.changed: asyncio.Condition | None = None  # made on the actor's own event loop
        self.granted, self.max_in_flight, self.reclaimed, self._next = 0, 0, 0, 0

    def _reclaim(self, now: float) -> None:
        for lease in [lease for lease, until in self.leases.items() if until <= now]:
            del self.leases[lease]
            self.reclaimed += 1

    async def acquire(self) -> int:
        """Wait for a free slot, then for a rate token; the lease id to give back."""
        if self.changed is None:
            self.changed = asyncio.Condition()
        async with self.changed:
            while True:
                now = time.monotonic()
                self._reclaim(now)
                if len(self.leases) < self.max_concurrency:
                    break
                wait = min(self.leases.values()) - now  # the oldest lease is reclaimed then at the latest
                try:
                    await asyncio.wait_for(self.changed.wait(), timeout=max(wait, 0.01))
                except asyncio.TimeoutError:
                    pass
            self._next += 1
            lease = self._next
            self.leases[lease] = now + self.hold_s
            self.max_in_flight = max(self.max_in_flight, len(self.leases))
        if self.bucket is not None:
            await self.bucket.acquire()
        self.granted += 1
        return lease

    async def release(self, lease: int) -> None:
        """Give a slot back (a lease already reclaimed is ignored)."""
        if self.changed is None:
            self.changed = asyncio.Condition()
        async with self.changed:
            self.leases.pop(lease, None)
            self.changed.notify()

    async def stats(self) -> dict:
        """Requests granted so far, the most ever in flight at once, and leases taken back unreturned."""
        return {"granted": self.granted, "max_in_flight": self.max_in_flight, "reclaimed": self.reclaimed}


class GateHandle:
    """What a backend holds: awaitable acquire/release on the endpoint's gate actor."""

    def __init__(self, actor):
        self.actor = actor

    async def acquire(self) -> int:
        return await asyncio.wrap_future(self.actor.acquire.remote().future())

    async def release(self, lease: int) -> None:
        await asyncio.wrap_future(self.actor.release.remote(lease).future())


def gate_name(identity: str) -> str:
    """The Ray actor name of an endpoint's gate."""
    return "marl-gate-" + hashlib.sha256(identity.encode()).hexdigest()[:16]


def install(ray) -> None:
    """Share every endpoint's limits through gates in this process (driver or worker)."""
    remote = ray.remote(EndpointGate)

    def provider(identity: str, requests_per_second, max_concurrency: int, hold_s: float) -> GateHandle:
        actor = remote.options(name=gate_name(identity), get_if_exists=True, max_concurrency=100_000,
                               num_cpus=0).remote(requests_per_second, max_concurrency, hold_s)
        return GateHandle(actor)

    share_endpoint_limits(provider)


def uninstall() -> None:
    """Each backend limits itself again (the run is over)."""
    share_endpoint_limits(None)


# -- the judge ledger: one cache, one writer, for the whole cluster --------------------------------------------
class LedgerHandle:
    """What a process holds on the Ray backend in place of a JudgeLedger: the ledger actor's methods, `lookup`
    and `record` awaitable (the backends await them on their event loop), the others blocking."""

    def __init__(self, actor):
        self.actor = actor

    async def lookup(self, request, identity: str, judge: str):
        return await asyncio.wrap_future(self.actor.lookup.remote(request, identity, judge).future())

    async def record(self, request, identity: str, judge: str, response) -> None:
        await asyncio.wrap_future(self.actor.record.remote(request, identity, judge, response).future())

    def abandon(self, request, identity: str) -> None:
        self.actor.abandon.remote(request, identity)  # nothing to wait for: the waiters ask again

    def _get(self, method: str, *args):
        import ray

        return ray.get(getattr(self.actor, method).remote(*args))

    def open_cache(self, path: str) -> None:
        self._get("open_cache", path)

    def counts(self) -> dict:
        return self._get("counts")

    def failing(self) -> dict:
        return self._get("failing")

    def drain(self) -> list[str]:
        return self._get("drain")

    def close(self) -> None:
        self._get("close")


def share_ledger(ray, name: str):
    """Move the installed JudgeLedger of this process (the driver) into a Ray actor named `name` on this
    node, the only writer of its sqlite file (the run directory is on this node), and install a handle to
    it here; the (ledger, actor) to give back to `unshare_ledger`, or None when no plain ledger is
    installed. Workers install a handle with `join_ledger(ray, name)`."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    local = ledgers.active()
    if not isinstance(local, ledgers.JudgeLedger):
        return None
    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    # max_concurrency: a lookup waits while the same request is in flight elsewhere, so many run at once
    actor = ray.remote(ledgers.JudgeLedger).options(name=name, num_cpus=0, max_concurrency=10_000,
                                                    scheduling_strategy=here).remote()
    if local.cache is not None:  # the file moves to the actor: one connection, one writer
        path = local.cache.path
        local.close()
        ray.get(actor.open_cache.remote(path))
    ledgers.install(LedgerHandle(actor))
    return local, actor


def join_ledger(ray, name: str | None) -> None:
    """In a worker: every judge of this process uses the driver's ledger actor `name` (None: none)."""
    ledgers.install(LedgerHandle(ray.get_actor(name)) if name else None)


def unshare_ledger(ray, shared) -> None:
    """Close the ledger actor's cache and stop it; the driver's own ledger (its counts only) is installed again."""
    if shared is None:
        return
    local, actor = shared
    try:
        ray.get(actor.close.remote())
        ray.kill(actor)
    except Exception:  # noqa: BLE001 - the cluster is already gone: the file was written as it went
        pass
    ledgers.install(local)
