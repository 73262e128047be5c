"""The ``mrtpo`` command line: ``mrtpo demo``, ``mrtpo bench relevance``, ``mrtpo version``."""

from __future__ import annotations

import argparse
import sys


def _bench(argv: list[str]) -> int:
    benches = {"relevance": "mrtpo.bench.relevance"}
    if not argv or argv[0] not in benches:
        print(f"usage: mrtpo bench {{{','.join(benches)}}} [options]", file=sys.stderr)
        return 2
    import importlib

    return importlib.import_module(benches[argv[0]]).main(argv[1:])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="mrtpo", description="Multi-reward RL with reward-specific token-level credit assignment."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("version", help="print the version")
    sub.add_parser("demo", help="credit-assignment demo on the embedded default model", add_help=False)
    sub.add_parser("bench", help="benchmarks: relevance", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "version":
        import mrtpo

        print(mrtpo.__version__)
        return 0
    if args.command == "bench":
        return _bench(rest)
    if args.command == "demo":
        from mrtpo import demo

        return demo.main(rest)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
