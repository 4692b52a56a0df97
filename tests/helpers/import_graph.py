"""The project's import graph, read from the source with `ast` (imports inside functions count too).

Run it to see the rooms and any cycle:  python tests/helpers/import_graph.py
It also reads which modules load a heavy library at import, and which imports inside functions give no
reason to be there (`lazy_imports_without_reason`).
"""

from __future__ import annotations

import ast
import collections
import re
import sys
from dataclasses import dataclass
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


def _names_of(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """The absolute dotted names one import statement imports (`from a.b import c` -> `a.b.c`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the module's own package upwards
        anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([node.module] if node.module else []))
    return [f"{base}.{alias.name}" for alias in node.names]


def _imported_names(tree: ast.AST, package: str) -> list[str]:
    return [name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            for name in _names_of(node, package)]


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


@dataclass(frozen=True)
class ImportLine:
    """One import statement of a project module, and where it sits."""

    module: str  # the importing module
    path: Path
    line: int
    statement: str  # as `ast.unparse` writes it
    names: tuple[str, ...]  # the absolute dotted names it imports
    in_function: bool  # inside a function body (runs when the function is called)
    type_checking: bool  # under `if TYPE_CHECKING:` (never runs)
    lazy_reason: str  # the `# lazy: ...` comment on its line or the line above, or ""


_LAZY_COMMENT = re.compile(r"#\s*lazy:\s*(\S.*)$")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_lines(root: Path, packages=PACKAGES) -> list[ImportLine]:
    """Every import statement of the packages' modules, with whether it runs at import time."""
    found = []
    for name, path in module_files(root, packages).items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()

        def reason(lineno: int) -> str:
            """The `# lazy:` comment on the line, or above it across comment lines and the imports of its group."""
            index = lineno - 1
            while index >= 0:
                match = _LAZY_COMMENT.search(lines[index])
                if match:
                    return match.group(1).strip()
                index -= 1
                if index < 0 or not lines[index].strip().startswith(("#", "import ", "from ")):
                    return ""
            return ""

        def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
            for field, value in ast.iter_fields(node):
                children = value if isinstance(value, list) else [value]
                for child in children:
                    if not isinstance(child, ast.AST):
                        continue
                    guarded = type_checking or (isinstance(node, ast.If) and field == "body"
                                                and _is_type_checking(node.test))
                    if isinstance(child, (ast.Import, ast.ImportFrom)):
                        found.append(ImportLine(name, path, child.lineno, ast.unparse(child),
                                                tuple(_names_of(child, package)), in_function, guarded,
                                                reason(child.lineno)))
                    visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)),
                          guarded)

        visit(ast.parse(source), False, False)
    return found


def heavy_modules(root: Path, heavy: set[str], packages=PACKAGES) -> set[str]:
    """The project modules whose import loads a library of `heavy`: one of their imports that runs at import
    time (not inside a function, not under `if TYPE_CHECKING:`) names such a library or such a module."""
    modules = module_files(root, packages)
    direct, edges = set(), collections.defaultdict(set)
    for item in import_lines(root, packages):
        if item.in_function or item.type_checking:
            continue
        for imported in item.names:
            target = _target(imported, modules)
            if target:
                edges[target].add(item.module)  # reversed: who imports `target`
            elif imported.split(".")[0] in heavy:
                direct.add(item.module)
    loaded, todo = set(direct), list(direct)
    while todo:
        for importer in edges[todo.pop()] - loaded:
            loaded.add(importer)
            todo.append(importer)
    return loaded


def lazy_imports_without_reason(root: Path, heavy: set[str], packages=PACKAGES) -> list[str]:
    """`file:line: statement` for each import inside a function that has no reason to be there: it names no
    library of `heavy`, no project module that loads one at import (`heavy_modules`), and carries no
    `# lazy: why` comment. Package `__init__` files are left out: their top must import nothing (lazy public
    names), so their `__getattr__` imports where it is."""
    modules, loading = module_files(root, packages), heavy_modules(root, heavy, packages)
    wrong = []
    for item in import_lines(root, packages):
        if not item.in_function or item.lazy_reason or item.path.name == "__init__.py":
            continue
        targets = [_target(imported, modules) for imported in item.names]
        if any(target in loading if target else imported.split(".")[0] in heavy
               for imported, target in zip(item.names, targets)):
            continue
        wrong.append(f"{item.path.relative_to(root)}:{item.line}: {item.statement}")
    return wrong


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle of the graph (networkx), shortest first."""
    import networkx as nx

    found = nx.simple_cycles(nx.DiGraph([(a, b) for a, targets in graph.items() for b in targets]))
    return sorted(found, key=len)


def room(module: str) -> str:
    """A module's room: its package and subpackage (`trainers.grpo.learner` -> `trainers.grpo`)."""
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
