"""The package reads in one direction: no import cycle, and no module imports one from a higher floor.

Two checks over the code's own imports (imports inside functions count too: a lazy import is still
an arrow). Between modules: no cycle, outside :data:`ALLOWED_CYCLES`. Between units (a top-level
module or subpackage of ``mrtpo``): each sits on a floor of :data:`FLOORS`, and imports only its own
floor and those below. The floors are the graph as drawn: a unit's floor is the length of the
longest import chain below it, so the map says where each unit stands and docs/design.md#layers
shows the same table.
"""

import ast
import re
from pathlib import Path

import pytest

import mrtpo

SRC = Path(mrtpo.__file__).parent
DESIGN = SRC.parents[1] / "docs" / "design.md"

#: Top-level module or subpackage of ``mrtpo`` -> its floor (a module may import its own floor and
#: those below). A package's modules share its floor (``evaluate/load.py`` is ``evaluate``): importing
#: one runs the package's ``__init__``, so none of them can sit lower than it.
FLOORS = {
    "cli_help": 0,
    "credit": 0,
    "hub": 0,
    "machine": 0,
    "model_calls": 0,
    "model_presets": 0,
    "replay_passes": 0,
    "reward_calls": 0,
    "run_lock": 0,
    "run_outputs": 0,
    "testing": 0,
    "trl_compat": 0,
    "trl_names": 0,
    "validation": 0,
    "verifiers": 0,
    "warning_filters": 0,
    "counterfactual": 1,
    "known_positions": 1,
    "models": 1,
    "packing": 1,
    "rewards": 1,
    "shared_prompt": 1,
    "__init__": 2,
    "fast_decode": 2,
    "model_init": 2,
    "model_names": 2,
    "replay_plan": 2,
    "task_base": 2,
    "cli": 3,
    "gym": 3,
    "replay": 3,
    "sampling": 3,
    "tasks": 4,
    "trainer": 4,
    "evaluate": 5,
    "report": 5,
    "warm_start": 5,
    "config": 6,
    "demo": 6,
    "explain": 6,
    "cli_args": 7,
    "run_build": 7,
    "saved_config": 7,
    "task_pin": 7,
    "run_folder": 8,
    "train": 9,
    "bench": 10,
    "export": 10,
}

#: Module cycles that are intended, each with its reason (``frozenset`` of the modules -> why). None now.
ALLOWED_CYCLES: dict[frozenset[str], str] = {}


def module_name(path: Path, src: Path = SRC) -> str:
    """``mrtpo.bench.learn.run`` for ``<src>/bench/learn/run.py``; a package's ``__init__`` is the package."""
    parts = path.relative_to(src.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the package's modules it imports. ``from pkg import sub`` is an arrow to the submodule
    ``pkg.sub``, not to ``pkg``: importing a submodule runs its package's ``__init__`` anyway."""
    modules = {module_name(p, src): p for p in src.rglob("*.py")}
    root = src.name
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
                names = subs if len(subs) == len(node.names) else [node.module, *subs]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for target in names:
                while target and target not in modules:  # `import mrtpo.x.y` of a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != name and target.split(".")[0] == root:
                    targets.add(target)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def unit_of(module: str) -> str:
    """The top-level unit of a module (``mrtpo.bench.learn.run`` -> ``bench``; ``mrtpo`` -> ``__init__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward_arrows(graph: dict[str, set[str]], floors: dict[str, int]) -> list[str]:
    """Every import of a unit on a higher floor than the importer's, as ``module -> module (floors)``."""
    return [
        f"{m} (floor {floors[unit_of(m)]}) imports {t} (floor {floors[unit_of(t)]})"
        for m, targets in sorted(graph.items())
        for t in sorted(targets)
        if unit_of(m) in floors and unit_of(t) in floors and floors[unit_of(t)] > floors[unit_of(m)]
    ]


def drawn_floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each unit's floor as drawn: 0 for a unit that imports no other, else 1 + the highest floor it imports."""
    below: dict[str, set[str]] = {}
    for module, targets in graph.items():
        below.setdefault(unit_of(module), set()).update(unit_of(t) for t in targets if unit_of(t) != unit_of(module))
    floors: dict[str, int] = {}

    def floor(unit: str, seen: tuple[str, ...] = ()) -> int:
        if unit not in floors:
            if unit in seen:
                raise ValueError(f"units import each other in a circle: {' -> '.join((*seen, unit))}")
            floors[unit] = 1 + max((floor(u, (*seen, unit)) for u in below.get(unit, ())), default=-1)
        return floors[unit]

    for unit in below:
        floor(unit)
    return floors


def test_no_module_import_cycle():
    found = [sorted(c) for c in cycles(module_graph()) if c not in ALLOWED_CYCLES]
    assert found == [], "modules that import each other (break the circle, or allow it with a reason)"


def test_every_module_has_a_floor():
    units = {unit_of(m) for m in module_graph()}
    assert units - set(FLOORS) == set(), "place each new module on a floor in FLOORS"


def test_no_import_points_up_a_floor():
    assert upward_arrows(module_graph(), FLOORS) == []


def test_the_floor_map_is_the_graph_as_drawn():
    """FLOORS puts each unit where its imports put it, and docs/design.md#layers shows the same floors."""
    drawn = drawn_floors(module_graph())
    moved = {unit: (FLOORS.get(unit), floor) for unit, floor in drawn.items() if FLOORS.get(unit) != floor}
    assert moved == {}, "unit: (floor in FLOORS, floor its imports give it); update FLOORS and the design table"
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", DESIGN.read_text(), flags=re.M)
    table = {unit: int(floor) for floor, units in rows for unit in re.findall(r"`([a-z_]+)`", units)}
    assert table == FLOORS


def test_the_gym_knows_nothing_of_the_task_registry():
    """One direction: ``tasks`` registers the gym's families; no gym module imports ``tasks``."""
    graph = module_graph()
    gym_to_tasks = [
        m for m, targets in graph.items() if unit_of(m) == "gym" and any(unit_of(t) == "tasks" for t in targets)
    ]
    assert gym_to_tasks == []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "mrtpo"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checks_see_a_planted_cycle_and_up_arrow(tmp_path):
    """A package with one lazy two-module cycle and one arrow up: both are found, and nothing else."""
    src = _package(
        tmp_path,
        {
            "__init__.py": "",
            "low.py": "def f():\n    from mrtpo.high import g\n",  # lazy: still an arrow
            "high.py": "import mrtpo.low\n",
            "pkg/__init__.py": "from mrtpo.pkg.a import x\n",
            "pkg/a.py": "from mrtpo.pkg import b\nx = 1\n",  # a submodule through its package: no cycle
            "pkg/b.py": "",
        },
    )
    graph = module_graph(src)
    assert cycles(graph) == [frozenset({"mrtpo.low", "mrtpo.high"})]
    assert upward_arrows(graph, {"__init__": 0, "low": 0, "high": 1, "pkg": 0}) == [
        "mrtpo.low (floor 0) imports mrtpo.high (floor 1)"
    ]
    with pytest.raises(ValueError, match="circle"):
        drawn_floors(graph)


def test_drawn_floors_of_a_chain(tmp_path):
    src = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "",
            "b.py": "from mrtpo.a import x\n",
            "c.py": "import mrtpo.b\nimport mrtpo.a\n",
            "d.py": "from mrtpo import a\n",
        },
    )
    assert drawn_floors(module_graph(src)) == {"__init__": 0, "a": 0, "b": 1, "c": 2, "d": 1}


#: Longest source file allowed (issue 20: "no source file over ~500 lines"); a file that grows past it
#: has more than one job and should be split along its seams.
MAX_LINES = 520


def test_no_source_file_is_too_long():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
