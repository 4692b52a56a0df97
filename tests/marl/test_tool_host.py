"""Tool calls that a timeout and a memory limit stop (issue 31, item 5): hosts, forked children, limits.

The hostile calls are real: the allow-listed `statistics.quantiles` asked for 60 million cut points (it
took 1.8 GB and kept running after its timeout when tools ran in a thread), a tool that never returns,
one that kills its own process. Each must come back as an error observation, leave the run going, and
leave no process (so no memory) behind.
"""

from __future__ import annotations

import os
import select
import statistics
import subprocess
import sys
import threading
import time
import types

import pytest
import yaml

from marl.env import make_env
from marl.scenario.load import load_scenario
from marl.tool_host import host_pids, tool_reference
from marl.tools import ParsedCall, ToolRegistry, ToolSpec
from helpers.paths import ROOT, SCENARIOS

TOOLS_LIB = '''
import os, threading, time
from pathlib import Path

def hang():
    threading.Event().wait()

def spin():
    while True:
        pass

def die(code: int):
    os._exit(code)

def wait_for(path: str):
    Path(path + ".started").write_text("waiting")
    while not Path(path).exists():
        time.sleep(0.01)
    return "seen"

def touch(path: str):
    Path(path).write_text("here")
    return "made"
'''
QUANTILES = {"type": "object", "properties": {"data": {"type": "array"}, "n": {"type": "integer"}},
             "required": ["data"]}
PATH_ARG = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


def _tool(name: str, function: str, timeout_s: float, parameters: dict | None = None) -> dict:
    return {"name": name, "function": function, "timeout_s": timeout_s,
            "parameters": parameters or {"type": "object", "properties": {}}}


def _registry(tmp_path, *tools: dict) -> ToolRegistry:
    """The tool registry of agent `a` in a scenario written to tmp_path (tools from tools_lib.py there)."""
    (tmp_path / "tools_lib.py").write_text(TOOLS_LIB)
    spec = {"name": "t", "agents": [{"name": "a", "tools": [t["name"] for t in tools]}],
            "tools": list(tools), "tasks": {"inline": [{"prompt": "p", "answer": "A"}]},
            "rewards": {"answer_from": "a", "outcome": [{"kind": "exact"}]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    return make_env(load_scenario(tmp_path / "s.yaml")).tools["a"]


def _children() -> set[int]:
    """The live child processes of this process (every thread's), from /proc."""
    found = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as handle:
            found |= {int(pid) for pid in handle.read().split()}
    return found


def _gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


def _resident_mb() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20


def test_a_scenario_tool_runs_in_a_host_that_imports_it_by_reference():
    env = make_env(load_scenario(SCENARIOS / "weather.yaml"))
    registry = env.tools["runner"]
    assert tool_reference(registry.get("get_weather").function) == ("weather_lib:get_weather", str(SCENARIOS))
    assert tool_reference(statistics.quantiles) == ("statistics:quantiles", None)
    assert tool_reference(lambda: 1) is None
    [record] = registry.run_all("runner", 'get_weather(city="Paris")')
    assert record.ok and record.result == '{"city": "Paris", "temperature_c": 18, "conditions": "partly cloudy"}'
    assert host_pids() and set(host_pids()) <= _children()  # it ran in a host, which waits for the next call


def test_statistics_quantiles_with_a_huge_n_is_stopped_and_its_host_is_gone(tmp_path):
    """The issue's call, through a scenario: the default limits (5 s, 1 GB over what the host maps)."""
    registry = _registry(tmp_path, _tool("quantiles", "statistics:quantiles", 5, QUANTILES))
    assert registry.run_all("a", "quantiles(data=[1, 2, 3, 4], n=4)")[0].result == "[1.25, 2.5, 3.75]"
    idle, resident = set(host_pids()), _resident_mb()
    [record] = registry.run_all("a", "quantiles(data=[1, 2, 3, 4], n=60000000)")
    assert not record.ok
    assert record.result in ("error: TimeoutError: quantiles did not finish within 5.0 s",
                             "error: MemoryError: quantiles went over its memory limit of 1024 MB")
    stopped = idle - set(host_pids())
    assert len(stopped) == 1 and all(_gone(pid) for pid in stopped)  # killed and reaped: its memory is back
    assert _resident_mb() - resident < 100  # the cut points were never in this process
    assert registry.stats("a") == {"calls": 2, "valid": 2, "invalid": 0, "failed": 1}
    assert registry.run_all("a", "quantiles(data=[1, 2, 3, 4], n=2)")[0].result == "[2.5]"  # a fresh host


def test_a_memory_hog_is_stopped_by_its_memory_limit():
    registry = ToolRegistry([ToolSpec("quantiles", statistics.quantiles, parameters=QUANTILES, timeout_s=600,
                                      memory_mb=64)])
    idle = set(host_pids())
    [record] = registry.run_all("a", "quantiles(data=[1, 2, 3, 4], n=60000000)")
    assert record.result == "error: MemoryError: quantiles went over its memory limit of 64 MB"
    assert all(_gone(pid) for pid in idle - set(host_pids()))
    assert registry.run_all("a", "quantiles(data=[1, 2, 3, 4], n=4)")[0].ok


@pytest.mark.parametrize("tool", ["hang", "spin"])
def test_a_tool_that_never_returns_times_out_and_its_host_is_killed(tmp_path, tool):
    registry = _registry(tmp_path, _tool(tool, f"tools_lib:{tool}", 0.5))
    before = _children()
    [record] = registry.run_all("a", f"{tool}()")
    assert record.result == f"error: TimeoutError: {tool} did not finish within 0.5 s"
    assert _children() <= before  # the host that ran it is gone, and no other process was left


def test_a_tool_that_kills_its_process_is_an_error_and_the_next_call_works(tmp_path):
    registry = _registry(tmp_path, _tool("die", "tools_lib:die", 30, {"type": "object",
                                                                        "properties": {"code": {"type": "integer"}}}))
    [record] = registry.run_all("a", "die(3)")
    assert record.result == "error: ToolError: die stopped without a result: it exited with status 3"
    reference = ToolRegistry([ToolSpec("quantiles", statistics.quantiles, parameters=QUANTILES)])
    assert reference.run_all("a", "quantiles(data=[1, 2], n=2)")[0].result == "[1.5]"


def test_calls_from_two_threads_run_at_once_in_two_hosts(tmp_path):
    """wait_for returns only once touch has run: one host for both would keep touch waiting (a timeout)."""
    registry = _registry(tmp_path, _tool("wait_for", "tools_lib:wait_for", 120, PATH_ARG),
                         _tool("touch", "tools_lib:touch", 120, PATH_ARG))
    flag = tmp_path / "flag"
    results = {}
    waiting = threading.Thread(target=lambda: results.update(wait=registry.run_all("a", f'wait_for("{flag}")')))
    waiting.start()
    while not (tmp_path / "flag.started").exists() and waiting.is_alive():  # wait_for runs in its host now
        time.sleep(0.01)
    results["touch"] = registry.run_all("b", f'touch("{flag}")')
    waiting.join()
    assert [r.result for r in results["wait"] + results["touch"]] == ["seen", "made"]


def test_tools_a_host_cannot_import_run_in_a_forked_child_under_the_same_limits():
    def hog(n: int) -> list:  # megabyte by megabyte: a forked child may carry malloc arenas of dead threads,
        return [bytearray(2**20) for _ in range(n)]  # which small allocations would fill slowly before failing

    dynamic = types.ModuleType("marl_test_dynamic_tools")  # in sys.modules here, importable nowhere else
    exec("def spin():\n    while True:\n        pass\n", dynamic.__dict__)
    sys.modules[dynamic.__name__] = dynamic
    try:
        assert tool_reference(dynamic.spin) == ("marl_test_dynamic_tools:spin", None)
        registry = ToolRegistry([
            ToolSpec("hog", hog, parameters={"type": "object", "properties": {"n": {"type": "integer"}}},
                     timeout_s=600, memory_mb=64),
            ToolSpec("spin", dynamic.spin, timeout_s=0.5),
            ToolSpec("show", str, parameters={"type": "object", "properties": {"object": {}}}),
        ])
        before = _children()
        assert registry.run_all("a", "hog(n=100000)")[0].result == \
            "error: MemoryError: hog went over its memory limit of 64 MB"
        assert registry.run_all("a", "spin()")[0].result == "error: TimeoutError: spin did not finish within 0.5 s"
        assert registry.call("a", ParsedCall("show", {"object": {1, 2}})).result == "{1, 2}"  # a set: no JSON
        assert _children() - before <= set(host_pids())  # no forked child is left, only idle hosts
    finally:
        del sys.modules[dynamic.__name__]


KILLED_PARENT = r"""
import os, sys, threading, time
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from marl.tools import ToolRegistry, ToolSpec
import tools_lib

def children():
    return [c for t in os.listdir("/proc/self/task") for c in open(f"/proc/self/task/{t}/children").read().split()]

registry = ToolRegistry([ToolSpec("hang", tools_lib.hang, timeout_s=3600)])
threading.Thread(target=registry.run_all, args=("a", "hang()"), daemon=True).start()
while not children():
    time.sleep(0.01)
print(" ".join(children()), flush=True)
threading.Event().wait()
"""


def test_a_parent_killed_with_minus_9_leaves_no_host_behind(tmp_path):
    """The host of a hanging call sees its parent's pipe close and leaves (no orphan holding memory)."""
    (tmp_path / "tools_lib.py").write_text(TOOLS_LIB)
    parent = subprocess.Popen([sys.executable, "-c", KILLED_PARENT, str(ROOT), str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    [host] = [int(pid) for pid in parent.stdout.readline().split()]
    try:
        watch = os.pidfd_open(host)
    except ProcessLookupError:
        watch = None  # gone already
    parent.kill()
    parent.wait()
    if watch is not None:
        poller = select.poll()
        poller.register(watch, select.POLLIN)
        assert poller.poll(120_000), "the host outlived its parent"  # readable once the host has exited
        os.close(watch)


def test_where_no_host_can_start_calls_run_in_forked_children(monkeypatch):
    """An interpreter that cannot run a host (here /bin/false stands in for it): the call still runs,
    under its limits, and no further host is tried."""
    import marl.tool_host as tool_host

    monkeypatch.setattr(tool_host, "_POOL", tool_host._Pool())
    monkeypatch.setattr(sys, "executable", "/bin/false")
    registry = ToolRegistry([ToolSpec("quantiles", statistics.quantiles, parameters=QUANTILES, timeout_s=600,
                                      memory_mb=64)])
    assert registry.run_all("a", "quantiles(data=[1, 2, 3, 4], n=4)")[0].result == "[1.25, 2.5, 3.75]"
    assert tool_host._POOL._cannot_start and tool_host.host_pids() == []
