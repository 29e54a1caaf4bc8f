"""`veil games cfr`: CFR or CFR+ on an OpenSpiel extensive-form game; the exploitability curve as JSON.

Needs the optional extra ``pip install 'veil[games]'`` (open-spiel).
"""

from __future__ import annotations

import argparse
import sys

EXAMPLE = """example:
  veil games cfr kuhn_poker --algorithm cfr+ --iterations 1000
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="veil games cfr", description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("game", help="an OpenSpiel game name, e.g. kuhn_poker or leduc_poker")
    parser.add_argument("--algorithm", default="cfr+", choices=["cfr", "cfr+"], help="default: cfr+")
    parser.add_argument("--iterations", type=int, default=1000, help="number of CFR iterations (default: 1000)")
    return parser


def main(argv: list[str] | None = None) -> int:
    import json

    from ..errors import InputError
    from .cfr import solve_extensive

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.iterations < 1:
        parser.exit(2, f"veil games cfr: error: --iterations: expected an integer >= 1, received {args.iterations}\n")
    try:
        run = solve_extensive(args.game, args.algorithm, args.iterations)
    except InputError as exc:
        parser.exit(2, f"veil games cfr: error: {exc}\n")
    print(json.dumps(run.to_dict(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
