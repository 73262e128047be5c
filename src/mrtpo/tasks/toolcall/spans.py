"""The part of a response the tool-call ``correctness`` checker reads, for the credit lift (docs/design.md#measurement).

``correctness`` compares each argument value of the predicted calls with BFCL's acceptable values.
Two span kinds, as half-open character ranges of the response:

* ``argument value`` — every value written after a ``"key":`` whose key some gold call has;
* ``wrong argument value`` — those of them that match none of the key's acceptable values in the
  gold calls (a wrong value is what the reward penalises).

Values are found in JSON form (``"key": value``, the forms the model writes: ``<tool_call>`` blocks,
fenced or bare JSON); Python-style calls (``f(key=value)``) give no span.
"""

from __future__ import annotations

import json
import re

from mrtpo.tasks.toolcall.verifiers import effective_ground_truth, gold_calls, value_matches
from mrtpo.verifiers import Example

_DECODER = json.JSONDecoder()


def argument_values(text: str, keys: set[str]) -> list[tuple[str, object, tuple[int, int]]]:
    """``[(key, value, (start, end))]`` for every JSON ``"key": value`` of ``text`` with a key in ``keys``."""
    found = []
    for m in re.finditer(r'"((?:[^"\\]|\\.)*)"\s*:\s*', text):
        key = m.group(1)
        if key not in keys:
            continue
        try:
            value, end = _DECODER.raw_decode(text, m.end())
        except ValueError:
            continue
        found.append((key, value, (m.end(), end)))
    return found


def checked_spans(
    example: Example, text: str, verifier_names: list[str]
) -> list[tuple[str, str, list[tuple[int, int]]]]:
    """``[("correctness", span kind, character spans)]`` for the spans present in ``text``."""
    if "correctness" not in verifier_names:
        return []
    gold = gold_calls(effective_ground_truth(example.gold.get("ground_truth", []), example.meta.get("functions")))
    accepted: dict[str, list] = {}
    for _, params in gold:
        for key, acc in params.items():
            accepted.setdefault(key, []).append(acc)
    values = argument_values(text, set(accepted))
    found = []
    if values:
        found.append(("correctness", "argument value", [span for *_, span in values]))
    wrong = [span for key, value, span in values if not any(value_matches(value, acc) for acc in accepted[key])]
    if wrong:
        found.append(("correctness", "wrong argument value", wrong))
    return found


__all__ = ["argument_values", "checked_spans"]
