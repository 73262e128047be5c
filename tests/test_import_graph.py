"""The package reads in one direction: no module imports one from a higher floor.

Floors, bottom up: the credit math, verifiers and machine facts; tasks, replay, rewards, models
and the report; the trainer; the commands that build and run it (config, train, evaluate); the
commands built on those; the benchmarks and the CLI. Imports inside functions count too: a lazy
import is still an arrow.
"""

import ast
from pathlib import Path

import mrtpo

SRC = Path(mrtpo.__file__).parent

#: Top-level module or subpackage of ``mrtpo`` -> its floor (a module may import its own floor and
#: those below). A package's modules share its floor (``evaluate/load.py`` is ``evaluate``): importing
#: one runs the package's ``__init__``, so none of them can sit lower than it.
FLOORS = {
    "credit": 0, "verifiers": 0, "machine": 0, "warning_filters": 0, "testing": 0, "cli_help": 0, "hub": 0,
    "__init__": 1, "tasks": 1, "counterfactual": 1, "replay_plan": 1, "replay": 1, "shared_prompt": 1, "fast_decode": 1,
    "packing": 1, "sampling": 1, "rewards": 1, "models": 1, "report": 1, "gym": 1,
    "model_init": 1, "model_names": 1, "known_positions": 1,
    "trainer": 2, "update_rows": 2, "warm_start": 2,
    "config": 3, "run_folder": 3, "train": 3, "evaluate": 3,
    "run_outputs": 3, "saved_config": 3,
    "explain": 4, "demo": 4, "export": 4,
    "bench": 5, "cli": 5,
}


def _unit(path: Path) -> str:
    """The top-level unit a source file belongs to (``bench/learn/run.py`` -> ``bench``)."""
    return path.relative_to(SRC).with_suffix("").parts[0]


def _imported_units(path: Path) -> set[str]:
    units = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "mrtpo":
                units.add(parts[1] if len(parts) > 1 else "__init__")
    return units


def _arrows() -> list[tuple[str, str, str]]:
    """``(file, its unit, imported unit)`` for every import of another mrtpo unit."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        unit = _unit(path)
        out += [(str(path.relative_to(SRC)), unit, other) for other in _imported_units(path) if other != unit]
    return out


def test_every_module_has_a_floor():
    units = {_unit(p) for p in SRC.rglob("*.py")}
    assert units - set(FLOORS) == set(), "place each new module on a floor in FLOORS"


def test_no_import_points_up_a_floor():
    upward = [f"{path}: {unit} (floor {FLOORS[unit]}) imports {other} (floor {FLOORS[other]})"
              for path, unit, other in _arrows() if unit in FLOORS and other in FLOORS and FLOORS[other] > FLOORS[unit]]
    assert upward == []


def test_the_gym_knows_nothing_of_the_task_registry():
    """One direction: ``tasks`` registers the gym's families; no gym module imports ``tasks``."""
    assert [path for path, unit, other in _arrows() if unit == "gym" and other == "tasks"] == []


def test_the_check_sees_lazy_and_dotted_imports(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text("import mrtpo.bench.learn\n\ndef f():\n    from mrtpo.train import build_trainer\n"
                      "    import os\n    from mrtpo import evidence\n")
    assert _imported_units(source) == {"bench", "train", "__init__"}



#: Longest source file allowed (issue 20: "no source file over ~500 lines"); a file that grows past it
#: has more than one job and should be split along its seams.
MAX_LINES = 520


def test_no_source_file_is_too_long():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
