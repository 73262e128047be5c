"""Where the docs list a registry, they list all of it: every registered credit method is named."""

import re
from pathlib import Path

import pytest

from mrtpo.credit import available_methods

ROOT = Path(__file__).resolve().parents[1]


def _backticked(text: str) -> set[str]:
    return set(re.findall(r"`([a-z][a-z0-9-]*)`", text))


@pytest.mark.parametrize(
    "page, marker",
    [
        ("README.md", "registry of methods"),
        ("docs/training.md", "`--method` is any registered credit method"),
    ],
)
def test_the_method_lists_in_the_docs_name_every_registered_method(page, marker):
    text = (ROOT / page).read_text()
    start = text.index(marker)
    paragraph = text[start : text.find("\n\n", start)]
    assert set(available_methods()) <= _backticked(paragraph), f"{page}: name every registered method"


def test_the_readme_command_row_names_every_registered_method():
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `mrtpo train"))
    listed = set(re.search(r"--method <([^>]*)>", row).group(1).replace("\\", "").split("|"))
    assert listed == set(available_methods())
