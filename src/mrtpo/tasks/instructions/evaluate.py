"""Held-out scoring exactly as IFEval/IFBench define it.

For each prompt and each of its instructions: strict = the checker accepts the response as is;
loose = it accepts any of the 8 loose variants (``checkers.loose_variants``). Reported:

* ``prompt_level_strict`` / ``prompt_level_loose``: share of prompts whose instructions all pass;
* ``instruction_level_strict`` / ``instruction_level_loose``: share of all instructions that pass;

plus counts, a per-instruction-id breakdown and per-prompt results. Prompts carrying an
instruction we cannot verify offline (``checkers.UNVERIFIABLE``) are left out of every score and
listed under ``excluded`` with the reason (IFBench: the 6 ``words:start_verb`` prompts). All
values are JSON-serialisable.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from mrtpo.tasks.instructions import checkers
from mrtpo.verifiers import Example

__all__ = ["score_response", "evaluate"]


def score_response(example: Example, response: str) -> dict[str, Any]:
    """Per-instruction strict/loose results for one prompt (``excluded`` set when unverifiable)."""
    constraints = example.gold["constraints"]
    ids = [f"{c['benchmark']}/{c['id']}" for c in constraints]
    blocked = [(c["benchmark"], c["id"]) for c in constraints if (c["benchmark"], c["id"]) in checkers.UNVERIFIABLE]
    if blocked:
        b, i = blocked[0]
        return {
            "id": example.id,
            "instructions": ids,
            "excluded": f"{b}/{i}",
            "reason": checkers.UNVERIFIABLE[(b, i)],
        }
    prompt = example.gold.get("prompt") or example.messages[-1]["content"]
    strict, loose = [], []
    for c in constraints:
        s, lo = checkers.check(c["benchmark"], c["id"], c["kwargs"], response, prompt)
        strict.append(s)
        loose.append(lo)
    return {"id": example.id, "instructions": ids, "strict": strict, "loose": loose}


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def evaluate(outputs: list[str], examples: list[Example]) -> dict[str, Any]:
    """Benchmark scores of ``outputs[i]`` for ``examples[i]``."""
    if len(outputs) != len(examples):
        raise ValueError(
            f"evaluate needs one output per example: got {len(outputs)} outputs for {len(examples)} examples"
        )
    per_prompt = []
    excluded: dict[str, dict[str, Any]] = {}
    by_id: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # n, strict, loose
    n_prompts = p_strict = p_loose = n_instr = i_strict = i_loose = 0
    for example, output in zip(examples, outputs):
        text = output if isinstance(output, str) else ""
        r = score_response(example, text)
        per_prompt.append(r)
        if "excluded" in r:
            key = r["excluded"]
            entry = excluded.setdefault(key, {"reason": r["reason"], "n_prompts": 0})
            entry["n_prompts"] += 1
            continue
        n_prompts += 1
        p_strict += all(r["strict"])
        p_loose += all(r["loose"])
        for iid, s, lo in zip(r["instructions"], r["strict"], r["loose"]):
            n_instr += 1
            i_strict += s
            i_loose += lo
            stats = by_id[iid]
            stats[0] += 1
            stats[1] += s
            stats[2] += lo
    return {
        "prompt_level_strict": _ratio(p_strict, n_prompts),
        "prompt_level_loose": _ratio(p_loose, n_prompts),
        "instruction_level_strict": _ratio(i_strict, n_instr),
        "instruction_level_loose": _ratio(i_loose, n_instr),
        "n_prompts": n_prompts,
        "n_instructions": n_instr,
        "n_excluded_prompts": sum(e["n_prompts"] for e in excluded.values()),
        "excluded": excluded,
        "per_instruction": {
            iid: {"n": n, "strict": s / n, "loose": lo / n} for iid, (n, s, lo) in sorted(by_id.items())
        },
        "per_prompt": per_prompt,
    }
