"""Lowering of folded affine maps, PolyNorm and PolyAct into plan ops, with level accounting.

Linear ONNX nodes are never emitted one by one: a tensor is kept as a pending :class:`Affine`
``sum_v A_v @ value_v + b`` over materialized values, and consecutive linear nodes compose into it. A
nonlinear op materializes its input as one ``linear`` op (1 level). Constant factors that must sit on a
product are pushed into the producer of a value (a *twin*, see :meth:`Builder.twin`) instead of costing
a plaintext multiply. Costs after the input's linear op (he.md §1.7):

    PolyNorm          3 levels: s^2 summed, (sqrt(a) mu v - sqrt(a) b)^2, (x - E[x]) * g; gain and bias stay pending
                      (the dense centring matrix is never built: with s = kappa x and the broadcast
                      m = -kappa E[x], sum (kappa d)^2 = sum s^2 - n m^2 and kappa d g = s g + m g)
    PolyAct degree 1  0 levels  (leading coefficient folded into the producer)
    PolyAct degree 2  1 level   q2 (y * (y + q1 / q2)) + q0, the gain q2 and q0 pending (a consumer's matrix
                                absorbs them: no twin of y, whose masks would double its linear op's); the
                                twin form y * (q2 y + q1) + q0 where q2 has zeros or |q1 / q2| > MAX_SHIFT
    PolyAct degree 3  2 levels  y^2 * (q3 y + q2) + (q1 y + q0)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import scipy.sparse as sp

MAX_SHIFT = 16.0  # |q1 / q2| above this (q2 near 0) would lift y + q1 / q2 out of the integer headroom: twin form


Matrix = np.ndarray | sp.sparray


def sparse(matrix: Matrix) -> sp.csr_array:
    """``matrix`` as a CSR array of float64 without stored zeros (a conv's matrix has ~k^2 C entries per row:
    a dense (F, F) float64 at 32x32x16 would be 2 GiB, and composing two of them ~4 TFLOP)."""
    out = sp.csr_array(matrix, dtype=np.float64) if sp.issparse(matrix) else \
        sp.csr_array(np.asarray(matrix, dtype=np.float64))
    out.eliminate_zeros()
    out.sort_indices()
    return out


def identity(n: int, gain: float | np.ndarray = 1.0) -> sp.csr_array:
    """The (n, n) diagonal matrix ``gain`` (a scalar or one value per feature) as CSR."""
    return sp.diags_array(np.broadcast_to(np.asarray(gain, dtype=np.float64), (n,)), format="csr")


def entries(matrix: Matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, columns, values) of the non-zero entries, row-major."""
    coo = sparse(matrix).tocoo()
    return coo.row.astype(np.int64), coo.col.astype(np.int64), coo.data


@dataclasses.dataclass
class Affine:
    """A pending tensor ``sum_v terms[v] @ value_v + bias`` of per-sample shape ``shape``; the matrices are
    kept sparse (CSR) whatever they are given as."""

    terms: dict[str, sp.csr_array]  # value name -> (F_out, F_value)
    bias: np.ndarray  # (F_out,)
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        self.terms = {v: sparse(a) for v, a in self.terms.items()}
        self.bias = np.asarray(self.bias, dtype=np.float64).reshape(-1)

    @property
    def features(self) -> int:
        return int(self.bias.shape[0])

    def then(self, matrix: Matrix, bias: np.ndarray, shape: tuple[int, ...]) -> Affine:
        """Compose with the affine map ``z -> matrix @ z + bias`` (shape is the new per-sample shape)."""
        m = sparse(matrix)
        return Affine({v: m @ a for v, a in self.terms.items()}, m @ self.bias + bias, shape)

    def plus(self, other: Affine) -> Affine:
        terms = dict(self.terms)
        for v, a in other.terms.items():
            terms[v] = terms[v] + a if v in terms else a
        return Affine(terms, self.bias + other.bias, self.shape)

    def diagonal(self) -> tuple[str, np.ndarray] | None:
        """(value, gain) when this is ``gain * value + bias`` elementwise over one value, else None."""
        if len(self.terms) != 1:
            return None
        (value, a), = self.terms.items()
        if a.shape[0] != a.shape[1] or sparse(a - identity(a.shape[0], a.diagonal())).nnz:
            return None
        return value, a.diagonal().copy()


class Builder:
    """Accumulates plan ops, values and tensors while the compiler walks the graph."""

    def __init__(self) -> None:
        self.ops: list[dict[str, Any]] = []
        self.values: dict[str, dict[str, int]] = {}
        self.tensors: dict[str, np.ndarray | sp.csr_array] = {}  # linear weights sparse, vectors dense
        self.producer: dict[str, dict[str, Any]] = {}

    # -- values and ops -------------------------------------------------------------------------------
    def new_value(self, features: int, level: int, shape: tuple[int, ...] | None = None) -> str:
        name = f"v{len(self.values)}"
        self.values[name] = {"features": features, "level": level, "shape": list(shape or (features,))}
        return name

    def tensor(self, array: Matrix) -> str:
        name = f"t{len(self.tensors)}"
        self.tensors[name] = sparse(array) if sp.issparse(array) else np.asarray(array, dtype=np.float64)
        return name

    def level(self, value: str) -> int:
        return self.values[value]["level"]

    def input(self, features: int, shape: tuple[int, ...] | None = None) -> str:
        return self.new_value(features, 0, shape)

    def shape(self, value: str) -> tuple[int, ...]:
        return tuple(self.values[value]["shape"])

    def _emit(self, op: str, inputs: list[str], features: int, level: int, node: str,
              shape: tuple[int, ...] | None = None, **extra: Any) -> str:
        out = self.new_value(features, level, shape)
        record = {"op": op, "inputs": inputs, "outputs": [out], "level": level, "node": node, **extra}
        self.ops.append(record)
        self.producer[out] = record
        return out

    def materialize(self, expr: Affine, node: str) -> str:
        """``expr`` as a value for a non-linear consumer: a gain over a product's value (a pending PolyAct) is
        pushed into the product as a twin (0 levels, as :meth:`twin`), anything else is a linear op."""
        diag = expr.diagonal()
        if diag is not None and self.producer.get(diag[0], {}).get("op") == "mul":
            value, gain = diag
            if np.all(gain == 1.0) and not np.any(expr.bias):
                return value
            scaled = value if np.all(gain == 1.0) else self.twin(value, gain, node)
            return self.add_const(scaled, expr.bias, node) if np.any(expr.bias) else scaled
        return self.linear(expr, node)

    def linear(self, expr: Affine, node: str) -> str:
        """Materialize ``expr`` (1 level), or return its value when it is the identity on one value."""
        if len(expr.terms) == 1:
            (value, a), = expr.terms.items()
            if a.shape[0] == a.shape[1] and not sparse(a - identity(a.shape[0])).nnz and not np.any(expr.bias):
                return value
        inputs = sorted(expr.terms)
        level = max((self.level(v) for v in inputs), default=0) + 1
        return self._emit("linear", inputs, expr.features, level, node, expr.shape,
                          weights=[[self.tensor(expr.terms[v]) for v in inputs]], biases=[self.tensor(expr.bias)])

    def extra_output(self, value: str, expr: Affine) -> str:
        """One more output ``expr`` of the linear op that produced ``value`` (same inputs, same level)."""
        op = self.producer[value]
        if op["op"] != "linear" or not set(expr.terms) <= set(op["inputs"]):
            raise ValueError(f"extra_output: {value} is not a linear output over {sorted(expr.terms)}")
        out = self.new_value(expr.features, op["level"], expr.shape)
        zeros = {v: sp.csr_array((expr.features, self.values[v]["features"])) for v in op["inputs"]}
        op["outputs"].append(out)
        op["weights"].append([self.tensor(expr.terms.get(v, zeros[v])) for v in op["inputs"]])
        op["biases"].append(self.tensor(expr.bias))
        self.producer[out] = op
        return out

    def _wider(self, a: str, b: str) -> tuple[int, tuple[int, ...]]:
        """Features and shape of an elementwise result (a one-feature value broadcasts)."""
        wide = a if self.values[a]["features"] >= self.values[b]["features"] else b
        return self.values[wide]["features"], self.shape(wide)

    def mul(self, a: str, b: str, node: str) -> str:
        features, shape = self._wider(a, b)
        return self._emit("mul", [a, b], features, max(self.level(a), self.level(b)) + 1, node, shape)

    def add(self, a: str, b: str, node: str) -> str:
        features, shape = self._wider(a, b)
        return self._emit("add", [a, b], features, max(self.level(a), self.level(b)), node, shape)

    def add_const(self, a: str, const: np.ndarray, node: str) -> str:
        return self._emit("add_const", [a], self.values[a]["features"], self.level(a), node, self.shape(a),
                          const=self.tensor(np.atleast_1d(const)))

    def sumsq(self, a: str, node: str, mean: str | None = None) -> str:
        """``sum_j a_j^2`` (minus ``n mean^2`` when given: a one-feature value at a's level; n = a's features)."""
        return self._emit("sumsq", [a] if mean is None else [a, mean], 1, self.level(a) + 1, node)

    # -- folding --------------------------------------------------------------------------------------
    def twin(self, value: str, gain: np.ndarray, node: str) -> str:
        """A value equal to ``gain * value`` (elementwise) at the same level where possible.

        linear: one more output of the same op; mul: the twin of its non-broadcast factor times the other;
        add / add_const: twins of the summands. Anything else pays a diagonal linear op (1 level). A
        per-feature copy of a broadcast value is such a diagonal op (one mask and no rotation in latency
        plans, n scalar products in throughput plans), taken on the lower-level factor of a product of two
        broadcast values so that it costs no level.
        """
        op = self.producer.get(value)
        kind = op["op"] if op else "input"
        spread = self.values[value]["features"] == 1 and len(gain) > 1
        if kind == "linear" and not spread:
            k = op["outputs"].index(value)
            weights = [self.tensor(identity(len(gain), gain) @ self.tensors[t]) for t in op["weights"][k]]
            out = self.new_value(len(gain), op["level"], self.shape(value))
            op["outputs"].append(out)
            op["weights"].append(weights)
            op["biases"].append(self.tensor(gain * self.tensors[op["biases"][k]]))
            self.producer[out] = op
            return out
        if kind == "mul":
            a, b = op["inputs"]
            if self.values[a]["features"] == 1 and (self.values[b]["features"] > 1 or self.level(b) < self.level(a)):
                a, b = b, a
            return self.mul(self.twin(a, gain, node), b, node)
        if kind == "add":
            return self.add(*(self.twin(v, gain, node) for v in op["inputs"]), node)
        if kind == "add_const" and self.values[op["inputs"][0]]["features"] == len(gain):
            return self.add_const(self.twin(op["inputs"][0], gain, node), gain * self.tensors[op["const"]], node)
        n = len(gain)
        matrix = gain[:, None] if self.values[value]["features"] == 1 else identity(n, gain)
        return self.linear(Affine({value: matrix}, np.zeros(n), self.shape(value) if not spread else (n,)), node)

    def polynorm(self, expr: Affine, weight: np.ndarray, bias: np.ndarray, attrs: dict[str, float],
                 node: str) -> Affine:
        """PolyNorm over all features of ``expr`` (3 levels after its linear op); the output gain stays pending."""
        a, b, c, mu, rv = (attrs[k] for k in ("a", "b", "c", "mu", "running_var"))
        if a <= 0 or rv <= 0:
            raise ValueError(f"PolyNorm node {node!r}: expected a > 0 and running_var > 0, received a={a}, "
                             f"running_var={rv}")
        n = expr.features
        kappa = math.sqrt(math.sqrt(a) * mu / (n * rv))  # sum (kappa d)^2 = sqrt(a) mu Var / Var_bar
        # s = kappa x and m = -kappa E[x] (broadcast): sum (kappa d)^2 = sum s^2 - n m^2 and kappa d = s + m, so
        # the dense centring I - 11^T / n never reaches a matrix (a conv stays sparse)
        s = self.linear(expr.then(identity(n, kappa), np.zeros(n), expr.shape), node)
        m = self.extra_output(s, expr.then(np.full((1, n), -kappa / n), np.zeros(1), (1,)))
        t = self.add_const(self.sumsq(s, node, m), np.array([-math.sqrt(a) * b]), node)  # sqrt(a) (mu v - b)
        g = self.add_const(self.mul(t, t, node), np.array([c]), node)  # a (mu v - b)^2 + c
        y = self.add(self.mul(s, g, node), self.mul(m, g, node), node)  # kappa d g; the 1 / kappa stays pending
        return Affine({y: identity(n, math.sqrt(mu / rv) * weight / kappa)}, bias.astype(np.float64), expr.shape)

    def polyact(self, expr: Affine, coeffs: np.ndarray, node: str) -> Affine:
        """sum_i coeffs[i] * x^i elementwise; coeffs (n + 1, F). A pending diagonal affine folds in, and the
        result may be pending too (degree 2: its leading gain and constant)."""
        degree = len(coeffs) - 1
        if not 1 <= degree <= 3:
            raise ValueError(f"PolyAct node {node!r}: expected degree 1..3, received {degree}")
        diag = expr.diagonal()
        if diag is None:
            y, q = self.linear(expr, node), coeffs
        else:
            y, gain = diag
            q = _substitute(coeffs, gain, expr.bias)
        n, shape = expr.features, expr.shape
        if degree == 2 and self.values[y]["features"] == n and np.all(q[2] != 0) \
                and np.abs(q[1] / np.where(q[2] != 0, q[2], 1.0)).max() <= MAX_SHIFT:
            product = self.mul(y, self.add_const(y, q[1] / q[2], node), node)  # y (y + q1 / q2)
            return Affine({product: identity(n, q[2])}, q[0].astype(np.float64), shape)
        if degree == 1:
            value = self.add_const(self.twin(y, q[1], node), q[0], node)
        else:
            lead = self.add_const(self.twin(y, q[degree], node), q[degree - 1], node)  # q_n y + q_{n-1}
            if degree == 2:
                value = self.add_const(self.mul(y, lead, node), q[0], node)
            else:
                cubic = self.mul(self.mul(y, y, node), lead, node)
                value = self.add(cubic, self.add_const(self.twin(y, q[1], node), q[0], node), node)
        return Affine({value: identity(n)}, np.zeros(n), shape)


def _substitute(coeffs: np.ndarray, gain: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """Coefficients of p(gain * y + shift) in y, per feature: q_k = sum_i c_i C(i, k) gain^k shift^(i-k)."""
    n = len(coeffs) - 1
    q = np.zeros_like(coeffs, dtype=np.float64)
    for i in range(n + 1):
        for k in range(i + 1):
            q[k] += coeffs[i] * math.comb(i, k) * gain**k * shift ** (i - k)
    return q
