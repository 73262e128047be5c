"""scripts/mutation_check.py stays runnable: each bug it plants names text that occurs exactly once in src/."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_planted_bug_still_finds_its_line():
    spec = importlib.util.spec_from_file_location("mutation_check", ROOT / "scripts" / "mutation_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    counts = {
        name: (ROOT / "src" / path).read_text().count(old) for name, (path, old, _, _) in module.MUTATIONS.items()
    }
    assert counts and all(n == 1 for n in counts.values()), {k: n for k, n in counts.items() if n != 1}
