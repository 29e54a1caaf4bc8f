"""`veil games solve`: a Nash equilibrium of a two-player zero-sum game by regret matching (RM+ ... MI-SPRM+).

PAYOFF is the row player's payoff matrix (the row player maximizes) in a .npy, .csv or .json file. The averaged
strategies, the duality gap curve and (MI-SPRM+) the final regret-domain floor go to stdout as JSON;
``--plot`` draws the gap curve (log-log) to a PNG.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXAMPLE = """example:
  python -c "import numpy as np; np.save('rps.npy', np.array([[0, 1, -1], [-1, 0, 1], [1, -1, 0]]))"
  veil games solve rps.npy --algorithm mi-sprm+ --iterations 10000 --plot gap.png
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="veil games solve", description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("payoff", type=Path, help="the row player's payoff matrix: .npy, .csv or .json")
    parser.add_argument("--algorithm", default="mi-sprm+", choices=["rm+", "prm+", "sprm+", "mi-sprm+"],
                        help="the regret minimizer both players run (default: mi-sprm+, parameter-free)")
    parser.add_argument("--iterations", type=int, default=10000, help="T, the number of updates (default: 10000)")
    parser.add_argument("--eta", type=float, default=0.1, help="SPRM+'s step size (default: 0.1)")
    parser.add_argument("--alternating", action="store_true", help="alternating instead of simultaneous updates")
    parser.add_argument("--plot", type=Path, default=None, help="write the gap curve to this PNG")
    return parser


def main(argv: list[str] | None = None) -> int:
    import json

    from ..errors import InputError
    from .payoff import load_payoff
    from .solvers import solve

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        payoff = load_payoff(args.payoff)
        solution = solve(payoff, args.algorithm, args.iterations, eta=args.eta, alternating=args.alternating)
    except (InputError, FileNotFoundError) as exc:
        parser.exit(2, f"veil games solve: error: {exc}\n")
    report = solution.to_dict() | {"shape": list(payoff.shape), "updates": "alternating" if args.alternating else
                                   "simultaneous", "value": float(solution.x @ payoff @ solution.y)}
    if args.plot is not None:
        plot_gap(args.plot, {args.algorithm: (solution.iterations, solution.gaps)})
        report["plot"] = str(args.plot)
    print(json.dumps(report, indent=1))
    return 0


def plot_gap(path: Path, curves: dict[str, tuple[list[int], list[float]]]) -> None:
    """A log-log PNG of duality gap against iterations, one line per curve (needs matplotlib)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from veil.atomic import write_atomic

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, (t, gap) in curves.items():  # a gap of exactly 0 has no place on a log axis
        keep = [(ti, g) for ti, g in zip(t, gap, strict=True) if g > 0]
        ax.loglog([ti for ti, _ in keep], [g for _, g in keep], label=name)
    ax.set_xlabel("iterations T")
    ax.set_ylabel("duality gap of the averaged strategies")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    write_atomic(path, buffer.getvalue())


if __name__ == "__main__":
    sys.exit(main())
