"""The package's layers: every import goes down or stays inside its own wing, and no module
imports in a circle (at module level or inside functions), so each can be read, and imported,
after the ones it uses.

The wings, lowest first (a module may import its own wing and any lower layer):
  0  errors, interrupts, atomic, keyvalues, and the package's __init__
  1  spec (formats, layouts, references)    text (tokenizer, chat template, sampling)
  2  lib (the native library, its CPU and CUDA halves, torch operators)
  3  gguf (reading and writing files, pyq2's keys, a file's contents)
  4  plan (the decode plan, the tensor-parallel plan)
  5  offline (repack, fuse, shard, verify, info, the demo model)    runtime (load, step, bench)
  6  cli    7  __main__
"""

import ast
from pathlib import Path

import pyq2

PACKAGE = Path(pyq2.__file__).resolve().parent

LAYERS = {
    "errors": 0,
    "interrupts": 0,
    "atomic": 0,
    "keyvalues": 0,
    "__init__": 0,
    "_cdef": 0,
    "spec": 1,
    "text": 1,
    "lib": 2,
    "gguf": 3,
    "plan": 4,
    "offline": 5,
    "runtime": 5,
    "cli": 6,
    "__main__": 7,
}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" and len(rel.parts) > 1 else rel.parts
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """The pyq2 modules (dotted, without the "pyq2." prefix) a source file imports."""
    me = module_name(path)
    package = me.split(".")[:-1] if path.name != "__init__.py" else me.split(".")
    if path.name == "__init__.py" and path.parent == PACKAGE:
        package = []
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            prefix = ".".join(base + ([node.module] if node.module else []))
            if node.module:
                found.add(prefix)
            for a in node.names:  # `from . import x` names a module; `from .m import f` not
                if not node.module:
                    found.add(f"{prefix}.{a.name}".lstrip("."))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pyq2."):
            found.add(node.module.removeprefix("pyq2."))
        elif isinstance(node, ast.Import):
            found.update(
                a.name.removeprefix("pyq2.") for a in node.names if a.name.startswith("pyq2.")
            )
    return {f for f in found if f and f != "__version__"}


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


def wing(module: str) -> str:
    return module.split(".")[0]


def violations(g: dict[str, set[str]]) -> list[str]:
    """Each import that goes up a layer or sideways into another wing of the same layer."""
    bad = []
    for module, deps in sorted(g.items()):
        if module == "":
            continue
        for dep in sorted(deps):
            a, b = wing(module), wing(dep)
            if a == b:
                continue
            la, lb = LAYERS[a], LAYERS[b]
            if lb > la or (lb == la and la != 0):
                bad.append(f"{module} (layer {la}) imports {dep} (layer {lb})")
    return bad


def test_every_module_belongs_to_a_layer():
    unknown = sorted({wing(m) for m in graph() if m} - set(LAYERS))
    assert not unknown, f"modules outside every layer: {unknown} (add them to LAYERS and the doc)"


def test_imports_go_down_the_layers():
    assert violations(graph()) == []


def test_the_layer_check_catches_an_upward_and_a_sideways_import():
    g = {
        "spec.formats": {"gguf.io"},
        "offline.repack": {"runtime.load", "gguf.io", "spec.formats"},
        "gguf.io": {"spec.formats", "errors"},
    }
    assert violations(g) == [
        "offline.repack (layer 5) imports runtime.load (layer 5)",
        "spec.formats (layer 1) imports gguf.io (layer 3)",
    ]


def test_no_import_cycles():
    g = graph()
    modules = set(g)
    done, path = set(), []

    def resolve(dep: str) -> str | None:
        # "gguf" (a package) or "gguf.io" (a module); anything else is a name inside a module
        return dep if dep in modules else None

    def visit(module):
        assert module not in path, (
            f"import cycle: {' -> '.join(path[path.index(module) :])} -> {module}"
        )
        if module in done:
            return
        path.append(module)
        for dep in sorted(g[module]):
            target = resolve(dep)
            if target is not None:
                visit(target)
        path.pop()
        done.add(module)

    for module in sorted(g):
        visit(module)


def test_the_package_does_not_import_the_tools():
    """pyq2 is what `pip install` ships: nothing in it imports from tools/ (or adds it to the
    import path)."""
    for path in PACKAGE.rglob("*.py"):
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
