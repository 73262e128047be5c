"""The design lives in the repo: source cites docs/design.md sections that exist, never the outside spec."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
SOURCES = sorted((ROOT / "src" / "mrtpo").rglob("*.py"))


def _anchors() -> set[str]:
    return set(re.findall(r'<a id="([a-z0-9-]+)"></a>', DESIGN.read_text()))


def test_no_source_file_cites_the_spec_outside_the_repo():
    cited = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in SOURCES
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "SPEC §" in line
    ]
    assert cited == []


def test_every_design_reference_in_the_source_names_a_section_that_exists():
    anchors = _anchors()
    assert {"algorithm", "methods", "settings", "tasks", "measurement"} <= anchors
    refs = {}
    for p in SOURCES:
        text = p.read_text()
        for match in re.finditer(r"docs/design\.md#([a-z0-9-]+)((?:, #[a-z0-9-]+)*)", text):
            names = [match.group(1), *re.findall(r"#([a-z0-9-]+)", match.group(2))]
            for name in names:
                refs.setdefault(name, []).append(str(p.relative_to(ROOT)))
    assert refs, "the source cites no design section"
    missing = {name: where for name, where in refs.items() if name not in anchors}
    assert missing == {}
