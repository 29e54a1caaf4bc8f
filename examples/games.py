"""Solve a zero-sum game with MI-SPRM+ (parameter-free regret matching) and compare the duality gap with RM+.

    python examples/games.py                         # the SPRM+ 3x3 game, T = 10000
    python examples/games.py --iterations 100000
"""

from __future__ import annotations

import argparse

import numpy as np
from veil.algorithms.games import loglog_slope, solve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10_000)
    args = parser.parse_args()

    A = np.array([[3.0, 0.0, -3.0], [0.0, 3.0, -4.0], [0.0, 0.0, 1.0]])  # row player's payoffs; it maximizes
    T = args.iterations
    for algorithm in ("rm+", "prm+", "mi-sprm+"):
        sol = solve(A, algorithm, T)
        slope = loglog_slope(sol.iterations, sol.gaps, max(1, T // 100), T)
        print(f"{algorithm:>8}: gap({T}) = {sol.gap:.2e}, log-log slope {slope:+.2f}, "
              f"x = {np.round(sol.x, 4).tolist()}, y = {np.round(sol.y, 4).tolist()}")
    print(f"MI-SPRM+ raised its regret floor to R = {sol.floor:g}")


if __name__ == "__main__":
    main()
