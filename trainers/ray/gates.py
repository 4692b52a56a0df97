"""One concurrency cap and rate limit per judge endpoint across a Ray cluster.

`EndpointGate` is a named async Ray actor per endpoint (named from the backend's identity, model @
URL): every OpenAIBackend of that endpoint, in the driver or in any rollout worker, takes a slot and
a rate token from it before a request and gives the slot back after, so N workers send no more than
the one limit the scenario set (`judges[].concurrency`, `judges[].requests_per_second`), not N times
it. `install(ray)` makes judges.model.openai_backend route its limits through these gates in this
process; the driver installs it before it builds any judge, so the driver owns every gate.
"""

from __future__ import annotations

import asyncio
import hashlib


class EndpointGate:
    """The shared limits of one endpoint (made a Ray actor by `install`)."""

    def __init__(self, requests_per_second: float | None, max_concurrency: int):
        from judges.model.openai_backend import TokenBucket

        self.bucket = TokenBucket(requests_per_second) if requests_per_second else None
        self.max_concurrency = max_concurrency
        self.slots: asyncio.Semaphore | None = None  # made on the actor's own event loop
        self.granted, self.in_flight, self.max_in_flight = 0, 0, 0

    async def acquire(self) -> None:
        """Wait for a free slot, then for a rate token."""
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.max_concurrency)
        await self.slots.acquire()
        if self.bucket is not None:
            await self.bucket.acquire()
        self.granted += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    async def release(self) -> None:
        """Give a slot back."""
        self.in_flight -= 1
        self.slots.release()

    async def stats(self) -> dict:
        """Requests granted so far, and the most ever in flight at once."""
        return {"granted": self.granted, "max_in_flight": self.max_in_flight}


class GateHandle:
    """What a backend holds: awaitable acquire/release on the endpoint's gate actor."""

    def __init__(self, actor):
        self.actor = actor

    async def acquire(self) -> None:
        await asyncio.wrap_future(self.actor.acquire.remote().future())

    async def release(self) -> None:
        await asyncio.wrap_future(self.actor.release.remote().future())


def gate_name(identity: str) -> str:
    """The Ray actor name of an endpoint's gate."""
    return "marl-gate-" + hashlib.sha256(identity.encode()).hexdigest()[:16]


def install(ray) -> None:
    """Share every endpoint's limits through gates in this process (driver or worker)."""
    from judges.model.openai_backend import share_endpoint_limits

    remote = ray.remote(EndpointGate)

    def provider(identity: str, requests_per_second, max_concurrency: int) -> GateHandle:
        actor = remote.options(name=gate_name(identity), get_if_exists=True, max_concurrency=100_000,
                               num_cpus=0).remote(requests_per_second, max_concurrency)
        return GateHandle(actor)

    share_endpoint_limits(provider)


def uninstall() -> None:
    """Each backend limits itself again (the run is over)."""
    from judges.model.openai_backend import share_endpoint_limits

    share_endpoint_limits(None)
