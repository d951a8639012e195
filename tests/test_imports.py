"""The package's import graph, read from the source with `ast`: no cycles, and a short top level.

Every `import` counts, at module level or inside a function: a function-local import
only postpones a cycle to the first call, it does not remove it. Imports under
`if TYPE_CHECKING:` never run and do not count. Importing `fastdecode.a.b` also runs
the `__init__` of the package `fastdecode.a`, so it counts as an import of that package
too, unless the importing module sits in that package (which is then being imported
already). Taking a name other than a submodule from a package (`from .. import
__version__`) reads that package's `__init__` and counts as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

import fastdecode

PACKAGE = Path(fastdecode.__file__).parent
MAX_TOP_LEVEL_MODULES = 6

# The packages from the top down, as the README's architecture section draws them: a
# module imports its own package and the layers below its own, nothing above or beside.
LAYERS = [
    ("fastdecode", "__main__"),  # the public API (__init__) and `python -m fastdecode`
    ("cli", "server", "bench"),  # the commands
    ("evaluation",),
    ("api",),
    ("config",),  # LoadOptions: what api/ builds from, and the commands' load keys
    ("engine",),
    ("compile",),
    ("parallel", "checkpoints"),
    ("sampling",),
    ("structured",),  # SamplingParams carries a Constraint; the grammar's vocabulary is a tokenizer's
    ("text",),
    ("quant",),
    ("model",),
    ("kernels",),
    ("errors", "paths", "version"),
]
# (importing module or package, imported module or package): the only imports up or
# sideways, each named in the README's architecture section.
ALLOWED = {
    # GemvEmbedding is the model's Embedding with its head on the native GEMV.
    ("fastdecode.kernels.linear", "fastdecode.model.transformer"),
    # The other commands run through the CLI's command helper, read their keys its way
    # and show its progress bars.
    ("fastdecode.server", "fastdecode.cli.command"),
    ("fastdecode.server", "fastdecode.cli.keys"),
    ("fastdecode.bench", "fastdecode.cli.command"),
    ("fastdecode.bench", "fastdecode.cli.keys"),
    ("fastdecode.bench", "fastdecode.cli.progress"),
}


def module_names() -> dict[str, Path]:
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("fastdecode", *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for child in node.body for n in ast.walk(child)}
    return skipped


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The fastdecode modules whose code importing `name` runs or reads."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_nodes(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    explicit = set()  # the modules named, and packages a name is taken from
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            explicit |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                source = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            submodules = {f"{source}.{a.name}" for a in node.names} & modules.keys()
            explicit |= submodules
            if len(submodules) < len(node.names):
                explicit.add(source)
    found = set()
    for target in explicit:
        if not (target == "fastdecode" or target.startswith("fastdecode.")):
            continue
        found.add(target)
        # Importing a.b.c runs the __init__ of a.b too, unless a.b is a package this
        # module is in (then it is being imported already).
        parts = target.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if not (name == parent or name.startswith(parent + ".")):
                found.add(parent)
    found.discard(name)
    return found & modules.keys()


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a path [a, b, ..., a], or [] when the graph is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def test_the_import_graph_has_no_cycle():
    cycle = find_cycle(import_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_the_graph_sees_relative_function_local_and_parent_imports():
    graph = import_graph()
    # relative, at module level
    assert "fastdecode.model.args" in graph["fastdecode.model.transformer"]
    # inside a function, with the __init__ of the package it is in
    assert {"fastdecode.kernels.select", "fastdecode.kernels"} <= graph["fastdecode.quant.transform"]
    # `from . import name` where name is a module, not the package this module is in
    assert "fastdecode.quant.reference" in graph["fastdecode.quant.linear"]
    assert "fastdecode.quant" not in graph["fastdecode.quant.linear"]


def layer_of(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else parts[0]
    return next(i for i, layer in enumerate(LAYERS) if top in layer)


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _allowed(importer: str, imported: str) -> bool:
    # Importing a module runs its packages' __init__ too, so an allowed module's
    # packages are allowed with it.
    return any(_within(importer, a) and (_within(imported, b) or _within(b, imported)) for a, b in ALLOWED)


def test_imports_go_down_the_layers():
    wrong = sorted(f"{a} -> {b}" for a, targets in import_graph().items() for b in targets
                   if a.split(".")[:2] != b.split(".")[:2] and layer_of(b) <= layer_of(a) and not _allowed(a, b))
    assert not wrong, "imports up or sideways, not in ALLOWED:\n" + "\n".join(wrong)


def test_every_allowed_exception_is_still_needed():
    graph = import_graph()
    unused = [pair for pair in ALLOWED if not any(_within(a, pair[0]) and _within(b, pair[1])
                                                  for a, targets in graph.items() for b in targets)]
    assert not unused, f"remove these from ALLOWED (and the README): {unused}"


def test_the_layer_check_refuses_an_upward_import():
    assert layer_of("fastdecode.engine.engine") > layer_of("fastdecode.api.llm")
    assert not _allowed("fastdecode.engine.engine", "fastdecode.api.llm")
    assert _allowed("fastdecode.server.app", "fastdecode.cli")  # the package of an allowed module


def test_the_top_level_holds_at_most_six_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top
