"""Benchmark `judges.model.openai_backend.OpenAIBackend` throughput against a local OpenAI-compatible server.

Run from a checkout: `python bench/judge_throughput.py` (`--help` for options). Starts the loopback test
server of `tests/helpers/judge_server.py` with a fixed latency per request (default 50 ms), then measures
requests per second through the real `openai` client:
  * a sequential loop: a plain `for` loop awaiting one request at a time (concurrency 1);
  * `complete_many` at concurrency 1, 8, 32 and 64 (the backend's semaphore);
and the speed-up of each over the sequential loop ("ideal" is concurrency / latency). Finally it fills
a JudgeCache at the highest concurrency and replays the same requests from it with a fresh backend:
the replay must make zero network calls (the server's request counter does not move). Exits with
status 1 when the replay touches the network or a request fails. The last line, `ratio: ...`, is the
requests per second at the highest concurrency over the sequential loop's, both measured in this run.
`--quick` (a few seconds, for tests/integration/test_benchmarks.py) measures the same at 20 ms latency with
fewer requests and concurrency 1, 8 and 64.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from judges.model.backend import ChatRequest, ChatResponse  # noqa: E402
from judges.model.cache import JudgeCache  # noqa: E402
from judges.model.openai_backend import OpenAIBackend  # noqa: E402

MODEL = "judge-model"
CONCURRENCIES = (1, 8, 32, 64)


def load_server_module():
    """tests/helpers/judge_server.py, imported by path (tests/ is not on the path of a bench)."""
    spec = importlib.util.spec_from_file_location("judge_server", ROOT / "tests" / "helpers" / "judge_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_requests(tag: str, count: int) -> list[ChatRequest]:
    """`count` distinct small judge requests."""
    return [ChatRequest(messages=({"role": "user", "content": f"{tag} request {i}: which answer is better?"},),
                        max_tokens=16) for i in range(count)]


async def sequential_loop(url: str, requests: Sequence[ChatRequest]) -> tuple[float, list[ChatResponse]]:
    """A plain for loop, one request at a time; (seconds, responses)."""
    backend = OpenAIBackend(base_url=url, model=MODEL, max_concurrency=1)
    await backend.complete(make_requests("warm-up", 1)[0])
    start = time.perf_counter()
    responses = [await backend.complete(request) for request in requests]
    elapsed = time.perf_counter() - start
    await backend.aclose()
    return elapsed, responses


async def concurrent_run(url: str, requests: Sequence[ChatRequest], concurrency: int,
                         cache: JudgeCache | None = None) -> tuple[float, list[ChatResponse], OpenAIBackend]:
    """complete_many at `concurrency`; (seconds, responses, backend)."""
    backend = OpenAIBackend(base_url=url, model=MODEL, max_concurrency=concurrency, cache=cache)
    await backend.complete_many(make_requests(f"warm-up-{concurrency}", concurrency))
    backend.stats.update(calls=0, cache_hits=0)
    start = time.perf_counter()
    responses = await backend.complete_many(requests)
    elapsed = time.perf_counter() - start
    await backend.aclose()
    return elapsed, responses, backend


def row(label: str, count: int, seconds: float, baseline: float, ideal: float) -> str:
    rate = count / seconds
    return f"{label:>12} {count:>9} {seconds:>9.2f} {rate:>9.1f} {rate / baseline:>9.1f}x {ideal:>9.0f}"


async def run(args: argparse.Namespace) -> int:
    """Run every measurement; returns the exit status."""
    server_module = load_server_module()
    failures = 0
    with server_module.JudgeServer(latency_s=args.latency_ms / 1000.0) as server:
        seconds, responses = await sequential_loop(server.url, make_requests("sequential", args.sequential))
        failures += sum(r.status != "ok" for r in responses)
        baseline = args.sequential / seconds
        print(f"server latency {args.latency_ms:.0f} ms per request; openai client through OpenAIBackend")
        print(f"{'concurrency':>12} {'requests':>9} {'seconds':>9} {'req/s':>9} {'speed-up':>10} {'ideal':>9}")
        print(row("sequential", args.sequential, seconds, baseline, 1000.0 / args.latency_ms))
        rates = {}
        for concurrency in args.concurrency:
            count = args.sequential if concurrency == 1 else args.requests
            seconds, responses, _ = await concurrent_run(server.url, make_requests(f"c{concurrency}", count),
                                                         concurrency)
            failures += sum(r.status != "ok" for r in responses)
            rates[concurrency] = count / seconds
            print(row(str(concurrency), count, seconds, baseline, concurrency * 1000.0 / args.latency_ms))
        print(f"server max in flight: {server.max_in_flight}")
        failures += await cache_replay(server, args, baseline)
    top = max(rates)
    print(f"ratio: {rates[top] / baseline:.1f} (req/s at concurrency {top} / req/s of the sequential loop; "
          f"anchor: the sequential loop, measured in this run)")
    return 1 if failures else 0


async def cache_replay(server, args: argparse.Namespace, baseline: float) -> int:
    """Fill a cache at the highest concurrency, replay it; returns the number of problems."""
    top = max(args.concurrency)
    requests = make_requests("cached", args.requests)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "judge_cache.sqlite"
        fill_seconds, filled, _ = await concurrent_run(server.url, requests, top, JudgeCache(path))
        before = server.requests
        seconds, replayed, backend = await concurrent_run(server.url, requests, top,
                                                          JudgeCache(path, mode="replay_strict"))
        network = server.requests - before  # the replay's warm-up requests are cached too
    same = [r.text for r in replayed] == [r.text for r in filled] and all(r.cached for r in replayed)
    print(f"cache fill at concurrency {top}: {len(requests)} requests in {fill_seconds:.2f} s")
    print(f"cache replay (replay_strict): {len(requests)} requests in {seconds:.3f} s = "
          f"{len(requests) / seconds:.0f} req/s ({len(requests) / seconds / baseline:.0f}x the sequential loop); "
          f"calls made = {backend.stats['calls']}, server requests = {network}, cache hits = "
          f"{backend.stats['cache_hits']}, identical answers = {same}")
    return int(backend.stats["calls"] != 0 or network != 0 or not same)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=50.0, help="server latency per request")
    parser.add_argument("--sequential", type=int, default=40, help="requests of the sequential loop and c=1")
    parser.add_argument("--requests", type=int, default=320, help="requests at each concurrency > 1")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCIES))
    parser.add_argument("--quick", action="store_true", help="the same measurements in a few seconds")
    args = parser.parse_args(argv)
    if args.quick:
        args.latency_ms, args.sequential, args.requests, args.concurrency = 20.0, 10, 64, [1, 8, 64]
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
