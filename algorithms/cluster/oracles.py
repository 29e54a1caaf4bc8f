"""Quadruplet oracles: "is d(a, b) <= d(c, d)?" answered exactly, with persistent noise, by a served model.

Items are indices 0..n-1. An oracle answers a batch of questions at once: ``le_many(e1, e2)`` with two (q, 2)
integer arrays of edges returns q booleans, and ``le(a, b, c, d)`` asks one. The noisy oracle is the R-model's
*persistent* noise (Raychaudhury et al., ICLR 2026, §2): each distinct question is answered wrongly with
probability phi, independently across questions, and the same way every time it is asked again, so repeating a
question buys nothing. :class:`CountingOracle` counts (and caches) the distinct questions an algorithm asks,
the cost measure of the R-model.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from ..errors import InputError, OracleError


@runtime_checkable
class QuadrupletOracle(Protocol):
    """Answers "is d(e1) <= d(e2)?" for batches of edge pairs over items 0..n-1."""

    n: int

    def le_many(self, e1: np.ndarray, e2: np.ndarray) -> np.ndarray:
        """(q, 2), (q, 2) int arrays -> (q,) bool: d(e1[i]) <= d(e2[i])."""
        ...


def le(oracle: QuadrupletOracle, a: int, b: int, c: int, d: int) -> bool:
    """One question: is d(a, b) <= d(c, d)?"""
    return bool(oracle.le_many(np.array([[a, b]]), np.array([[c, d]]))[0])


def check_edges(n: int, e1: object, e2: object) -> tuple[np.ndarray, np.ndarray]:
    """Two (q, 2) int64 arrays of item indices in [0, n); anything else is refused by name."""
    out = []
    for name, e in (("e1", e1), ("e2", e2)):
        arr = np.asarray(e)
        if arr.ndim != 2 or arr.shape[1] != 2 or arr.dtype.kind not in "iu":
            raise InputError(name, "a (q, 2) integer array of item indices", f"{arr.dtype} array of shape {arr.shape}")
        if arr.size and (arr.min() < 0 or arr.max() >= n):
            raise InputError(name, f"item indices in [0, {n})", f"[{arr.min()}, {arr.max()}]")
        out.append(arr.astype(np.int64, copy=False))
    if out[0].shape != out[1].shape:
        raise InputError("e2", f"as many edges as e1 ({out[0].shape[0]})", out[1].shape[0])
    return out[0], out[1]


class DistanceOracle:
    """Shared by the oracles that know distances: ``le_many`` compares ``distances`` of the two edges."""

    n: int

    def distances(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def le_many(self, e1: np.ndarray, e2: np.ndarray) -> np.ndarray:
        e1, e2 = check_edges(self.n, e1, e2)
        return self.distances(e1[:, 0], e1[:, 1]) <= self.distances(e2[:, 0], e2[:, 1])


class ExactOracle(DistanceOracle):
    """The true answers from points and a metric: "euclidean", "cosine" (1 - cos) or a callable.

    Args:
        points: (n, dim) coordinates (or any per-item features the callable reads).
        metric: "euclidean", "cosine", or ``f(points[i], points[j]) -> (q,)`` distances for index arrays.
    """

    def __init__(self, points: np.ndarray, metric: str | Callable[[np.ndarray, np.ndarray], np.ndarray] = "euclidean"):
        self.points = np.asarray(points, dtype=np.float64)
        if self.points.ndim != 2 or self.points.shape[0] < 1:
            raise InputError("points", "an (n, dim) array with n >= 1", f"shape {self.points.shape}")
        if isinstance(metric, str) and metric not in ("euclidean", "cosine"):
            raise InputError("metric", "'euclidean', 'cosine' or a callable", metric)
        self.metric = metric
        self.n = self.points.shape[0]
        if metric == "cosine":
            norms = np.linalg.norm(self.points, axis=1, keepdims=True)
            self._unit = self.points / np.where(norms > 0, norms, 1.0)

    def distances(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        """d(i[q], j[q]) for index arrays."""
        if self.metric == "euclidean":
            return np.sqrt(np.sum((self.points[i] - self.points[j]) ** 2, axis=-1))
        if self.metric == "cosine":
            return np.maximum(1.0 - np.sum(self._unit[i] * self._unit[j], axis=-1), 0.0)
        return np.asarray(self.metric(self.points[i], self.points[j]), dtype=np.float64)


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 arrays (wrapping arithmetic): a keyed hash of small integers."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


class PersistentNoisyOracle:
    """The R-model's persistent noise: each distinct question is flipped with probability ``phi``, for good.

    The flip is a keyed hash of the canonical question (unordered edges, the pair of edges ordered), so the same
    question gets the same answer however often and in whichever order it is asked, and the oracle is
    antisymmetric: asking (e2, e1) gives the negation of (e1, e2) (ties aside, which read as "<=" in the
    canonical order). A question about one edge against itself is answered True, without noise.

    Args:
        truth: an oracle with the true answers (usually :class:`ExactOracle`).
        phi: the error probability, in [0, 0.5) (the paper's analysis needs phi < 1/4).
        seed: keys the hash; another seed is another draw of the noise.
    """

    def __init__(self, truth: QuadrupletOracle, phi: float, seed: int = 0) -> None:
        if not 0.0 <= phi < 0.5:
            raise InputError("phi", "an error probability in [0, 0.5)", phi)
        self.truth, self.phi, self.seed, self.n = truth, float(phi), int(seed), truth.n

    def le_many(self, e1: np.ndarray, e2: np.ndarray) -> np.ndarray:
        e1, e2 = check_edges(self.n, e1, e2)
        a, b = np.sort(e1, axis=1), np.sort(e2, axis=1)
        swap = (a[:, 0] > b[:, 0]) | ((a[:, 0] == b[:, 0]) & (a[:, 1] > b[:, 1]))
        lo, hi = np.where(swap[:, None], b, a), np.where(swap[:, None], a, b)
        answer = self.truth.le_many(lo, hi) ^ (self._uniform(lo, hi) < self.phi)
        same = np.all(lo == hi, axis=1)
        return np.where(same, True, answer ^ swap)

    def _uniform(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        h = np.full(lo.shape[0], (self.seed * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64)
        with np.errstate(over="ignore"):
            for column in (lo[:, 0], lo[:, 1], hi[:, 0], hi[:, 1]):
                h = _mix(h ^ (column.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)))
        return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


class CountingOracle:
    """Counts and caches the questions asked of ``inner``: ``queries`` distinct ones (the R-model's cost),
    ``calls`` in all. A question asked again (in either order) is answered from the cache, not asked again."""

    def __init__(self, inner: QuadrupletOracle) -> None:
        self.inner, self.n = inner, inner.n
        self.queries = 0
        self.calls = 0
        self._cache: dict[int, bool] = {}

    def le_many(self, e1: np.ndarray, e2: np.ndarray) -> np.ndarray:
        e1, e2 = check_edges(self.n, e1, e2)
        a, b = np.sort(e1, axis=1), np.sort(e2, axis=1)
        ka, kb = a[:, 0] * self.n + a[:, 1], b[:, 0] * self.n + b[:, 1]
        swap = ka > kb
        lo, hi = np.minimum(ka, kb).tolist(), np.maximum(ka, kb).tolist()
        nn = self.n * self.n
        keys = [x * nn + y for x, y in zip(lo, hi, strict=True)]
        cache = self._cache
        self.calls += len(keys)
        new: dict[int, int] = {}  # a question not seen before -> its first row in this batch
        for i, key in enumerate(keys):
            if key not in cache and key not in new:
                new[key] = i
        if new:  # ask each new question once, in canonical order, so the cache holds the canonical answer
            rows = np.fromiter(new.values(), dtype=np.int64, count=len(new))
            first = np.where(swap[rows, None], b[rows], a[rows])
            second = np.where(swap[rows, None], a[rows], b[rows])
            cache.update(zip(new, self.inner.le_many(first, second).tolist(), strict=True))
            self.queries += len(new)
        canonical = np.fromiter((cache[key] for key in keys), dtype=bool, count=len(keys))
        # (e2, e1) is the canonical question reversed: its negation, except an edge against itself (always True)
        return np.where(swap, ~canonical, canonical) | (ka == kb)


class ModelOracle(DistanceOracle):
    """Distances from a served veil model: embeddings fetched over the Open Inference Protocol v2 (REST, JSON),
    each item's once (cached), compared by cosine distance (1 - cos) or Euclidean distance.

    Args:
        url: the server, e.g. ``http://127.0.0.1:8000``.
        model: the model name (e.g. an exported all-MiniLM-L6-v2 sentence encoder).
        inputs: per item, the model's inputs: ``{name: (n, ...) array}`` (e.g. ``input_ids``/``attention_mask``
            from the tokenizer shipped next to the model); rows are sent ``batch_size`` at a time.
        output: the output tensor holding the embedding (default: the response's first output).
        metric: "cosine" or "euclidean".
        batch_size: items per inference request.
        timeout: seconds per request.
    """

    def __init__(self, url: str, model: str, inputs: dict[str, np.ndarray], output: str | None = None,
                 metric: str = "cosine", batch_size: int = 32, timeout: float = 60.0) -> None:
        if not inputs:
            raise InputError("inputs", "at least one named input array", inputs)
        sizes = {name: np.asarray(arr).shape[0] for name, arr in inputs.items()}
        if len(set(sizes.values())) != 1:
            raise InputError("inputs", "arrays with the same number of rows (one per item)", sizes)
        if metric not in ("cosine", "euclidean"):
            raise InputError("metric", "'cosine' or 'euclidean'", metric)
        self.url, self.model, self.output, self.metric = url.rstrip("/"), model, output, metric
        self.inputs = {name: np.asarray(arr) for name, arr in inputs.items()}
        self.n = next(iter(sizes.values()))
        self.batch_size, self.timeout = int(batch_size), float(timeout)
        self.requests = 0
        self._emb: np.ndarray | None = None
        self._have = np.zeros(self.n, dtype=bool)

    def embeddings(self, items: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """The (n, dim) embedding table, with (at least) ``items`` fetched (all of them when None)."""
        wanted = np.arange(self.n) if items is None else np.unique(np.asarray(items, dtype=np.int64))
        missing = wanted[~self._have[wanted]]
        for start in range(0, missing.size, self.batch_size):
            rows = missing[start:start + self.batch_size]
            emb = self._infer(rows)
            if self._emb is None:
                self._emb = np.zeros((self.n, emb.shape[1]), dtype=np.float64)
            self._emb[rows] = emb
            self._have[rows] = True
        return self._emb if self._emb is not None else np.zeros((self.n, 0))

    def distances(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        emb = self.embeddings(np.concatenate([i, j]))
        u, v = emb[i], emb[j]
        if self.metric == "euclidean":
            return np.sqrt(np.sum((u - v) ** 2, axis=-1))
        cos = np.sum(u * v, axis=-1) / np.maximum(np.linalg.norm(u, axis=-1) * np.linalg.norm(v, axis=-1), 1e-12)
        return np.maximum(1.0 - cos, 0.0)

    def _infer(self, rows: np.ndarray) -> np.ndarray:
        """One OIP v2 JSON inference request for ``rows``; the embedding as a (len(rows), dim) float64 array."""
        tensors = []
        for name, arr in self.inputs.items():
            part = arr[rows]
            datatype = {"i": "INT64", "u": "INT64", "f": "FP32", "b": "BOOL"}.get(part.dtype.kind)
            if datatype is None:
                raise InputError(f"inputs[{name!r}]", "an integer, float or bool array", str(part.dtype))
            tensors.append({"name": name, "shape": list(part.shape), "datatype": datatype,
                            "data": part.reshape(-1).tolist()})
        body = {"inputs": tensors} | ({"outputs": [{"name": self.output}]} if self.output else {})
        request = urllib.request.Request(f"{self.url}/v2/models/{self.model}/infer", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                reply = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise OracleError(f"model {self.model!r} at {self.url}: HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise OracleError(f"model {self.model!r} at {self.url}: no answer ({exc})") from exc
        self.requests += 1
        outputs = reply.get("outputs") or []
        chosen = [o for o in outputs if self.output is None or o.get("name") == self.output][:1]
        if not chosen:
            raise OracleError(f"model {self.model!r}: expected an output {self.output or '(any)'}, received "
                              f"{[o.get('name') for o in outputs]}")
        out = np.asarray(chosen[0]["data"], dtype=np.float64).reshape(chosen[0]["shape"])
        if out.ndim != 2 or out.shape[0] != rows.size:
            raise OracleError(f"model {self.model!r}: expected a ({rows.size}, dim) embedding, received shape "
                              f"{list(out.shape)}")
        return out
