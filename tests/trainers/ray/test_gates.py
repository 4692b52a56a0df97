"""The per-endpoint gate's slots are leases: a slot whose holder died (a killed rollout worker) comes
back after the hold time, so one kill cannot starve a judge endpoint for the rest of a run. The gate's
logic is plain asyncio (Ray only hosts it), tested here without a cluster."""

from __future__ import annotations

import asyncio

import pytest

from trainers.ray.gates import EndpointGate


def test_slots_are_capped_and_a_release_frees_one():
    async def scenario():
        gate = EndpointGate(None, 2, hold_s=60)
        first, second = await gate.acquire(), await gate.acquire()
        third = asyncio.ensure_future(gate.acquire())
        await asyncio.sleep(0.05)
        blocked = not third.done()
        await gate.release(first)
        lease = await asyncio.wait_for(third, 5)
        await gate.release(second)
        await gate.release(lease)
        return blocked, await gate.stats()

    blocked, stats = asyncio.run(scenario())
    assert blocked and stats == {"granted": 3, "max_in_flight": 2, "reclaimed": 0}


def test_a_lease_never_given_back_is_taken_back_after_the_hold_time():
    async def scenario():
        gate = EndpointGate(None, 1, hold_s=0.5)
        lost = await gate.acquire()  # its holder dies and never releases
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(waiting := asyncio.ensure_future(gate.acquire())), 0.1)
        second = await asyncio.wait_for(waiting, 5)  # granted once the lost lease is reclaimed
        await gate.release(lost)  # a late release of a reclaimed lease changes nothing
        blocked = asyncio.ensure_future(gate.acquire())
        await asyncio.sleep(0.05)
        still_capped = not blocked.done()
        await gate.release(second)
        await asyncio.wait_for(blocked, 5)
        return still_capped, await gate.stats()

    still_capped, stats = asyncio.run(scenario())
    assert still_capped and stats["reclaimed"] == 1 and stats["granted"] == 3
