"""Shared fixtures: a micro random policy (instant), the real warmed-up demo model (built once), and
small random models of real architectures with a BPE tokenizer and a chat template."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The demo model most tests share: built once per machine and cached (trainers/policy/tinylm.py holds a
# file lock while it builds, so every process that asks meanwhile waits for that one build).
_BUILD_DEMO_MODEL = ("from marl.addition import addition_splits; from trainers.policy.addition_model import demo_policy; "
                     "demo_policy(addition_splits(seed=0), log=lambda message: None)")


def _is_xdist_controller(config) -> bool:
    return getattr(config.option, "numprocesses", None) not in (None, 0) and not hasattr(config, "workerinput")


def pytest_sessionstart(session):
    """Under pytest-xdist, the controller builds the shared demo model in the background while the
    workers start on the tests that need no model (they are ordered first, below); a worker that
    needs it before it is ready waits on the build lock."""
    if _is_xdist_controller(session.config):
        log = tempfile.NamedTemporaryFile("w+", prefix="marl-demo-build-", suffix=".log", delete=False)
        session.config._demo_build = (subprocess.Popen(
            [sys.executable, "-c", _BUILD_DEMO_MODEL], stdout=subprocess.DEVNULL, stderr=log,
            env={**os.environ, "OMP_NUM_THREADS": "1"}), log)


def pytest_sessionfinish(session):
    build = getattr(session.config, "_demo_build", None)
    if build is not None:
        process, log = build
        if process.wait() != 0:  # the workers built it themselves (or failed, each test saying why)
            log.seek(0)
            sys.stderr.write(f"background build of the demo model failed:\n{log.read()[-3000:]}\n")
        log.close()
        os.unlink(log.name)
    groups = getattr(session.config, "_xdist_groups", None)
    for path in glob.glob(groups + ".*") if groups else ():
        os.unlink(path)


# -- xdist_group under pytest 9 ---------------------------------------------------------------------------
# `--dist loadgroup` sends the tests of one `xdist_group` to one worker by a suffix pytest-xdist (3.8) writes
# into each node id; pytest 9 keeps node ids elsewhere, so the suffix is lost and every test was its own unit
# (the Ray tests ran on both workers, each starting its clusters). Here each worker writes the groups it
# collected to a file the controller's scheduler reads: the same units, through xdist's public hooks.
def pytest_configure(config):
    if _is_xdist_controller(config) and getattr(config.option, "dist", None) == "loadgroup":
        config._xdist_groups = os.path.join(tempfile.gettempdir(), f"marl-xdist-groups-{os.getpid()}")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    if getattr(node.config, "_xdist_groups", None):
        node.workerinput["marl_xdist_groups"] = node.config._xdist_groups


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    path = getattr(config, "_xdist_groups", None)
    if path is None:
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # units in the collection's order (pytest_collection_modifyitems)

    class GroupScheduling(LoadScopeScheduling):
        """loadgroup's units: a test alone, or every test of one xdist_group (read from the workers' file)."""
        groups: dict | None = None

        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):  # a group suffix xdist managed to write
                return nodeid.split("@")[-1]
            if self.groups is None:  # every worker has collected (and written its file) by now
                files = sorted(glob.glob(path + ".*"))
                with open(files[0]) as source:
                    self.groups = json.load(source)
            return self.groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)


def _xdist_group(item) -> str | None:
    """The item's xdist group (several marks: their names joined, as pytest-xdist does), or None."""
    names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                    for mark in item.iter_markers("xdist_group")})
    return "_".join(names) or None


def _start_order(item) -> tuple[int, int]:
    """0: needs no built model (runs while the demo model builds); 1: Ray (one long group, started
    early so it is not the tail); 2: other slow tests; 3: the rest.

    Within Ray: 0, no model and no cluster in this process (subprocesses); 1, the micro model on the shared
    `ray_cluster`; 2, the demo model on it; 3, runs that start their own local cluster (the shared one is
    stopped first): the shared cluster starts once and the demo model has had the longest to build."""
    names = getattr(item, "fixturenames", ())
    if "demo_model_dir" not in names and item.get_closest_marker("slow") is None:
        return 0, 0
    if item.get_closest_marker("ray") is not None:
        shared, demo = "ray_cluster" in names, "demo_model_dir" in names
        return 1, (2 if shared else 3) if demo else int(shared)
    return (2 if item.get_closest_marker("slow") is not None else 3), 0


def pytest_collection_modifyitems(config, items):
    """Ray tests share one xdist worker (one local cluster at a time, `--dist loadgroup`); tests that
    need no built model run first, giving the model build its head start, then the long ones, so that
    no long test is left for the end (a stable sort: within each part, the files' order).

    Tests marked `real` (the real packaged model, minutes each) are deselected unless the -m expression
    names them (`make test-real`): a -m in PYTEST_ARGS replaces, not extends, any -m before it."""
    if "real" not in (config.option.markexpr or ""):
        real = [item for item in items if item.get_closest_marker("real") is not None]
        if real:
            config.hook.pytest_deselected(items=real)
            items[:] = [item for item in items if item.get_closest_marker("real") is None]
    for item in items:
        if item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.xdist_group("ray"))
    # a group is one unit, sent where its first test stands: it takes the part of its latest-starting test
    order = {item.nodeid: _start_order(item) for item in items}
    part: dict[str, int] = {}
    for item in items:
        if (group := _xdist_group(item)) is not None:
            part[group] = max(part.get(group, 0), order[item.nodeid][0])
    items.sort(key=lambda item: (part.get(_xdist_group(item), order[item.nodeid][0]), order[item.nodeid][1]))
    path = getattr(config, "workerinput", {}).get("marl_xdist_groups")
    if path:  # for the controller's scheduler (above)
        mine = f"{path}.{config.workerinput['workerid']}"
        with open(mine + ".part", "w") as sink:
            json.dump({item.nodeid: group for item in items if (group := _xdist_group(item))}, sink)
        os.replace(mine + ".part", mine)


# -- one local Ray cluster for the Ray tests -------------------------------------------------------------
_SHARED_RAY: list = []  # [ray] while the cluster `ray_cluster` started is up


@pytest.fixture
def ray_cluster():
    """A local Ray cluster (this machine's CPUs, loopback only, a 128 MB object store) opened here the way a
    caller's own `ray.init` is: the players and runs of the test find Ray initialised and use it (connect),
    and a run leaves it up (it stops only a cluster it started). Started on first use and kept for the next
    Ray test (they share one xdist worker): stopped after the last one (pytest_runtest_teardown), so each
    test pays a cluster's start-up once per session, not once per run."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        from trainers.ray.cluster import _worker_environment

        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # as trainers.ray.cluster.connect: loopback only
        ray.init(num_cpus=os.cpu_count() or 1, object_store_memory=128 * 2 ** 20, _node_ip_address="127.0.0.1",
                 include_dashboard=False, log_to_driver=False, configure_logging=False,
                 runtime_env={"env_vars": _worker_environment()})
        _SHARED_RAY[:] = [ray]
    yield ray


@pytest.fixture
def no_ray_session():
    """For a test whose run starts (and stops) its own local cluster: the shared one, if up, is stopped first."""
    _stop_shared_ray()


def _stop_shared_ray() -> None:
    if _SHARED_RAY:
        _SHARED_RAY.pop().shutdown()


def pytest_runtest_teardown(item, nextitem):
    """The shared Ray cluster stops after the last test that uses it (the Ray group runs those together):
    its memory and daemons are not left to the tests that follow, nor beside a cluster another test starts."""
    if _SHARED_RAY and (nextitem is None or "ray_cluster" not in getattr(nextitem, "fixturenames", ())):
        _stop_shared_ray()


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


@pytest.fixture
def micro_policy():
    """Factory of a fresh, seeded, untrained micro Llama (2 layers, hidden 32) and its char tokenizer."""
    from helpers.char_model import micro_char_llama

    return micro_char_llama


@pytest.fixture(scope="session")
def addition():
    from marl.addition import addition_splits

    return addition_splits(seed=0)


@pytest.fixture(scope="session")
def demo_model_dir(addition):
    """The default tiny model, SFT-warmed (built on first use, ~1 min, then cached on disk)."""
    from trainers.policy.addition_model import demo_policy

    return demo_policy(addition, log=lambda message: None)


@pytest.fixture(scope="session")
def real_model_dirs(tmp_path_factory):
    """architecture -> a saved random Qwen2 / Llama / GPT-2 directory with a BPE tokenizer and ChatML
    template (tests/helpers/real_models.py; built once per session, a second or so each)."""
    from helpers.real_models import ARCHITECTURES, build_bpe_tokenizer, build_model_dir

    root, tokenizer = tmp_path_factory.mktemp("real_models"), build_bpe_tokenizer()
    return {arch: build_model_dir(arch, root / arch, tokenizer=tokenizer) for arch in ARCHITECTURES}
