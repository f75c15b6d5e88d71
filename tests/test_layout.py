"""The layout's rules (docs/architecture.md), read from the import statements (those inside
functions included; those under `if TYPE_CHECKING:` left out of the directions, they never run,
and counted for the circles: two modules that name each other's types are still tied):

- dependencies point one way between the packages: analyses -> models, probe, tasks;
  models -> tasks; probe -> tasks; tasks -> nothing of the toolkit;
- inside models/, layers: the checkpoint format every family shares (models/*.py: section,
  checkpoint, bridge, tokenizer, answer_calls, cli, out_folder) <- the shared machinery
  (models/training/, models/cores/) <- the families (every other folder of models/: recall/,
  aot/, ...) <- the public entry points (models/__init__.py, models/train.py); a family never
  imports another family;
- inside analyses/, the sweep engine and what every study shares (analyses/sweeps/) imports no study;
- no two modules import each other, directly or round a circle;
- no module is over 350 lines."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tasks", "probe", "models", "analyses")
ALLOWED = {"tasks": {"tasks"}, "probe": {"probe", "tasks"}, "models": {"models", "tasks"},
           "analyses": {"analyses", "models", "probe", "tasks"}}
SHARED_MACHINERY = ("models.training", "models.cores")
ENTRY_POINTS = ("models", "models.train")  # the public names and `python -m models.train`
MAX_LINES = 350


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING" or
                                         isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(path: Path, type_checking: bool = False) -> set[str]:
    """The toolkit's modules `path` imports when it runs (a name imported from a package counts
    as its module where one by that name exists); `type_checking`: those under `if
    TYPE_CHECKING:` too."""
    found = set()

    def visit(node):
        if _type_checking(node) and not type_checking:
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {name for name in found if name.split(".")[0] in PACKAGES}


def sources() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    modules = sources()
    return {name: {m for m in imports(path, type_checking) if m in modules and m != name}
            for name, path in modules.items()}


def is_package(name: str) -> bool:
    return (ROOT / name.replace(".", "/")).is_dir()


def cycles(graph: dict[str, set[str]], within: str = "") -> list[list[str]]:
    """Import circles among the modules of the package `within` (default: every package), each as
    a path back to its start (package __init__ files left out: importing a submodule runs them, by
    design)."""
    nodes = {n for n in graph if n.startswith(within + "." if within else "") and not is_package(n)}
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


def family(name: str) -> str | None:
    """The model family a module of models/ belongs to (models.recall, models.aot, ...), or None."""
    parts = name.split(".")
    if len(parts) < 2 or parts[0] != "models" or not is_package(".".join(parts[:2])):
        return None
    top = ".".join(parts[:2])
    return None if top in SHARED_MACHINERY else top


def layer(name: str) -> int:
    """0 the checkpoint format (models/*.py), 1 the shared machinery, 2 a family, 3 an entry point."""
    if name in ENTRY_POINTS:
        return 3
    if family(name):
        return 2
    return 1 if name.startswith(tuple(m + "." for m in SHARED_MACHINERY)) else 0


def models_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports inside models/ that point up the layers, or from one family into another."""
    wrong = []
    for a, targets in graph.items():
        for b in targets:
            if not (a.startswith("models") and b.startswith("models.")) or b == "models":
                continue
            if layer(b) > layer(a):
                wrong.append(f"{a} imports {b}")
            elif family(a) and family(b) and family(a) != family(b):
                wrong.append(f"{a} imports {b} (another family)")
    return sorted(wrong)


def test_dependencies_point_one_way():
    wrong = sorted(f"{a} imports {b}" for a, targets in import_graph().items() for b in targets
                   if b.split(".")[0] not in ALLOWED[a.split(".")[0]])
    assert wrong == []


def test_inside_models_the_layers_point_down_and_no_family_imports_another():
    assert models_violations(import_graph()) == []


def test_the_families_and_the_shared_machinery_are_where_the_rules_expect_them():
    families = {family(m) for m in sources()} - {None}
    assert {"models.recall", "models.aot"} <= families
    assert all(is_package(m) for m in SHARED_MACHINERY)
    assert layer("models.section") == 0 and layer("models.training.optimizer") == 1
    assert layer("models.recall.trainer") == 2 and layer("models.train") == 3


def test_the_sweep_engine_imports_no_study():
    wrong = sorted(f"{a} imports {b}" for a, targets in import_graph().items() if a.startswith("analyses.sweeps")
                   for b in targets if b.startswith("analyses.") and not b.startswith("analyses.sweeps"))
    assert wrong == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_circle_of_imports(package):
    """Imports inside functions and under TYPE_CHECKING count: each still ties the two modules."""
    assert cycles(import_graph(type_checking=True), package) == []


def test_no_circle_of_imports_across_the_packages():
    assert cycles(import_graph(type_checking=True)) == []


def test_no_module_is_over_350_lines():
    long = sorted(f"{name} ({n} lines)" for name, path in sources().items()
                  if (n := len(path.read_text().splitlines())) > MAX_LINES)
    assert long == []


def test_a_circle_is_found():
    graph = {"models.a": {"models.b"}, "models.b": {"models.c"}, "models.c": {"models.a"}, "models.d": {"models.a"}}
    assert cycles(graph, "models") == [["models.a", "models.b", "models.c", "models.a"]]


def test_a_family_importing_another_and_the_machinery_importing_a_family_are_found():
    graph = {"models.aot.trainer": {"models.recall.trainer", "models.training.optimizer"},
             "models.training.result": {"models.recall.weights", "models.checkpoint"},
             "models.checkpoint": {"models.cores.forward"},
             "models.recall.trainer": {"models.training.optimizer", "models.cores.forward", "models.section"},
             "models.train": {"models.recall.train"}}
    assert models_violations(graph) == ["models.aot.trainer imports models.recall.trainer (another family)",
                                        "models.checkpoint imports models.cores.forward",
                                        "models.training.result imports models.recall.weights"]


def test_imports_under_type_checking_are_left_out(tmp_path, monkeypatch):
    source = tmp_path / "tasks" / "x.py"
    source.parent.mkdir()
    source.write_text("from typing import TYPE_CHECKING\nfrom tasks import counter\n"
                      "if TYPE_CHECKING:\n    from tasks.factual_recall import FactualRecallTask\n"
                      "def f():\n    from probe import stats\n")
    assert imports(source) == {"tasks", "tasks.counter", "probe", "probe.stats"}
    assert imports(source, type_checking=True) == {"tasks", "tasks.counter", "probe", "probe.stats",
                                                   "tasks.factual_recall", "tasks.factual_recall.FactualRecallTask"}


def test_a_circle_through_a_type_checking_import_or_one_inside_a_function_is_found(tmp_path, monkeypatch):
    """Two modules that import each other, one of them only for the other's types or only inside a
    function: the circle test finds both (the directions test leaves the first out)."""
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "__init__.py").write_text("")
    (tmp_path / "tasks" / "a.py").write_text("from tasks.b import B\n")
    for b in ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tasks.a import A\nB = 1\n",
              "def f():\n    from tasks import a\nB = 1\n"):
        (tmp_path / "tasks" / "b.py").write_text(b)
        assert cycles(import_graph(type_checking=True)) == [["tasks.a", "tasks.b", "tasks.a"]]
    (tmp_path / "tasks" / "b.py").write_text("B = 1\n")
    assert cycles(import_graph(type_checking=True)) == []


def test_every_module_that_names_the_checkout_finds_it():
    """A module's ROOT, computed from its own path, is the checkout, wherever the module lives."""
    import importlib

    named = [name for name, path in sources().items() if "\nROOT = Path(__file__)" in path.read_text()]
    assert named, "no module names the checkout"
    wrong = sorted(name for name in named if importlib.import_module(name).ROOT != ROOT)
    assert wrong == []
