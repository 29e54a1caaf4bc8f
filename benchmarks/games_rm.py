"""Regret-matching equilibrium solvers (issue 23): RM+, PRM+, SPRM+ and MI-SPRM+ on the SPRM+ 3x3 game and on
random 10x10 games, the duality gap of the averaged strategies, and iterations/s against a straightforward numpy
loop and nashpy's learning dynamics.

Targets (other_seeds.md §7): on A = [[3,0,-3],[0,3,-4],[0,0,1]], MI-SPRM+ gap(1e5) <= 3e-5, its log-log slope over
[1e3, 1e5] in [-1.15, -0.85], RM+'s in [-0.7, -0.4]; on random 10x10 N(0,1) games (5 seeds) MI-SPRM+ gap(1e4) <
0.9 x PRM+'s < RM+'s on every seed. Simultaneous updates unless a row says alternating.

    python benchmarks/games_rm.py                      # ~4 min on 2 shared cores
    python benchmarks/games_rm.py --quick --out /tmp/docs
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
from common import argument_parser, command_line, environment, save_figure, save_results
from veil.algorithms.games import duality_gap, loglog_slope, solve
from veil.algorithms.games.solvers import checkpoints

SECTION = "games_rm"
A3 = np.array([[3.0, 0.0, -3.0], [0.0, 3.0, -4.0], [0.0, 0.0, 1.0]])
RUNS_3X3 = [("RM+", "rm+", 1.0, False), ("PRM+", "prm+", 1.0, False), ("SPRM+ η=0.01", "sprm+", 0.01, False),
            ("SPRM+ η=0.1", "sprm+", 0.1, False), ("SPRM+ η=1", "sprm+", 1.0, False),
            ("MI-SPRM+", "mi-sprm+", 1.0, False), ("RM+ alternating", "rm+", 1.0, True),
            ("MI-SPRM+ alternating", "mi-sprm+", 1.0, True)]
SPEC_3X3 = {"RM+": (3.0e-2, 7.7e-3, 2.1e-3), "PRM+": (8.7e-3, 9.5e-4, 2.1e-4), "SPRM+ η=0.01": (3.7e-2, 3.8e-3, 3.8e-4),
            "SPRM+ η=0.1": (3.4e-3, 3.4e-4, 3.4e-5), "SPRM+ η=1": (8.7e-3, 9.5e-4, 2.1e-4),
            "MI-SPRM+": (1.9e-3, 2.0e-4, 2.0e-5)}


def naive_rm_plus(A: np.ndarray, iterations: int) -> tuple[np.ndarray, np.ndarray]:
    """RM+ as a straightforward numpy loop (the speed reference): fresh arrays and np.sum everywhere."""
    m, n = A.shape
    qx, qy = np.zeros(m), np.zeros(n)
    sx, sy = np.zeros(m), np.zeros(n)
    for _ in range(iterations):
        x = qx / np.sum(qx) if np.sum(qx) > 0 else np.ones(m) / m
        y = qy / np.sum(qy) if np.sum(qy) > 0 else np.ones(n) / n
        ux, uy = A @ y, -(A.T @ x)
        qx = np.maximum(qx + ux - np.sum(ux * x), 0)
        qy = np.maximum(qy + uy - np.sum(uy * y), 0)
        sx, sy = sx + x, sy + y
    return sx / iterations, sy / iterations


def per_second(fn, iterations: int) -> float:
    """Iterations per second of ``fn(iterations)`` (best of 3)."""
    best = np.inf
    for _ in range(3):
        start = time.perf_counter()
        fn(iterations)
        best = min(best, time.perf_counter() - start)
    return iterations / best


def speed(games: dict[str, np.ndarray], iterations: int) -> list[dict[str, Any]]:
    """Iterations/s of veil's RM+ and MI-SPRM+, the naive loop and (if installed) nashpy, on the same games."""
    try:
        import nashpy
    except ImportError:
        nashpy = None
    rows = []
    for name, A in games.items():
        row: dict[str, Any] = {"game": name, "iterations": iterations}
        row["veil rm+"] = per_second(lambda t, A=A: solve(A, "rm+", t, record=[t]), iterations)
        row["veil mi-sprm+"] = per_second(lambda t, A=A: solve(A, "mi-sprm+", t, record=[t]), iterations)
        row["naive numpy rm+"] = per_second(lambda t, A=A: naive_rm_plus(A, t), iterations)
        if nashpy is not None:
            game = nashpy.Game(A, -A)
            row["nashpy regret_minimization"] = per_second(
                lambda t, g=game: list(g.regret_minimization(iterations=t)), iterations)
            row["nashpy fictitious_play"] = per_second(
                lambda t, g=game: list(g.fictitious_play(iterations=t)), iterations)
            *_, counts = game.fictitious_play(iterations=iterations)
            row["nashpy fictitious_play gap"] = duality_gap(A, counts[0] / counts[0].sum(), counts[1] / counts[1].sum())
        row["veil rm+ gap"] = solve(A, "rm+", iterations, record=[iterations]).gap
        row["veil mi-sprm+ gap"] = solve(A, "mi-sprm+", iterations, record=[iterations]).gap
        rows.append(row)
    return rows


def kuhn_cfr(iterations: int) -> dict[str, Any] | None:
    """OpenSpiel's CFR and CFR+ on Kuhn poker: exploitability at T = 100 and ``iterations`` (None without open-spiel)."""
    try:
        import pyspiel  # noqa: F401
        from veil.algorithms.games.cfr import solve_extensive
    except ImportError:
        return None
    runs = {alg: solve_extensive("kuhn_poker", alg, iterations, record=[min(100, iterations)]) for alg in ("cfr", "cfr+")}
    out = {"iterations": runs["cfr+"].iterations, "exploitability": runs["cfr+"].exploitability,
           "cfr_exploitability": runs["cfr"].exploitability}
    print(f"kuhn CFR+: {out['exploitability']}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--iterations", type=int, default=100_000, help="T on the 3x3 game")
    parser.add_argument("--random-iterations", type=int, default=10_000, help="T on the random games")
    parser.add_argument("--seeds", type=int, default=5, help="random 10x10 games")
    parser.add_argument("--speed-iterations", type=int, default=2000)
    parser.add_argument("--cfr-iterations", type=int, default=10_000, help="CFR+ on Kuhn poker (needs open-spiel)")
    parser.add_argument("--quick", action="store_true", help="smoke settings")
    args = parser.parse_args(argv)
    if args.quick:
        args.iterations, args.random_iterations, args.seeds, args.speed_iterations = 2000, 500, 2, 100
        args.cfr_iterations = 200
    T = args.iterations
    marks = sorted({m for m in (1000, 10_000, 100_000) if m <= T} | {T})
    curves, table = {}, []
    for label, algorithm, eta, alternating in RUNS_3X3:
        sol = solve(A3, algorithm, T, eta=eta, alternating=alternating, record=sorted(set(checkpoints(T)) | set(marks)))
        at = {t: g for t, g in zip(sol.iterations, sol.gaps, strict=True)}
        lo = min(1000, T // 10)
        table.append({"method": label, "gaps": {str(t): at[t] for t in marks}, "floor": sol.floor,
                      "slope": loglog_slope(sol.iterations, sol.gaps, lo, T)})
        curves[label] = (sol.iterations, sol.gaps)
        print(f"3x3 {label}: gap({T}) = {sol.gap:.2e}", file=sys.stderr)
    by = {row["method"]: row for row in table}
    random_rows = []
    for seed in range(args.seeds):
        game = np.random.default_rng(seed).normal(size=(10, 10))
        gaps = {alg: solve(game, alg, args.random_iterations, record=[args.random_iterations]).gap
                for alg in ("rm+", "prm+", "mi-sprm+")}
        random_rows.append({"seed": seed, **gaps, "ok": gaps["mi-sprm+"] < 0.9 * gaps["prm+"] and gaps["prm+"] < gaps["rm+"]})
    games = {"3x3": A3, "10x10 seed 0": np.random.default_rng(0).normal(size=(10, 10))}
    speeds = speed(games, args.speed_iterations)
    kuhn = kuhn_cfr(args.cfr_iterations)
    mi, rm = by["MI-SPRM+"], by["RM+"]
    targets = {
        f"MI-SPRM+ gap({T}) <= 3e-5": (mi["gaps"][str(T)], mi["gaps"][str(T)] <= 3e-5),
        "MI-SPRM+ slope in [-1.15, -0.85]": (mi["slope"], -1.15 <= mi["slope"] <= -0.85),
        "RM+ slope in [-0.7, -0.4]": (rm["slope"], -0.7 <= rm["slope"] <= -0.4),
        f"random 10x10: MI-SPRM+ < 0.9 x PRM+ < RM+ on all {args.seeds} seeds":
            (sum(r["ok"] for r in random_rows), all(r["ok"] for r in random_rows)),
    }
    if kuhn is not None:
        drop = kuhn["exploitability"][0] / kuhn["exploitability"][-1]
        targets[f"Kuhn poker, CFR+: exploitability falls >= 10x from T=100 to T={args.cfr_iterations}"] = (drop, drop >= 10)
    fig_path = args.out / "img" / f"{SECTION}.png"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for label, (t, g) in curves.items():
        ax.loglog(t, g, label=label, linestyle="--" if "alternating" in label else "-")
    ax.set_xlabel("iterations T")
    ax.set_ylabel("duality gap of the averaged strategies")
    ax.set_title("SPRM+ 3x3 game")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, fig_path)
    results = {"environment": environment("1 thread", numpy=np.__version__), "command": command_line(__file__, sys.argv[1:] if argv is None else argv),
               "game_3x3": table, "random_10x10": random_rows, "speed": speeds, "kuhn_cfr": kuhn,
               "targets": {k: {"value": v, "met": bool(ok)} for k, (v, ok) in targets.items()}}
    save_results(args.out, SECTION, results, markdown(results, marks, T, args))
    for name, (value, ok) in targets.items():
        print(f"{'met   ' if ok else 'MISSED'} {name}: {value:.4g}", file=sys.stderr)
    return 0


def markdown(results: dict, marks: list[int], T: int, args) -> str:
    env = results["environment"]
    lines = ["## Regret matching: RM+, PRM+, SPRM+, MI-SPRM+ (issue 23)", "",
             f"`{results['command']}` ({env['date']}, {env['machine']}). Duality gap of the averaged strategies, "
             "simultaneous updates unless marked; MI-SPRM+ averages with weights R_t. The spec's numpy reproduction "
             "(other_seeds.md §4.3) in brackets.", "",
             "| method | " + " | ".join(f"gap({t})" for t in marks) + " | slope | final R |",
             "|---|" + "---|" * (len(marks) + 2)]
    for row in results["game_3x3"]:
        spec = SPEC_3X3.get(row["method"])
        cells = []
        for i, t in enumerate(marks):
            g = row["gaps"][str(t)]
            ref = f" [{spec[i]:.1e}]" if spec and t in (1000, 10_000, 100_000) and i < 3 else ""
            cells.append(f"{g:.2e}{ref}")
        lines.append(f"| {row['method']} | " + " | ".join(cells) + f" | {row['slope']:.3f} | {row['floor']:g} |")
    lines += ["", f"![gap curves](img/{SECTION}.png)", "",
              f"Random 10x10 games, N(0, 1) payoffs, gap after {args.random_iterations} iterations:", "",
              "| seed | RM+ | PRM+ | MI-SPRM+ | MI < 0.9 PRM+ < RM+ |", "|---|---|---|---|---|"]
    for r in results["random_10x10"]:
        lines.append(f"| {r['seed']} | {r['rm+']:.2e} | {r['prm+']:.2e} | {r['mi-sprm+']:.2e} | "
                     f"{'yes' if r['ok'] else 'no'} |")
    speed_cols = [k for k in results["speed"][0] if k not in ("game", "iterations") and not k.endswith("gap")]
    lines += ["", f"Speed, iterations/s (best of 3 runs of {results['speed'][0]['iterations']} iterations, one "
              "process; nashpy's `regret_minimization` is its fixed-learning-rate regret matching, which returns "
              "rounded pure strategies, so only its speed is comparable):", "",
              "| game | " + " | ".join(speed_cols) + " |", "|---|" + "---|" * len(speed_cols)]
    for r in results["speed"]:
        lines.append(f"| {r['game']} | " + " | ".join(f"{r[c]:,.0f}" for c in speed_cols) + " |")
    gap_cols = [k for k in results["speed"][0] if k.endswith("gap")]
    lines += ["", "Gap at that T: " + "; ".join(
        f"{r['game']}: " + ", ".join(f"{c.removesuffix(' gap')} {r[c]:.2e}" for c in gap_cols)
        for r in results["speed"]) + "."]
    kuhn = results["kuhn_cfr"]
    if kuhn:
        t0, t1 = kuhn["iterations"]
        lines += ["", f"Extensive form (the `games` extra): OpenSpiel's CFR+ on Kuhn poker, exploitability of the "
                  f"average policy {kuhn['exploitability'][0]:.2e} at T = {t0} and {kuhn['exploitability'][1]:.2e} at "
                  f"T = {t1} (CFR: {kuhn['cfr_exploitability'][0]:.2e} and {kuhn['cfr_exploitability'][1]:.2e}); "
                  "MI-SPCFR+ is not implemented."]
    lines += ["", "Targets:", ""]
    for name, target in results["targets"].items():
        lines.append(f"- {'met' if target['met'] else '**missed**'}: {name} (measured {target['value']:.4g})")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
