"""veil.algorithms.games: regret-matching equilibrium solvers (RM+, PRM+, SPRM+, MI-SPRM+) for two-player
zero-sum normal-form games, and OpenSpiel's CFR / CFR+ for extensive-form games (optional extra)."""

from .payoff import load_payoff, parse_payoff
from .solvers import ALGORITHMS, Solution, duality_gap, loglog_slope, project_floor, project_simplex, solve

__all__ = ["ALGORITHMS", "Solution", "duality_gap", "load_payoff", "loglog_slope", "parse_payoff", "project_floor",
           "project_simplex", "solve"]
