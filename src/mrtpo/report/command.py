"""``mrtpo report RUN``: (re)build a run folder's report from what the run wrote;
``mrtpo report --compare RUN RUN…``: several runs on one figure.

    mrtpo report runs/sql-mrtpo-20260101-120000
    mrtpo report --compare runs/sql-gdpo runs/sql-mrtpo --output gdpo-vs-mrtpo.html

For a run that crashed before its end, one trained with ``report: false``, or an older report:
reads ``config.yaml``, ``metrics.jsonl`` and ``credit_samples.jsonl`` and writes ``report.html``,
``report.md`` and ``curves.png`` (:func:`mrtpo.report.build.make_report`), held-out (``eval_*``)
metrics included when the run evaluated. ``--compare`` writes an HTML page and a PNG
(:func:`mrtpo.report.compare.compare_runs`; ``--output``, default ``compare.html`` / ``compare.png``).

``mrtpo report RUN`` writes into the run, so it takes the run's lock (:mod:`mrtpo.run_lock`) for its writes:
a run that a training (or an export) holds is refused, naming its pid, with nothing written. ``--compare``
writes outside the runs and reads them without a lock.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mrtpo.cli_help import HelpFormatter

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mrtpo report",
        formatter_class=HelpFormatter,
        description="Rebuild report.html / report.md / curves.png of a run folder from its metrics.jsonl "
        "(after a crash, or a run with report: false); or, with --compare, draw several runs "
        "(e.g. GDPO and MRTPO) on one figure.",
    )
    p.add_argument("run", metavar="RUN", nargs="?", help="run folder of mrtpo train")
    p.add_argument(
        "--samples",
        type=int,
        metavar="N",
        help="completions of one prompt shown at the first and the last step "
        "(default: the run's report_samples, else 2)",
    )
    p.add_argument(
        "--compare",
        nargs="+",
        metavar="RUN",
        help="two or more run folders drawn on one figure: each reward, total and held-out reward, "
        "length, loss, grad norm, time; one colour per run, the legend naming its method",
    )
    p.add_argument(
        "--output",
        "-o",
        metavar="PATH",
        default="compare.html",
        help="with --compare: the HTML page to write; the PNG goes beside it (x.html and x.png)",
    )
    return p


def _compare(ns) -> int:
    missing = [r for r in ns.compare if not (Path(r) / "metrics.jsonl").is_file()]
    if missing:
        print(
            f"mrtpo report: error: {', '.join(missing)} holds no metrics.jsonl (not a run folder of mrtpo "
            "train, or no step was logged)",
            file=sys.stderr,
        )
        return 2
    from mrtpo.report.compare import compare_runs

    try:
        paths = compare_runs(ns.compare, ns.output)
    except ValueError as exc:  # fewer than two runs, or a torn metrics line
        print(f"mrtpo report: error: {exc}", file=sys.stderr)
        return 2
    print("compare: " + ", ".join(str(p) for p in paths.values()))
    return 0


def _report_samples(run: Path) -> int:
    import yaml

    try:
        saved = yaml.safe_load((run / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return 2
    value = saved.get("report_samples") if isinstance(saved, dict) else None
    return value if isinstance(value, int) and value >= 0 else 2


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    if ns.compare is not None:
        if ns.run is not None:
            print("mrtpo report: error: give either RUN or --compare RUN RUN..., not both", file=sys.stderr)
            return 2
        return _compare(ns)
    if ns.run is None:
        print(
            "mrtpo report: error: name a run folder (mrtpo report RUN) or runs to compare (--compare RUN RUN...)",
            file=sys.stderr,
        )
        return 2
    run = Path(ns.run)
    if not (run / "metrics.jsonl").is_file():
        print(
            f"mrtpo report: error: {run} holds no metrics.jsonl (not a run folder of mrtpo train, or no step "
            "was logged)",
            file=sys.stderr,
        )
        return 2
    if ns.samples is not None and ns.samples < 0:
        print("mrtpo report: error: --samples must be >= 0", file=sys.stderr)
        return 2
    from mrtpo.run_lock import RunLockError, lock_run_folder

    try:  # the report's files go into the run: not while a training (or an export) uses it
        lock = lock_run_folder(
            run,
            "mrtpo report",
            advice="wait for it to end (a training writes its own report at its end, unless report: false), "
            f"then run mrtpo report {run}",
        )
    except RunLockError as exc:
        print(f"mrtpo report: error: {exc}", file=sys.stderr)
        return 2
    try:
        return _write_report(run, ns.samples)
    finally:
        lock.release()


def _write_report(run: Path, samples: int | None) -> int:
    from mrtpo.report.build import make_report

    try:
        paths = make_report(run, samples=samples if samples is not None else _report_samples(run))
    except ValueError as exc:  # a torn or hand-edited metrics line
        print(f"mrtpo report: error: cannot read {run / 'metrics.jsonl'}: {exc}", file=sys.stderr)
        return 2
    from mrtpo.report.records import torn_last_line

    for name in ("metrics.jsonl", "credit_samples.jsonl"):
        if (run / name).is_file() and torn_last_line((run / name).read_text()):
            print(f"note: left out the torn last line of {name} (a write the run did not finish)")
    print("report: " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
