"""The tree shows the architecture: no import cycle, layers that only point down, rooms of a readable size."""

import subprocess
import sys
from pathlib import Path

from helpers.import_graph import cycles, heavy_modules, import_graph, lazy_imports_without_reason, module_files
from helpers.paths import ROOT

MAX_MODULES_PER_FOLDER = 15
LAZY_NAMES = "from common.lazy import lazy_names"  # a package top may import this, and nothing else
# Libraries an import inside a function may load lazily (issue 30: imports at the top unless heavy, or with a
# `# lazy: why` comment); so may a project module that loads one of them at import (heavy_modules).
HEAVY = {
    # the model stack: torch itself, or libraries that load it or large native code (seconds)
    "torch", "transformers", "peft", "trl", "accelerate", "datasets", "tokenizers", "safetensors", "gguf",
    # service clients: the judge's HTTP SDK and its transport, the tracker (0.1 s to seconds, threads)
    "openai", "httpx", "wandb",
    # optional: the [ray], [bench] and dev extras, and psutil (not a declared dependency): modules import without them
    "ray", "shap", "sklearn", "krippendorff", "nltk", "psutil",
    # the scientific stack: 0.1 s (numpy) to 1 s (scipy.stats) each; judges' rules and marl's CLI paths load none
    "numpy", "scipy", "matplotlib", "networkx", "pettingzoo", "gymnasium",
}


def test_the_import_graph_has_no_cycle():
    """File level, counting imports inside functions (a lazy import is still an arrow)."""
    assert cycles(import_graph(ROOT)) == []


def test_the_cycle_check_finds_a_cycle_hidden_in_a_function(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import f\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from pkg import a\n")
    (tmp_path / "pkg" / "c.py").write_text("from . import a\n")
    assert [sorted(cycle) for cycle in cycles(import_graph(tmp_path, ("pkg",)))] == [["pkg.a", "pkg.b"]]


def test_an_import_inside_a_function_is_heavy_or_says_why():
    """At the top of the module unless it loads a heavy library (itself or through a project module that loads
    one at import) or carries a `# lazy: why` comment (a cycle it breaks, an optional dependency...)."""
    wrong = lazy_imports_without_reason(ROOT, HEAVY)
    assert wrong == [], "move these to the top of their module, or say why they are lazy:\n" + "\n".join(wrong)


def test_the_lazy_import_check_finds_a_light_import_in_a_function(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("def __getattr__(name):\n    import importlib\n")  # a package top
    (tmp_path / "pkg" / "light.py").write_text("import json\n")
    (tmp_path / "pkg" / "heavy.py").write_text("import json\nimport torch\n")
    (tmp_path / "pkg" / "through.py").write_text("from pkg.heavy import json\n")  # heavy by way of pkg.heavy
    (tmp_path / "pkg" / "typed.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n")
    (tmp_path / "pkg" / "use.py").write_text(
        "def f():\n    import torch\n    from pkg import through\n    from pkg.typed import TYPE_CHECKING\n"
        "    from . import light\n    import os\n"
        "    # lazy: breaks the cycle use <-> light\n    from pkg.light import json\n    import sys\n"
        "    import re  # lazy: only the --x path needs it\n")
    assert heavy_modules(tmp_path, {"torch"}, ("pkg",)) == {"pkg.heavy", "pkg.through"}
    assert lazy_imports_without_reason(tmp_path, {"torch"}, ("pkg",)) == [
        "pkg/use.py:4: from pkg.typed import TYPE_CHECKING", "pkg/use.py:5: from . import light",
        "pkg/use.py:6: import os"]


def test_layers_point_down_only():
    """common <- judges <- marl <- trainers: no file of a lower layer imports a higher one."""
    lower = {"common": {"judges", "marl", "trainers"}, "judges": {"marl", "trainers"}, "marl": {"trainers"},
             "trainers": set()}
    wrong = [(module, target) for module, targets in import_graph(ROOT).items() for target in targets
             if target.split(".")[0] in lower[module.split(".")[0]]]
    assert wrong == []


def test_nothing_imports_the_command_line():
    importers = [module for module, targets in import_graph(ROOT).items()
                 if not module.startswith("trainers.cli") and any(t.startswith("trainers.cli") for t in targets)]
    assert importers == []


def test_no_folder_holds_more_than_about_fifteen_modules():
    folders = {}
    for path in module_files(ROOT).values():
        folders.setdefault(path.parent.relative_to(ROOT), []).append(path.name)
    crowded = {str(folder): len(names) for folder, names in folders.items()
               if len([n for n in names if n != "__init__.py"]) > MAX_MODULES_PER_FOLDER}
    assert crowded == {}


def test_every_package_says_what_its_room_holds_and_imports_nothing_eagerly():
    for name, path in module_files(ROOT).items():
        if path.name != "__init__.py":
            continue
        text = path.read_text()
        assert text.startswith('"""') and "May import" in text, f"{path}: no docstring saying what the room may import"
        body = [line for line in text.split('"""', 2)[-1].splitlines() if line.startswith(("import ", "from "))
                and not line.startswith(LAZY_NAMES)]  # the public names' PEP 562 hook, itself import-free
        assert body == [], f"{path} imports eagerly: {body}"


def test_every_room_imports_without_heavy_libraries():
    """Importing any package (not its modules) loads no torch, transformers, wandb or openai."""
    packages = sorted(name for name, path in module_files(ROOT).items() if path.name == "__init__.py")
    code = f"import sys; import {', '.join(packages)}; print(' '.join(sorted(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert not {name for name in loaded if name.split(".")[0] in ("torch", "transformers", "wandb", "openai")}


def test_the_graph_script_runs_and_reports_the_rooms():
    out = subprocess.run([sys.executable, str(Path(ROOT, "tests", "helpers", "import_graph.py"))],
                         capture_output=True, text=True)
    summary = next(line for line in out.stdout.splitlines() if line.endswith(" cycles"))
    assert "trainers.grpo " in out.stdout and summary.endswith(" 0 cycles") and out.returncode == 0, out.stdout
