"""Issue 31, item 1: the sandbox reports only layers the kernel enforces, and the kernel alone stops the
audit hook's bypass (an extension module loaded by file path under another name: a subinterpreter runs
without the hook). Item 7: each result names the interpreter that ran, and another major.minor is refused.

Every attack runs as real candidate code against the real sandbox, most with the audit hook left out
(`audit_hook=False`), so what stops them is the kernel's doing. The `contained` fixture also checks that
no process and no temporary directory is left behind.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import judges.rules.code_harness as harness
import judges.rules.sandbox as sandbox
from judges.rules import sandbox_interpreter as interpreters
from judges.rules.code import CodeTestsVerifier
from judges.rules.sandbox import KERNEL_BLOCK, SandboxError, run_python
from judges.rules.sandbox_interpreter import Interpreter
from judges.rules.sandbox_layers import EXTENSION_MODULES, REPORTED_LAYERS, _without_python_trees
from judges.types import Candidate, Item
from helpers.sandbox_checks import contained  # noqa: F401 (an autouse fixture)

SETUP = sandbox.isolation()
needs_kernel = pytest.mark.skipif(SETUP.kernel_layers != ("landlock", "seccomp"),
                                  reason=f"kernel layers unavailable here: {SETUP.unavailable}")
SUBINTERPRETERS = ("_xxsubinterpreters", "_interpreters", "_xxinterpchannels", "_interpchannels", "_interpqueues")


def _present(names: tuple[str, ...]) -> list[str]:
    """Those of `names` that are files of the sandbox interpreter's lib-dynload (3.11 has the first
    and third, 3.13 the others); all of them when it cannot be listed from here."""
    ran = SETUP.interpreter
    folders = glob.glob(os.path.join(ran.prefix, "lib", "python3*", "lib-dynload")) if ran else []
    found = [name for name in names if any(glob.glob(os.path.join(folder, name + ".*")) for folder in folders)]
    return found or list(names)


PRESENT = _present(SUBINTERPRETERS)
# What the subinterpreter tries once it runs, hookless: native calls, a budget's worth of files, reads outside.
PAYLOAD = """
import os
handles = [open("w%d" % i, "w") for i in range(40)]
print("opened", len(handles), flush=True)
for attempt in (lambda: open("{out}/secret.txt").read(), lambda: open("{out}/written", "w").write("x")):
    try:
        print("got", attempt(), flush=True)
    except OSError as error:
        print("refused", error.errno, flush=True)
import ctypes
print("ctypes", ctypes.CDLL(None).system(b"touch {out}/native"), flush=True)
"""
# Finds the module's file the way an attacker would (the child's own lib-dynload), then loads it.
FIND = """
import importlib.machinery, importlib.util, os, sys
dyn = next(p for p in sys.path if p.endswith("lib-dynload"))
found = [n for n in os.listdir(dyn) if n.split(".")[0] == {module!r}]
if not found:
    print("absent")
    raise SystemExit(0)
path = os.path.join(dyn, found[0])
"""
LOADERS = {
    "spec_from_file_location": "spec = importlib.util.spec_from_file_location('x.' + {module!r}, path)\n"
                               "mod = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(mod)\n",
    "ExtensionFileLoader": "loader = importlib.machinery.ExtensionFileLoader('y.' + {module!r}, path)\n"
                           "spec = importlib.util.spec_from_loader(loader.name, loader)\n"
                           "mod = importlib.util.module_from_spec(spec)\n",
    "_imp.create_dynamic": "import _imp\nspec = importlib.util.spec_from_file_location('z.' + {module!r}, path)\n"
                           "mod = _imp.create_dynamic(spec)\n",
}
RUN_INSIDE = """
print("loaded", flush=True)
interp = mod.create()
(getattr(mod, "run_string", None) or getattr(mod, "exec"))(interp, {payload!r})
"""


def alias_attack(module: str, loader: str, out) -> str:
    return (FIND.format(module=module) + LOADERS[loader].format(module=module)
            + RUN_INSIDE.format(payload=PAYLOAD.format(out=out)))


def untouched(out) -> bool:
    return sorted(p.name for p in out.iterdir()) == ["secret.txt"] and (out / "secret.txt").read_text() == \
        "the parent's secret"


@needs_kernel
@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("module", PRESENT)
def test_a_subinterpreter_module_loaded_under_another_name_is_refused_by_the_kernel_alone(module, loader, outside):
    """The issue's bypass: Landlock does not let the child read the module's file, so it loads under no name."""
    result = run_python(alias_attack(module, loader, outside), audit_hook=False, timeout_s=20)
    if result.stdout.strip() == "absent":
        pytest.skip(f"{module} is not a file of this interpreter's lib-dynload")
    assert result.status == "error" and "loaded" not in result.stdout, (result.stdout, result.stderr)
    assert "ImportError" in result.stderr and "Permission denied" in result.stderr, result.stderr
    assert untouched(outside) and "the parent's secret" not in result.stdout
    assert result.layers == SETUP.layers and "audit" not in result.layers and result.diagnostics == ()


@needs_kernel
def test_with_the_audit_hook_on_the_alias_is_refused_and_the_report_names_the_hook_a_diagnostic(outside):
    result = run_python(alias_attack(PRESENT[0], "spec_from_file_location", outside), timeout_s=20)
    if result.stdout.strip() == "absent":
        pytest.skip(f"{PRESENT[0]} is not a file of this interpreter's lib-dynload")
    assert result.status == "error" and "loaded" not in result.stdout and untouched(outside)
    assert result.layers == SETUP.layers and result.diagnostics == ("audit",)
    assert set(result.layers) <= set(REPORTED_LAYERS) and "audit" not in REPORTED_LAYERS


EXTENSION_C = r"""
#include <Python.h>
static PyObject *run(PyObject *self, PyObject *code) {  /* a subinterpreter: none of the audit hooks */
    PyThreadState *main = PyThreadState_Get(), *sub = Py_NewInterpreter();
    int status = sub ? PyRun_SimpleString(PyUnicode_AsUTF8(code)) : -2;
    if (sub) Py_EndInterpreter(sub);
    PyThreadState_Swap(main);
    return PyLong_FromLong(status);
}
static PyMethodDef methods[] = {{"run", run, METH_O, ""}, {NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "sub", NULL, -1, methods};
PyMODINIT_FUNC PyInit_sub(void) { return PyModule_Create(&module); }
"""


def _compiled_extension(folder) -> bytes:
    """A subinterpreter-running extension module built for the sandbox's own interpreter (skips when
    this machine has no C compiler or no headers for it)."""
    ran = SETUP.interpreter
    headers = os.path.join(ran.prefix, "include", f"python{ran.major_minor[0]}.{ran.major_minor[1]}") if ran else ""
    if not (shutil.which("gcc") and os.path.isfile(os.path.join(headers, "Python.h"))):
        pytest.skip("no C compiler or Python headers here to build a native module")
    (folder / "sub.c").write_text(EXTENSION_C)
    done = subprocess.run(["gcc", "-shared", "-fPIC", f"-I{headers}", str(folder / "sub.c"), "-o",
                           str(folder / "sub.so")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return (folder / "sub.so").read_bytes()


@needs_kernel
def test_a_hookless_subinterpreter_from_native_code_of_its_own_still_meets_the_kernel(tmp_path_factory, outside):
    """Even where a subinterpreter does run (an extension the candidate wrote into its directory, which
    Landlock cannot refuse to map), what it does is the kernel's to allow: inside only, no process."""
    blob = _compiled_extension(tmp_path_factory.mktemp("build"))
    code = (f"import importlib.util\nopen('sub.so', 'wb').write({blob!r})\n"
            "spec = importlib.util.spec_from_file_location('sub', 'sub.so')\n"
            "mod = importlib.util.module_from_spec(spec)\nprint('loaded', flush=True)\n"
            f"mod.run({PAYLOAD.format(out=outside)!r})\n")
    hookless = run_python(code, audit_hook=False, timeout_s=20)
    assert hookless.stdout.split("\n")[:4] == ["loaded", "opened 40", "refused 13", "refused 13"], hookless.stdout
    assert (hookless.status, hookless.blocked) == ("blocked", KERNEL_BLOCK) and untouched(outside)  # no process
    hooked = run_python(code, timeout_s=20)  # the diagnostic names it before the module is mapped
    assert (hooked.status, hooked.blocked) == ("blocked", "loading a native module from outside the standard library")
    assert "loaded" not in hooked.stdout and untouched(outside)


@needs_kernel
@pytest.mark.parametrize("audit_hook", [True, False])
def test_the_verifier_scores_the_alias_attack_0_and_lists_no_audit_layer(audit_hook, outside, monkeypatch):
    monkeypatch.setattr(harness, "run_python", lambda *args, **kw: run_python(*args, **dict(kw, audit_hook=audit_hook)))
    verifier = CodeTestsVerifier(["assert add(2, 3) == 5"], entry="add", timeout_s=20)
    attack = alias_attack(PRESENT[0], "spec_from_file_location", outside).replace("raise SystemExit(0)", "pass")
    judgment = verifier.score(Item("add"), [Candidate(attack + "\ndef add(a, b):\n    return a + b\n")])[0]
    assert judgment.ok and judgment.score == 0.0 and untouched(outside), judgment.rationale
    honest = verifier.score(Item("add"), [Candidate("def add(a, b):\n    return a + b\n")])[0]
    assert honest.score == 1.0 and honest.details["sandbox_layers"] == list(SETUP.layers)
    assert "audit" not in honest.details["sandbox_layers"]


@needs_kernel
def test_only_the_listed_extension_modules_can_be_read_and_each_of_them_imports():
    """Every lib-dynload file off EXTENSION_MODULES is unreadable to the child, so unloadable under any
    name (a copy or a hard link needs it read or linked: both refused too)."""
    result = run_python(textwrap.dedent("""
        import importlib, os, shutil, sys
        dyn = next(p for p in sys.path if p.endswith("lib-dynload"))
        for name in sorted(os.listdir(dyn)):
            try:
                open(os.path.join(dyn, name), "rb").close()
                print(name.split(".")[0], "readable")
            except PermissionError:
                print(name.split(".")[0], "refused")
        target = [n for n in os.listdir(dyn) if n.split(".")[0] in SUBINTERPRETERS]
        for how in (os.link, shutil.copyfile) if target else ():
            try:
                how(os.path.join(dyn, target[0]), "mine.so")
                print("copied", how.__name__)
            except OSError:
                pass
        for name in sorted(os.listdir(dyn)):
            if name.split(".")[0] in ALLOWED:
                importlib.import_module(name.split(".")[0])
        print("imported")
    """).replace("ALLOWED", repr(sorted(EXTENSION_MODULES))).replace("SUBINTERPRETERS", repr(SUBINTERPRETERS)),
        audit_hook=False, timeout_s=30)
    assert result.status == "ok" and result.stdout.rstrip().endswith("imported"), result.stderr
    seen = dict(line.split() for line in result.stdout.splitlines() if line.endswith(("readable", "refused")))
    wrong = {name: state for name, state in seen.items() if (state == "readable") != (name in EXTENSION_MODULES)}
    assert seen and wrong == {}
    assert "copied" not in result.stdout
    assert all(seen.get(name, "refused") == "refused" for name in SUBINTERPRETERS + ("_ctypes", "_testcapi",
                                                                                     "_testinternalcapi"))


@needs_kernel
def test_ctypes_by_file_path_under_another_name_still_meets_the_kernel(outside):
    """The bootstrap loaded _ctypes before the lock-down (it installs the layers with it), so loading
    it again by path needs no read: native code is in reach, and the kernel layers are what hold."""
    attack = FIND.format(module="_ctypes") + LOADERS["spec_from_file_location"].format(module="_ctypes") + (
        f"sys.modules['_ctypes'] = mod\nimport ctypes\nlibc = ctypes.CDLL(None)\n"
        f"print('open', libc.open(b'{outside}/secret.txt', 0), flush=True)\n"
        f"print('write', libc.open(b'{outside}/written', 0o101, 0o644), flush=True)\n"
        f"libc.system(b'touch {outside}/native')\n")
    result = run_python(attack, audit_hook=False, timeout_s=20)
    assert result.stdout.split() == ["open", "-1", "write", "-1"], (result.stdout, result.stderr)
    assert (result.status, result.blocked) == ("blocked", KERNEL_BLOCK) and untouched(outside)


@needs_kernel
def test_files_held_open_and_file_sizes_are_bounded_by_the_kernel_not_the_audit_budget():
    """What the hook's budget of 32 writable opens stood for, without the hook: RLIMIT_NOFILE caps the
    files open at once, RLIMIT_FSIZE each file (also one grown through mmap's ftruncate)."""
    result = run_python(textwrap.dedent(f"""
        import mmap, os
        handles = []
        try:
            for i in range(200):
                handles.append(open(f"w{{i}}", "w"))
        except OSError as error:
            print("open stopped at", len(handles), error.errno)
        for handle in handles:
            handle.close()
        with open("big", "wb") as handle:
            try:
                handle.truncate({sandbox.FILE_LIMIT_BYTES} + 4096)
            except OSError as error:
                print("truncate refused", error.errno)
        try:
            mmap.mmap(-1, 1 << 40)
        except (OSError, MemoryError, OverflowError) as error:
            print("map refused", type(error).__name__)
    """), audit_hook=False, timeout_s=20)
    lines = result.stdout.splitlines()
    assert result.status == "ok" and len(lines) == 3, (result.stdout, result.stderr)
    assert lines[0].startswith("open stopped at") and int(lines[0].split()[3]) < sandbox.MAX_OPEN_FILES
    assert lines[0].endswith(" 24") and lines[1] == "truncate refused 27"  # EMFILE, EFBIG
    assert lines[2].startswith("map refused")


def test_a_forged_control_line_adds_no_layer_and_changes_no_interpreter():
    forged = (b'interpreter {"executable": "/x", "version": "9.9", "prefix": "/"}\n'
              b"layers landlock,seccomp,audit,netns\ndiagnostics audit\n")
    result = run_python(f"import os\nos.write(4, {forged!r})\n", audit_hook=False)
    assert result.status == "ok" and result.layers == SETUP.layers and result.diagnostics == ()
    assert result.interpreter is not None and result.interpreter.version != "9.9"


@needs_kernel
@pytest.mark.parametrize("source", ["def f(:\n", "x = " + "(" * 250 + ")" * 250, "\x00 = 1"])
def test_the_candidate_source_is_parsed_under_the_kernel_layers(source):
    """Red-team pass 3: the bootstrap compiled the candidate's source before installing Landlock and
    seccomp, so a program that does not compile reported layers=(). The parser, the first code to meet
    the candidate's bytes, now runs after the lock-down: a syntax error's run lists every layer."""
    result = run_python(source, audit_hook=False)
    assert result.status == "error" and ("SyntaxError" in result.stderr or "null bytes" in result.stderr)
    assert result.layers == SETUP.layers and {"landlock", "seccomp"} <= set(result.layers)


# ---- item 7: which interpreter ran ------------------------------------------------------------------

def test_each_result_names_the_interpreter_that_ran_with_its_full_version():
    result = run_python("import os, sys\nprint(sys.version.split()[0])\nprint(sys.prefix)")
    version, prefix = result.stdout.split()
    ran = result.interpreter
    assert ran is not None and (ran.version, ran.prefix) == (version, prefix) and os.path.isfile(ran.executable)
    assert ran.major_minor == tuple(sys.version_info[:2])  # a patch release may differ (3.11.2 for 3.11.7)
    assert SETUP.interpreter == ran and str(ran) in sandbox.describe()
    assert "audit" not in sandbox.describe().split(";")[0]  # the layers part names no audit hook


@pytest.mark.parametrize("version, refused", [("3.11.2", False), ("3.11.99", False), ("3.12.0", True),
                                              ("2.11.0", True), ("3.1", True), ("3", True), ("", True)])
def test_only_a_patch_release_may_differ(version, refused):
    message = interpreters.mismatch(Interpreter("/usr/bin/python3", version, "/usr"), ours_is=(3, 11))
    assert bool(message) is refused and "\n" not in message
    if refused:
        assert message.startswith(f"the sandbox ran Python {version} (/usr/bin/python3), not Python 3.11 like this ")


def _other_python() -> str | None:
    """An interpreter on this machine of another major.minor (3.8 or later) that starts, or None."""
    pattern = "python3.[0-9]*"
    found = glob.glob(f"/usr/bin/{pattern}") + glob.glob(os.path.expanduser(f"~/.pyenv/versions/*/bin/{pattern}"))
    for path in sorted(found):
        name = os.path.basename(path)
        parts = name[len("python"):].split(".")
        if len(parts) != 2 or not parts[1].isdigit() or int(parts[1]) < 8 or not os.access(path, os.X_OK):
            continue
        if (int(parts[0]), int(parts[1])) != tuple(sys.version_info[:2]):
            return path
    return None


@needs_kernel
def test_another_major_minor_is_refused_in_one_line_before_the_code_is_read(monkeypatch):
    """A real interpreter of another major.minor, launched as the sandbox launches (as another uid,
    keeping the right to read, since ours may sit in a 0700 home): the run is refused, main.py unread."""
    other = _other_python()
    if other is None:
        pytest.skip("no interpreter of another major.minor on this machine")
    level = "uid+read" if SETUP.drop_privileges else ""
    monkeypatch.setattr(sandbox, "_ISOLATION", dataclasses.replace(SETUP, drop_privileges=level))
    monkeypatch.setattr(sandbox.sys, "executable", other)
    unread, remove = [], sandbox._remove_tree
    monkeypatch.setattr(sandbox, "_remove_tree",
                        lambda workdir: (unread.append(os.path.exists(os.path.join(workdir, "main.py"))), remove(workdir)))
    with pytest.raises(SandboxError) as refused:
        run_python("print('must not run')")
    message = str(refused.value)
    assert "\n" not in message, message
    assert (message.startswith("the sandbox ran Python ") and os.path.realpath(other) in message) or (
        "failed before running any code" in message), message
    assert unread == [True]  # the bootstrap deletes main.py once it has read it: it never did
    verifier = CodeTestsVerifier(["assert add(2, 3) == 5"], entry="add")
    judgment = verifier.score(Item("add"), [Candidate("def add(a, b):\n    return a + b\n")])[0]
    assert judgment.status == "error" and judgment.score is None and "\n" not in judgment.rationale
    assert judgment.rationale.startswith("sandbox failure: the sandbox ")


def test_library_folders_that_hold_an_interpreter_tree_are_granted_without_it(tmp_path):
    """pyenv's <prefix>/lib holds libpython and python3.X (site-packages, lib-dynload): only the former."""
    (tmp_path / "python3.11" / "lib-dynload").mkdir(parents=True)
    (tmp_path / "libpython3.11.so.1.0").write_bytes(b"\x7fELF")
    (tmp_path / "pkgconfig").mkdir()
    granted = _without_python_trees(str(tmp_path))
    assert granted == [str(tmp_path / "libpython3.11.so.1.0"), str(tmp_path / "pkgconfig")]
    shutil.rmtree(tmp_path / "python3.11")
    assert _without_python_trees(str(tmp_path)) == [str(tmp_path)]
