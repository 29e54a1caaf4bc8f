"""Extensive-form games through OpenSpiel's CFR and CFR+ (the optional ``veil[games]`` extra, ``open-spiel``).

A thin wrapper: it runs ``open_spiel.python.algorithms.cfr`` on a named game and records the exploitability
(NashConv / 2 for two players) of the average policy at log-spaced iterations. MI-SPRM+'s local-regret version
(MI-SPCFR+) is not implemented here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import InputError
from .solvers import checkpoints

CFR_ALGORITHMS = ("cfr", "cfr+")


@dataclass
class CfrRun:
    """Exploitability of the average policy of CFR / CFR+ at the recorded iterations."""

    game: str
    algorithm: str
    iterations: list[int] = field(default_factory=list)
    exploitability: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"game": self.game, "algorithm": self.algorithm, "iterations": self.iterations,
                "exploitability": self.exploitability}


def solve_extensive(game: str, algorithm: str = "cfr+", iterations: int = 1000, per_decade: int = 4,
                    record: Sequence[int] | None = None) -> CfrRun:
    """Run OpenSpiel's CFR (``"cfr"``) or CFR+ (``"cfr+"``) on ``game`` (an OpenSpiel name, e.g. ``kuhn_poker``);
    the exploitability is recorded at ``record`` (default: ``per_decade`` log-spaced points per decade) and T."""
    if algorithm not in CFR_ALGORITHMS:
        raise InputError("algorithm", f"one of {list(CFR_ALGORITHMS)}", algorithm)
    import pyspiel
    from open_spiel.python.algorithms import cfr, exploitability

    try:
        loaded = pyspiel.load_game(game)
    except pyspiel.SpielError as exc:
        raise InputError("game", "an OpenSpiel game name such as 'kuhn_poker'", game) from exc
    solver = (cfr.CFRPlusSolver if algorithm == "cfr+" else cfr.CFRSolver)(loaded)
    marks = set(checkpoints(iterations, per_decade) if record is None else record) | {iterations}
    run = CfrRun(game, algorithm)
    for t in range(1, iterations + 1):
        solver.evaluate_and_update_policy()
        if t in marks:
            run.iterations.append(t)
            run.exploitability.append(float(exploitability.exploitability(loaded, solver.average_policy())))
    return run
