"""The modules of pyq2 import each other without a cycle (at module level or inside functions),
so each can be read, and imported, after the ones it uses."""

import ast
from pathlib import Path

import pyq2

PACKAGE = Path(pyq2.__file__).resolve().parent


def imports_of(path):
    """The pyq2 modules a source file imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.update(
                [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
            )
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pyq2."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("pyq2."))
    return found


def test_no_import_cycles():
    graph = {p.stem: imports_of(p) for p in PACKAGE.glob("*.py")}
    done, path = set(), []

    def visit(module):
        assert module not in path, (
            f"import cycle: {' -> '.join(path[path.index(module) :])} -> {module}"
        )
        if module in done or module not in graph:
            return
        path.append(module)
        for dep in sorted(graph[module]):
            visit(dep)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_the_package_does_not_import_the_tools():
    """pyq2 is what `pip install` ships: nothing in it imports from tools/ (or adds it to the
    import path)."""
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n == "tools" or n.startswith("tools.") for n in names), path.name
        assert "sys.path" not in path.read_text(), f"{path.name} changes the import path"
