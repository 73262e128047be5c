"""Benchmark of the relevance kernel: tokens/s and peak memory of ``js_distance``.

Every configuration runs in a fresh subprocess so that its peak resident memory is its own:
the two ``(B, T, V)`` bf16 logit tensors are created first, the kernel's high-water mark is reset
(``/proc/self/clear_refs``), and the reported peak is the memory the kernel added on top of its
inputs. The chunked kernel's extra memory is bounded by ``chunk × V``; the unchunked one
(``chunk = B × T``) grows with ``B × T × V``.

Run: ``mrtpo bench relevance`` (``--quick`` for a short run); results go to stdout and JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from mrtpo.bench import write_record
from mrtpo.cli_help import HelpFormatter

#: Vocabulary sizes of the two preset models: SmolLM2 (49,152) and Qwen2.5 (151,936).
VOCABS = (49_152, 151_936)


@dataclass
class Case:
    vocab: int
    batch: int
    length: int
    chunk: int | None  # positions per chunk; None = auto; batch * length means unchunked
    top_k: int | None = None

    @property
    def positions(self) -> int:
        return self.batch * self.length


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def run_case(case: Case, repeats: int) -> dict:
    """Measure one case in this process (called inside the subprocess)."""
    import torch

    from mrtpo.credit import auto_chunk_size, js_distance

    chunk_used = case.chunk if case.chunk is not None else auto_chunk_size(case.vocab)
    torch.manual_seed(0)
    shape = (case.batch, case.length, case.vocab)
    logits_p = torch.randn(shape, dtype=torch.bfloat16)
    logits_q = torch.randn(shape, dtype=torch.bfloat16)
    mask = torch.ones(case.batch, case.length)
    js_distance(logits_p[:1, :4], logits_q[:1, :4], mask[:1, :4], chunk_size=4)  # warm up kernels
    rss_before = _status_kib("VmRSS")
    exact_peak = _reset_peak()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        js_distance(logits_p, logits_q, mask, chunk_size=case.chunk, top_k=case.top_k)
        times.append(time.perf_counter() - start)
    peak = _status_kib("VmHWM")
    median = sorted(times)[len(times) // 2]
    return {
        **asdict(case),
        "chunk_used": chunk_used,
        "unchunked": chunk_used >= case.positions,
        "seconds_median": median,
        "tokens_per_s": case.positions / median,
        "input_mib": 2 * logits_p.numel() * logits_p.element_size() / 2**20,
        "extra_peak_mib": max(peak - rss_before, 0) / 1024,
        "peak_is_exact": exact_peak,
        "one_chunk_buffer_mib": min(chunk_used, case.positions) * case.vocab * 4 / 2**20,
    }


def _run_in_subprocess(case: Case, repeats: int) -> dict:
    code = (
        "import json, sys; from mrtpo.bench.relevance import Case, run_case; "
        f"print(json.dumps(run_case(Case(**{asdict(case)!r}), {repeats})))"
    )
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 1))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"benchmark case {case} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def default_cases(quick: bool) -> list[Case]:
    """Per vocabulary: a chunk-size sweep at fixed B×T, then B×T growth auto-chunked vs unchunked."""
    batch, length = (1, 256) if quick else (4, 256)
    chunks = (8, None, 256) if quick else (8, 32, None, 128, 512)
    growth = ((1, 128), (1, 256)) if quick else ((1, 256), (2, 256), (4, 256))
    cases: list[Case] = []
    for vocab in VOCABS:
        cases += [Case(vocab, batch, length, chunk) for chunk in chunks]
        cases += [Case(vocab, b, t, None) for b, t in growth if (b, t) != (batch, length)]
        cases += [Case(vocab, b, t, b * t) for b, t in growth]
        cases.append(Case(vocab, batch, length, None, top_k=64))
    return cases


def format_table(rows: list[dict]) -> str:
    header = f"{'vocab':>7} {'B×T':>6} {'chunk':>7} {'top_k':>5} {'tok/s':>9} {'extra MiB':>10} {'inputs MiB':>10}"
    lines = [header, "-" * len(header)]
    for r in rows:
        chunk = "all" if r["unchunked"] else f"{r['chunk_used']}{'*' if r['chunk'] is None else ''}"
        lines.append(
            f"{r['vocab']:>7} {r['batch'] * r['length']:>6} {chunk:>7} {str(r['top_k'] or '-'):>5} "
            f"{r['tokens_per_s']:>9.0f} {r['extra_peak_mib']:>10.1f} {r['input_mib']:>10.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mrtpo bench relevance", description=__doc__.splitlines()[0], formatter_class=HelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=Path("runs/bench/relevance.json"), metavar="FILE", help="JSON record"
    )
    parser.add_argument("--quick", action="store_true", help="smaller shapes, fewer cases")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions per case (median)")
    args = parser.parse_args(argv)

    rows = []
    cases = default_cases(args.quick)
    for i, case in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case}", file=sys.stderr, flush=True)
        rows.append(_run_in_subprocess(case, args.repeats))
    table = format_table(rows)
    print(table)
    print("(* = chunk_size=None, chosen by auto_chunk_size; extra MiB = peak memory added by the kernel)")
    write_record(
        args.out, "relevance kernel (js_distance)", "mrtpo bench relevance" + (" --quick" if args.quick else ""), rows
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
