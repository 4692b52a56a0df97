"""The project's import graph, read from the source with `ast` (imports inside functions count too).

Run it to see the rooms and any cycle:  python tests/helpers/import_graph.py
"""

from __future__ import annotations

import ast
import collections
import sys
from pathlib import Path

PACKAGES = ("common", "judges", "marl", "trainers")


def module_files(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the packages under `root`."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def _target(name: str, modules: dict[str, Path]) -> str | None:
    """The project module an imported name lives in (`a.b.c` -> `a.b` when c is an attribute)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported_names(tree: ast.AST, package: str) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package upwards
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names += [f"{base}.{alias.name}" for alias in node.names]
    return names


def import_graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    """Module -> the project modules it imports (at module level or inside a function)."""
    modules = module_files(root, packages)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for imported in _imported_names(ast.parse(path.read_text(encoding="utf-8")), package):
            target = _target(imported, modules)
            if target and target != name:
                graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle of the graph (networkx), shortest first."""
    import networkx as nx

    found = nx.simple_cycles(nx.DiGraph([(a, b) for a, targets in graph.items() for b in targets]))
    return sorted(found, key=len)


def room(module: str) -> str:
    """A module's room: its package and subpackage (`trainers.grpo.trainer` -> `trainers.grpo`)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else parts[0]


def main() -> int:
    """Print the rooms each room imports, then the cycles (exit 1 if there is one)."""
    root = Path(__file__).resolve().parents[2]
    graph = import_graph(root)
    rooms = collections.defaultdict(set)
    for module, targets in graph.items():
        rooms[room(module)] |= {room(t) for t in targets} - {room(module)}
    for name in sorted(rooms):
        print(f"{name:18} -> {', '.join(sorted(rooms[name])) or '-'}")
    found = cycles(graph)
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports, {len(found)} cycles")
    for cycle in found:
        print("cycle:", " -> ".join(cycle + cycle[:1]))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
