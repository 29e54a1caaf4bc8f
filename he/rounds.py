"""The server's round book: binds the client-refresh rounds of one request (:mod:`veil.he.segments`).

:class:`RoundBook` records, per request, the round index, the request id and the key ids of every round, and
refuses a round replayed, out of order, sent twice at once or for another request or key (:class:`RoundError`,
HTTP 409); malformed round fields are :class:`~veil.he.errors.EnvelopeError` (HTTP 400). Needs only the
standard library.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from veil.he.errors import EnvelopeError, HEError

_REQUEST_ID = re.compile(r"^[A-Za-z0-9_-]{8,64}$")


class RoundError(HEError):
    """A refresh round replayed, out of order, unknown, or for another request or key. HTTP 409."""

    status_code = 409


@dataclasses.dataclass
class Ticket:
    """One admitted round: which request, which round, whether it is the last."""

    request_id: str
    round: int
    final: bool


@dataclasses.dataclass
class _Pending:
    owner: str  # the round-0 key id
    key_ids: list[str]
    next_round: int
    busy: bool
    expires: float


class RoundBook:
    """Binds the rounds of each request: bounded pending state (LRU + TTL, per owner), thread-safe.

    Round 0 opens a request: the server issues a request id (or records the client's, if unused) and the
    key ids of every round (``meta.key_ids``; one key set per parameter set). Round k > 0 must name an open
    request, come with that request's key id for round k, and be the next round; while a round is being
    evaluated the same round is refused, and after it succeeds it can never be sent again.

    Args:
        rounds: rounds per inference (segments of the plan).
        ttl_seconds: an open request expires this long after its last round.
        max_pending: open requests kept in all (the least recently used is dropped beyond it).
        max_per_owner: open requests kept per round-0 key id (that owner's oldest is dropped beyond it).
        clock: time source (tests).
    """

    def __init__(self, rounds: int, ttl_seconds: float = 600.0, max_pending: int = 4096, max_per_owner: int = 32,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rounds, self.ttl, self.max_pending, self.max_per_owner = rounds, ttl_seconds, max_pending, max_per_owner
        self.clock, self._lock = clock, threading.Lock()
        self._open: OrderedDict[str, _Pending] = OrderedDict()

    def _parse(self, meta: dict[str, Any], key_id: str) -> tuple[int, str | None]:
        k = meta.get("round", 0 if self.rounds == 1 else None)
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < self.rounds:
            raise EnvelopeError(f"envelope.meta.round: expected an int in 0..{self.rounds - 1} (this model runs in "
                             f"{self.rounds} rounds with client refresh), received {k!r}")
        rid = meta.get("request_id")
        if rid is not None and (not isinstance(rid, str) or not _REQUEST_ID.match(rid)):
            raise EnvelopeError(f"envelope.meta.request_id: expected 8-64 characters [A-Za-z0-9_-], received "
                             f"{str(rid)[:80]!r}")
        if k > 0 and rid is None:
            raise EnvelopeError(f"envelope.meta.request_id: round {k} expected the request_id of round 0's result, "
                             f"received none")
        return k, rid

    def begin(self, meta: dict[str, Any], key_id: str) -> Ticket:
        """Admit round ``meta.round`` of a request for evaluation (claims it until :meth:`end`).

        Raises:
            RoundError: 400 for malformed round fields; 409 for a replayed, out-of-order, concurrent or
                unknown round, or one sent with another key than its request was opened with.
        """
        k, rid = self._parse(meta, key_id)
        if self.rounds == 1:
            return Ticket(rid or "", 0, True)
        with self._lock:
            self._expire()
            if k == 0:
                return self._open_request(meta, key_id, rid)
            entry = self._open.get(rid)  # type: ignore[arg-type]
            if entry is None:
                raise RoundError(f"request_id {rid}: no open request (unknown, expired or already finished); "
                                 f"start again at round 0")
            if entry.key_ids[k] != key_id:
                raise RoundError(f"request_id {rid}: round {k} belongs to key {entry.key_ids[k][:12]}, received "
                                 f"key {key_id[:12]} (a round for another request or key)")
            if entry.busy:
                raise RoundError(f"request_id {rid}: round {entry.next_round} is being evaluated; not sent twice")
            if k != entry.next_round:
                what = "replayed" if k < entry.next_round else "out of order"
                raise RoundError(f"request_id {rid}: round {k} {what}; expected round {entry.next_round}")
            entry.busy = True
            self._open.move_to_end(rid)  # type: ignore[arg-type]
            return Ticket(rid, k, k == self.rounds - 1)  # type: ignore[arg-type]

    def _open_request(self, meta: dict[str, Any], key_id: str, rid: str | None) -> Ticket:
        key_ids = meta.get("key_ids")
        if (not isinstance(key_ids, list) or len(key_ids) != self.rounds or key_ids[0] != key_id
                or not all(isinstance(x, str) and x for x in key_ids)):
            raise EnvelopeError(f"envelope.meta.key_ids: expected the key id of each of the {self.rounds} rounds, "
                             f"starting with this request's key {key_id[:12]}, received "
                             f"{str(key_ids)[:200]}")
        if rid is None:
            rid = secrets.token_hex(16)
        elif rid in self._open:
            raise RoundError(f"request_id {rid}: already open (a replayed round 0?); use a new request id")
        mine = [r for r, e in self._open.items() if e.owner == key_id]
        if len(mine) >= self.max_per_owner:
            del self._open[mine[0]]
        if len(self._open) >= self.max_pending:
            self._open.popitem(last=False)
        self._open[rid] = _Pending(key_id, list(key_ids), 0, True, self.clock() + self.ttl)
        return Ticket(rid, 0, False)

    def end(self, ticket: Ticket, ok: bool) -> None:
        """Release a claimed round: on success the request moves on (and closes after its last round)."""
        if self.rounds == 1:
            return
        with self._lock:
            entry = self._open.get(ticket.request_id)
            if entry is None or entry.next_round != ticket.round:
                return  # evicted meanwhile
            entry.busy = False
            if not ok:
                if ticket.round == 0:
                    del self._open[ticket.request_id]  # nothing was answered: the id may be used again
                return
            entry.next_round += 1
            entry.expires = self.clock() + self.ttl
            if entry.next_round == self.rounds:
                del self._open[ticket.request_id]

    def _expire(self) -> None:
        now = self.clock()
        for rid in [r for r, e in self._open.items() if e.expires <= now and not e.busy]:
            del self._open[rid]

    def pending(self) -> int:
        """Open requests (tests, metrics)."""
        with self._lock:
            return len(self._open)
