"""The layout's rules, read from the import statements (those inside functions included):
dependencies point one way (analyses -> models, probe, tasks; models -> tasks; probe ->
tasks), and no two modules of models/ import each other, directly or round a circle."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tasks", "probe", "models", "analyses")
ALLOWED = {"tasks": {"tasks"}, "probe": {"probe", "tasks"}, "models": {"models", "tasks"},
           "analyses": {"analyses", "models", "probe", "tasks"}}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The toolkit's modules `path` imports (a name imported from a package counts as its
    module where one by that name exists)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] in PACKAGES}


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    return {name: {m for m in imports(path) if m in modules and m != name} for name, path in modules.items()}


def cycles(graph: dict[str, set[str]], within: str) -> list[list[str]]:
    """Import circles among the modules of the package `within`, each as a path back to its start
    (package __init__ files left out: importing a submodule runs them, by design)."""
    nodes = {n for n in graph if n.startswith(within + ".") and not (ROOT / n.replace(".", "/")).is_dir()}
    found, done = [], set()

    def visit(node, path):
        for nxt in sorted(graph[node] & nodes):
            if nxt in path:
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, path + [nxt])
        done.add(node)

    for node in sorted(nodes):
        if node not in done:
            visit(node, [node])
    return found


def test_dependencies_point_one_way():
    wrong = sorted(f"{a} imports {b}" for a, targets in import_graph().items() for b in targets
                   if b.split(".")[0] not in ALLOWED[a.split(".")[0]])
    assert wrong == []


def test_no_circle_of_imports_in_models():
    assert cycles(import_graph(), "models") == []


def test_a_circle_is_found():
    graph = {"models.a": {"models.b"}, "models.b": {"models.c"}, "models.c": {"models.a"}, "models.d": {"models.a"}}
    assert cycles(graph, "models") == [["models.a", "models.b", "models.c", "models.a"]]
