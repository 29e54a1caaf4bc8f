"""The refusals of veil.algorithms: bad input names the field, the expected and the received value."""

from __future__ import annotations


class AlgorithmsError(ValueError):
    """Base of every veil.algorithms refusal."""


class InputError(AlgorithmsError):
    """A payoff matrix, a JSONL record or a parameter outside what the algorithm accepts."""

    def __init__(self, field: str, expected: str, received: object) -> None:
        super().__init__(f"{field}: expected {expected}, received {received!r}")
        self.field = field


class OracleError(AlgorithmsError):
    """An oracle that could not answer (a model server that refused the request or answered nonsense)."""
