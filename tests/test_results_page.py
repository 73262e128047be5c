"""docs/results.md opens with the README's answer table, and its verdict sits on the first screen."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _answer_table(text: str) -> list[str]:
    start = text.index("| question | measured (95 % intervals) |")
    lines = text[start:].splitlines()
    return lines[: next((i for i, line in enumerate(lines) if not line.startswith("|")), len(lines))]


def test_the_results_page_opens_with_the_readme_answer_table():
    readme = _answer_table((ROOT / "README.md").read_text())
    results_text = (ROOT / "docs" / "results.md").read_text()
    page = [
        re.sub(r"\]\(#", "](docs/results.md#", line).replace("](results/", "](docs/results/")
        for line in _answer_table(results_text)
    ]
    assert len(readme) > 3 and page == readme
    assert results_text.index("| question |") < results_text.index("\n## ", results_text.index("## The answer") + 1)


def test_the_verdict_is_on_the_first_screen():
    lines = (ROOT / "docs" / "results.md").read_text().splitlines()
    verdict = next(i for i, line in enumerate(lines) if line.startswith("**Verdict.**"))
    assert verdict < 30
