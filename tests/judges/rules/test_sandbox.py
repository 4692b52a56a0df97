"""The sandbox and the code-tests verifier against real subprocesses running hostile code.

Every test checks that the test process carries on, that no child process is left behind and that
every temporary directory the sandbox made is gone.
"""

from __future__ import annotations

import os
import socket
import textwrap
import uuid

import pytest

import judges.rules.sandbox as sandbox
from judges.rules.code import CodeTestsVerifier, extract_code, parse_tests, values_match
from judges.rules.sandbox import isolation, run_python
from judges.types import Candidate, Item
from helpers.sandbox_checks import contained  # noqa: F401 (an autouse fixture)


def test_ordinary_code_runs_with_stdin_files_and_the_standard_library():
    code = textwrap.dedent("""
        import collections, dataclasses, json, math, pathlib, re, tempfile, typing
        print(input()[::-1], open('data.txt').read())
        pathlib.Path('out.txt').write_text('kept inside')
        with tempfile.NamedTemporaryFile('w') as handle:
            handle.write('x')
        print(collections.Counter('aab').most_common(1), math.gcd(12, 18))
    """)
    result = run_python(code, stdin="olleh\n", files={"data.txt": "world"})
    assert result.status == "ok", result.stderr
    assert result.stdout.splitlines() == ["hello world", "[('a', 2)] 6"]
    assert result.returncode == 0 and not result.truncated


def test_the_sandbox_runs_unprivileged_when_we_are_root():
    result = run_python("import os; print(os.getuid(), os.getgid(), os.getgroups())")
    uid, gid, groups = result.stdout.split(maxsplit=2)
    if os.geteuid() == 0 and isolation().drop_privileges:
        assert int(uid) != 0 and int(gid) != 0 and groups.strip() == "[]"


def test_an_infinite_loop_times_out():
    result = run_python("while True:\n    pass", timeout_s=1.0, cpu_s=5)
    assert result.status == "timeout" and result.seconds < 5  # the wall clock stopped it, before the CPU limit


def test_sleeping_past_the_wall_clock_times_out():
    result = run_python("import time\ntime.sleep(60)", timeout_s=0.5)
    assert result.status == "timeout" and result.seconds < 3


def test_the_cpu_limit_stops_a_busy_loop():
    """The CPU limit, not the wall clock, ends it (SIGXCPU, or SIGKILL at the hard limit a second later
    where the child is a PID namespace's init), however slowly a loaded machine runs it."""
    result = run_python("while True:\n    pass", timeout_s=120, cpu_s=1)
    assert result.status == "timeout" and result.seconds < 120


@pytest.mark.parametrize("code", [
    "import os\nwhile True:\n    os.fork()",
    "import subprocess\nsubprocess.run(['echo', 'hi'])",
    "import os\nos.system('echo hi')",
    "import os\nos.posix_spawn('/bin/echo', ['echo'], {})",
    "import os\nos.execv('/bin/echo', ['echo'])",
    "import _posixsubprocess\n_posixsubprocess.fork_exec()",
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
    "import pty\npty.fork()",
])
def test_process_creation_and_signals_are_blocked(code):
    result = run_python(code, timeout_s=5)
    assert result.status == "blocked" and result.returncode == sandbox.BLOCKED_EXIT
    assert "hi" not in result.stdout


@pytest.mark.parametrize("code", [
    "x = ' ' * 10**10",
    "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))",
])
def test_memory_bombs_hit_the_limit(code):
    result = run_python(code, memory_mb=256, timeout_s=10)
    assert result.status == "memory"


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    yield server
    server.close()


@pytest.mark.parametrize("target", ["('127.0.0.1', PORT)", "('1.1.1.1', 80)", "('8.8.8.8', 53)"])
def test_network_connections_are_blocked_before_any_packet(listener, target):
    port = listener.getsockname()[1]
    code = f"import socket\ns = socket.create_connection({target.replace('PORT', str(port))}, timeout=2)\nprint('up')"
    result = run_python(code, timeout_s=5)
    assert result.status == "blocked" and result.blocked == "socket" and "up" not in result.stdout
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody ever connected


def test_name_resolution_is_blocked():
    result = run_python("import socket\nprint(socket.getaddrinfo('example.com', 80))")
    assert result.status == "blocked"


@pytest.mark.parametrize("template", [
    "open({path!r}, 'w').write('escaped')",
    "import os\nos.close(os.open({path!r}, os.O_CREAT | os.O_WRONLY))",
    "import pathlib\npathlib.Path({path!r}).write_text('escaped')",
    "import os\nopen('../' + os.path.basename({path!r}), 'w').write('escaped')",
    "import os\nfd = os.open('/tmp', os.O_RDONLY)\n"
    "os.close(os.open(os.path.basename({path!r}), os.O_CREAT | os.O_WRONLY, dir_fd=fd))",
    "import os\nos.symlink('/tmp', 'link')\nopen('link/' + os.path.basename({path!r}), 'w').write('escaped')",
    "import os\nos.chdir('/tmp')\nopen(os.path.basename({path!r}), 'w').write('escaped')",
    "import shutil\nopen('f', 'w').write('x')\nshutil.move('f', {path!r})",
])
def test_writing_outside_the_temporary_directory_is_blocked(template):
    path = f"/tmp/marl_sandbox_escape_{uuid.uuid4().hex}"
    result = run_python(template.format(path=path))
    assert result.status == "blocked"
    assert not os.path.exists(path)


@pytest.mark.parametrize("code", [
    "print(open('/etc/hostname').read())",
    "print(open('/proc/self/environ').read())",
    "import os\nprint(os.listdir('/'))",
    f"print(open({__file__!r}).read())",
])
def test_reading_outside_the_sandbox_and_the_standard_library_is_blocked(code):
    assert run_python(code).status == "blocked"


def test_the_disk_a_run_can_fill_is_bounded():
    many = run_python("for i in range(100):\n    open(f'f{i}', 'w').write('x')")
    assert many.status == "blocked" and "too many files" in many.blocked
    big = run_python(textwrap.dedent(f"""
        import os
        try:
            with open('big', 'wb') as handle:
                handle.write(b'x' * {sandbox.FILE_LIMIT_BYTES + 1})
        except OSError as error:
            print('refused', error.strerror)
        print(os.path.getsize('big'))
    """))
    assert big.stdout.split("\n")[:2] == ["refused File too large", str(sandbox.FILE_LIMIT_BYTES)]


def test_the_environment_is_not_inherited(monkeypatch):
    secret = f"secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("MARL_TEST_SECRET", secret)
    result = run_python("import os\nprint(dict(os.environ))")
    assert result.status == "ok" and secret not in result.stdout and "MARL_TEST_SECRET" not in result.stdout
    result = run_python("import os\nprint(open(f'/proc/{os.getppid()}/environ').read())")
    assert result.status == "blocked" and secret not in result.stdout + result.stderr


def test_huge_output_is_capped():
    result = run_python("import sys\nsys.stdout.write('x' * 10**7)\nsys.stderr.write('y' * 10**6)", output_limit=1000)
    assert result.status == "ok" and result.truncated
    assert len(result.stdout) == 1000 and len(result.stderr) == 1000


def test_endless_output_is_capped_and_timed_out():
    result = run_python("while True:\n    print('x' * 1000)", output_limit=5000, timeout_s=0.5)
    assert result.status == "timeout" and result.truncated and len(result.stdout) == 5000


def test_introspection_of_the_caller_is_refused():
    code = textwrap.dedent("""
        import gc, sys
        for probe in (lambda: sys._getframe(), lambda: gc.get_objects(), lambda: sys.settrace(None)):
            try:
                probe()
                print('exposed')
            except AttributeError:
                print('refused')
    """)
    assert run_python(code).stdout.split() == ["refused"] * 3
    assert run_python("import signal\nsignal.signal(signal.SIGALRM, lambda *a: None)").status == "blocked"
    assert run_python("import ctypes").status == "error"


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="timeout_s"):
        run_python("pass", timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        run_python("pass", memory_mb=16)
    with pytest.raises(ValueError, match="relative path"):
        run_python("pass", files={"../x": "y"})


# ---- the code-tests verifier -------------------------------------------------------------------

TESTS = [{"call": "add(2, 3)", "expected": "5"}, {"call": "add(-4, 1)", "expected": -3},
         {"call": "add(10, 32)", "expected": "42"}, "assert add(0, 0) == 0", "assert add(1, 1) > 1"]


def grade(text: str, tests=TESTS, **options):
    verifier = CodeTestsVerifier(tests, entry="add", timeout_s=options.pop("timeout_s", 5), **options)
    return verifier.score(Item("add two numbers"), [Candidate(text)])[0]


def test_a_correct_solution_scores_one():
    judgment = grade("Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\n")
    assert judgment.ok and judgment.score == 1.0 and judgment.details["passed_tests"] == 5
    assert judgment.details["sandbox_layers"] == list(isolation().layers) and "audit" not in isolation().layers


def test_a_partial_solution_scores_the_fraction_unless_all_are_required():
    partial = "def add(a, b):\n    return a + b if a >= 0 else 0"
    assert grade(partial).score == pytest.approx(4 / 5)
    assert grade(partial, require_all=True).score == 0.0


def test_printing_fake_results_earns_nothing():
    fake = textwrap.dedent("""
        for i in range(5):
            print(f"{i} value 5"); print(f"{i} pass"); print("PASSED"); print("done")
        import sys
        sys.stderr.write("ok ok ok")
        def add(a, b):
            return None
    """)
    judgment = grade(fake)
    assert judgment.ok and judgment.score == 0.0


def test_hard_coding_the_visible_examples_fails_the_hidden_ones():
    hard_coded = "def add(a, b):\n    return {(2, 3): 5, (1, 1): 2}.get((a, b), 1)"
    judgment = grade(hard_coded)
    assert judgment.score == pytest.approx(2 / 5)  # the visible example and the loose inequality


@pytest.mark.parametrize("text", ["def add(a, b):\n    pass", "print('hello')", "x = 1", "", "def add(a, b) return a"])
def test_running_without_solving_earns_nothing(text):
    judgment = grade(text)
    assert judgment.ok and judgment.score == 0.0


@pytest.mark.parametrize("text", [
    "def add(a, b):\n    while True:\n        pass",
    "import os\nos.fork()\ndef add(a, b):\n    return a + b",
    "import socket\nsocket.create_connection(('1.1.1.1', 80))\ndef add(a, b):\n    return a + b",
    "x = ' ' * 10**10\ndef add(a, b):\n    return a + b",
    "open('/tmp/marl_sandbox_escape_code', 'w')\ndef add(a, b):\n    return a + b",
    "import os\ndef add(a, b):\n    os._exit(0)",
    "import sys\nsys.exit(0)\ndef add(a, b):\n    return a + b",
    "import os\nos.close(1)\nos.close(3)\nos.close(4)\ndef add(a, b):\n    return a + b",
])
def test_hostile_or_crashing_code_scores_zero(text):
    judgment = grade(text, timeout_s=1.0)
    assert judgment.ok and judgment.score == 0.0
    assert not os.path.exists("/tmp/marl_sandbox_escape_code")


def test_hidden_harness_secrets_are_out_of_reach():
    snoop = textwrap.dedent("""
        import __main__, os
        def add(a, b):
            seen = list(vars(__main__)) + os.listdir('.')
            return a + b if not any('nonce' in str(name) or '_harness' in str(name) for name in seen) else -1
    """)
    assert grade(snoop).score == 1.0


def test_tests_come_from_the_item_and_configuration_errors_are_failures():
    verifier = CodeTestsVerifier(entry="add")
    item = Item("q", metadata={"tests": "assert add(1, 2) == 3\n# a comment\nassert add(2, 2) == 4\n"})
    assert verifier.score(item, [Candidate("def add(a, b):\n    return a + b")])[0].score == 1.0
    missing = verifier.score(Item("q"), [Candidate("def add(a, b):\n    return a + b")])[0]
    assert missing.status == "error" and missing.score is None
    with pytest.raises(ValueError, match="not valid Python"):
        parse_tests(["assert add(1,"])
    with pytest.raises(ValueError, match="must be a statement string"):
        parse_tests([{"call": "add(1, 2)"}])


def test_assert_equal_literal_becomes_an_unforgeable_value_test():
    case, = parse_tests(["assert add(1, 2) == [3]"])
    assert (case.kind, case.source, case.expected) == ("value", "add(1, 2)", "[3]")
    assert parse_tests(["assert add(1, 2) > 2"])[0].kind == "statement"


@pytest.mark.parametrize("got, expected, same", [
    ("0.30000000000000004", "0.3", True), ("5", "5.0", True), ("[1, 2]", "(1, 2)", False),
    ("{'a': 1.0}", "{'a': 1}", True), ("'5'", "5", False), ("Point(x=1)", "Point(x=1)", True), ("nan", "nan", True),
])
def test_values_match(got, expected, same):
    assert values_match(got, expected) is same


def test_extract_code_picks_the_block_defining_the_entry():
    text = "```python\ndef add(a, b):\n    return a + b\n```\nUsage:\n```python\nprint(add(1, 2))\n```"
    assert extract_code(text, "add").startswith("def add")
    assert extract_code(text).startswith("def add")
    assert extract_code("```python\ndef f():\n    return 1\n") == "def f():\n    return 1\n"  # unclosed fence
    assert extract_code("def f(): pass") == "def f(): pass"
