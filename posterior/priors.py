"""Priors over θ: Gaussian (diagonal or full), uniform box and mixtures, with a JSON spec and a stable hash.

A prior spec is a JSON object with a ``family`` and its parameters::

    {"family": "gaussian", "mean": [0, 0], "std": [0.3, 0.3]}          diagonal (or "var": [...])
    {"family": "gaussian", "mean": [0, 0], "cov": [[1, 0.5], [0.5, 1]]} full covariance
    {"family": "uniform", "low": [-1, -1], "high": [1, 1]}
    {"family": "mixture", "weights": [0.3, 0.7], "components": [<spec>, <spec>]}

``prior_from_spec`` checks every field and raises :class:`PriorSpecError` naming the field, the expected and
the received value. ``prior.to_spec()`` gives the canonical spec back (round trip), and ``prior.hash()`` is a
SHA-256 of the canonical JSON, so equal priors hash equally whichever way they were written.
"""

from __future__ import annotations

import hashlib
import json
import math
from abc import ABC, abstractmethod
from typing import Any

import torch

DTYPE = torch.float64  # priors, ratios and the sampler work in float64; networks cast to their own dtype


class PriorSpecError(ValueError):
    """A prior specification is malformed: the message names the field, the expected and the received value."""


class Prior(ABC):
    """A distribution over θ ∈ R^d with log density, sampling, moments and a canonical JSON spec."""

    dim: int

    @abstractmethod
    def log_prob(self, theta: torch.Tensor) -> torch.Tensor:
        """Log density at ``theta`` [n, d] -> [n] (-inf outside the support)."""

    @abstractmethod
    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` independent draws [n, d]."""

    @abstractmethod
    def mean(self) -> torch.Tensor:
        """[d]"""

    @abstractmethod
    def covariance(self) -> torch.Tensor:
        """[d, d]"""

    @abstractmethod
    def to_spec(self) -> dict[str, Any]:
        """The canonical JSON spec (``prior_from_spec(p.to_spec())`` equals ``p``)."""

    def hash(self) -> str:
        """SHA-256 of the canonical spec: the key of ratio-fit and OOD-threshold caches."""
        text = json.dumps(self.to_spec(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Prior) and self.hash() == other.hash()

    def __hash__(self) -> int:
        return hash(self.hash())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({json.dumps(self.to_spec())})"


class Gaussian(Prior):
    """N(mean, cov); ``diagonal`` keeps the spec in ``std`` form."""

    def __init__(self, mean: torch.Tensor, cov: torch.Tensor, diagonal: bool = False) -> None:
        self.loc = torch.as_tensor(mean, dtype=DTYPE).reshape(-1)
        self.cov = torch.as_tensor(cov, dtype=DTYPE)
        self.dim, self.diagonal = self.loc.numel(), diagonal
        self.chol = torch.linalg.cholesky(self.cov)  # [d, d]

    @classmethod
    def diag(cls, mean: Any, std: Any) -> Gaussian:
        std = torch.as_tensor(std, dtype=DTYPE).reshape(-1)
        return cls(mean, torch.diag(std**2), diagonal=True)

    def log_prob(self, theta: torch.Tensor) -> torch.Tensor:
        return gaussian_log_prob(theta.to(DTYPE), self.loc, self.chol)

    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        eps = torch.randn(n, self.dim, generator=generator, dtype=DTYPE)
        return self.loc + eps @ self.chol.T

    def mean(self) -> torch.Tensor:
        return self.loc

    def covariance(self) -> torch.Tensor:
        return self.cov

    def to_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"family": "gaussian", "mean": _floats(self.loc)}
        if self.diagonal:
            spec["std"] = _floats(self.cov.diagonal().sqrt())
        else:
            spec["cov"] = [_floats(row) for row in self.cov]
        return spec


class Uniform(Prior):
    """The box U[low, high] (independent dimensions)."""

    def __init__(self, low: Any, high: Any) -> None:
        self.low = torch.as_tensor(low, dtype=DTYPE).reshape(-1)
        self.high = torch.as_tensor(high, dtype=DTYPE).reshape(-1)
        self.dim = self.low.numel()
        self._log_density = -float(torch.log(self.high - self.low).sum())

    def log_prob(self, theta: torch.Tensor) -> torch.Tensor:
        theta = theta.to(DTYPE)
        inside = ((theta >= self.low) & (theta <= self.high)).all(-1)
        return torch.where(inside, self._log_density, -math.inf)

    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return self.low + (self.high - self.low) * torch.rand(n, self.dim, generator=generator, dtype=DTYPE)

    def mean(self) -> torch.Tensor:
        return (self.low + self.high) / 2

    def covariance(self) -> torch.Tensor:
        return torch.diag((self.high - self.low) ** 2 / 12)

    def to_spec(self) -> dict[str, Any]:
        return {"family": "uniform", "low": _floats(self.low), "high": _floats(self.high)}


class Mixture(Prior):
    """Σ_k π_k p_k(θ) over components of the same dimension."""

    def __init__(self, weights: Any, components: list[Prior]) -> None:
        w = torch.as_tensor(weights, dtype=DTYPE).reshape(-1)
        self.weights, self.components = w / w.sum(), list(components)
        self.dim = components[0].dim

    def log_prob(self, theta: torch.Tensor) -> torch.Tensor:
        parts = torch.stack([c.log_prob(theta) for c in self.components], -1)  # [n, K]
        return torch.logsumexp(parts + self.weights.log(), -1)

    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        which = torch.multinomial(self.weights, n, replacement=True, generator=generator)  # [n]
        draws = torch.stack([c.sample(n, generator) for c in self.components])  # [K, n, d]
        return draws[which, torch.arange(n)]

    def mean(self) -> torch.Tensor:
        return sum(w * c.mean() for w, c in zip(self.weights, self.components, strict=True))  # type: ignore[return-value]

    def covariance(self) -> torch.Tensor:
        m = self.mean()
        return sum(w * (c.covariance() + torch.outer(c.mean() - m, c.mean() - m))
                   for w, c in zip(self.weights, self.components, strict=True))  # type: ignore[return-value]

    def to_spec(self) -> dict[str, Any]:
        return {"family": "mixture", "weights": _floats(self.weights),
                "components": [c.to_spec() for c in self.components]}


def gaussian_log_prob(theta: torch.Tensor, loc: torch.Tensor, chol: torch.Tensor) -> torch.Tensor:
    """log N(θ; loc, L Lᵀ) for θ [..., d], loc broadcastable, chol [..., d, d] -> [...]."""
    diff = (theta - loc).unsqueeze(-1)  # [..., d, 1]
    z = torch.linalg.solve_triangular(chol, diff, upper=False).squeeze(-1)  # [..., d]
    half_logdet = chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    return -0.5 * (z**2).sum(-1) - half_logdet - 0.5 * theta.shape[-1] * math.log(2 * math.pi)


def gaussian_components(prior: Prior) -> tuple[torch.Tensor, list[Gaussian]] | None:
    """(weights [K], Gaussian components) of a Gaussian or a mixture of Gaussians; None otherwise."""
    if isinstance(prior, Gaussian):
        return torch.ones(1, dtype=DTYPE), [prior]
    if isinstance(prior, Mixture) and all(isinstance(c, Gaussian) for c in prior.components):
        return prior.weights, list(prior.components)  # type: ignore[arg-type]
    return None


def as_prior(value: Any, dim: int | None = None, where: str = "prior") -> Prior:
    """Normalise a prior once, at the boundary: a :class:`Prior`, a JSON spec (dict or text), or a
    ``torch.distributions`` object as sbi users write them (``MultivariateNormal``, ``Normal`` or
    ``Independent(Normal)``, ``Uniform`` or ``Independent(Uniform)`` such as sbi's ``BoxUniform``, and
    ``MixtureSameFamily`` of multivariate normals)."""
    if isinstance(value, Prior):
        prior = value
    elif isinstance(value, (dict, str)):
        prior = prior_from_spec(value, where=where)
    elif isinstance(value, torch.distributions.Distribution):
        prior = _from_torch(value, where)
    else:
        raise PriorSpecError(f"{where}: expected a Prior, a JSON spec or a torch distribution, received "
                             f"{type(value).__name__}")
    if dim is not None and prior.dim != dim:
        raise PriorSpecError(f"{where}: expected dimension {dim} (the model's θ), received {prior.dim}")
    return prior


def _from_torch(dist: torch.distributions.Distribution, where: str) -> Prior:
    D = torch.distributions
    base = dist.base_dist if isinstance(dist, D.Independent) else dist
    if isinstance(base, D.MultivariateNormal):
        return Gaussian(base.loc.detach(), base.covariance_matrix.detach())
    if isinstance(base, D.Normal):
        return Gaussian.diag(base.loc.detach().reshape(-1), base.scale.detach().reshape(-1))
    if isinstance(base, D.Uniform):
        return Uniform(base.low.detach().reshape(-1), base.high.detach().reshape(-1))
    if isinstance(dist, D.MixtureSameFamily) and isinstance(dist.component_distribution, D.MultivariateNormal):
        comp = dist.component_distribution
        parts = [Gaussian(m.detach(), c.detach()) for m, c in zip(comp.loc, comp.covariance_matrix, strict=True)]
        return Mixture(dist.mixture_distribution.probs.detach(), parts)
    raise PriorSpecError(f"{where}: expected a MultivariateNormal, Normal, Uniform, Independent of those or a "
                         f"MixtureSameFamily of MultivariateNormal, received {type(dist).__name__}")


# -- JSON spec -----------------------------------------------------------------------------------------------
FAMILIES = ("gaussian", "uniform", "mixture")


def prior_from_spec(spec: Any, dim: int | None = None, where: str = "prior") -> Prior:
    """Build a prior from its JSON spec, checking every field (and ``dim`` when given).

    Raises:
        PriorSpecError: naming the field (``where``), the expected and the received value.
    """
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise PriorSpecError(f"{where}: expected a JSON object, received invalid JSON ({exc.msg})") from None
    if not isinstance(spec, dict):
        raise PriorSpecError(f"{where}: expected a JSON object with a 'family', received {type(spec).__name__}")
    family = spec.get("family")
    if family not in FAMILIES:
        raise PriorSpecError(f"{where}.family: expected one of {list(FAMILIES)}, received {family!r}")
    allowed = {"gaussian": {"mean", "std", "var", "cov"}, "uniform": {"low", "high"},
               "mixture": {"weights", "components"}}[family] | {"family"}
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise PriorSpecError(f"{where}: unknown fields {unknown} for family {family!r}; expected {sorted(allowed)}")
    if family == "gaussian":
        prior = _gaussian(spec, where)
    elif family == "uniform":
        low, high = _vector(spec, "low", where), _vector(spec, "high", where)
        if low.numel() != high.numel():
            raise PriorSpecError(f"{where}.high: expected {low.numel()} values (as low), received {high.numel()}")
        if not bool((high > low).all()):
            raise PriorSpecError(f"{where}.high: expected every entry above low, received low={_floats(low)} "
                                 f"high={_floats(high)}")
        prior = Uniform(low, high)
    else:
        prior = _mixture(spec, where)
    if dim is not None and prior.dim != dim:
        raise PriorSpecError(f"{where}: expected dimension {dim} (the model's θ), received {prior.dim}")
    return prior


def _gaussian(spec: dict[str, Any], where: str) -> Gaussian:
    mean = _vector(spec, "mean", where)
    given = [k for k in ("std", "var", "cov") if k in spec]
    if len(given) != 1:
        raise PriorSpecError(f"{where}: expected exactly one of 'std', 'var', 'cov', received {given or 'none'}")
    if given[0] == "cov":
        cov = _matrix(spec["cov"], f"{where}.cov", mean.numel())
        if not torch.allclose(cov, cov.T, atol=1e-10):
            raise PriorSpecError(f"{where}.cov: expected a symmetric matrix, received an asymmetric one")
        low = float(torch.linalg.eigvalsh(cov).min())
        if low <= 0:
            raise PriorSpecError(f"{where}.cov: expected a positive-definite matrix, received one with "
                                 f"smallest eigenvalue {low:.3g}")
        return Gaussian(mean, cov)
    scale = _vector(spec, given[0], where)
    if scale.numel() == 1:
        scale = scale.expand(mean.numel()).clone()
    if scale.numel() != mean.numel():
        raise PriorSpecError(f"{where}.{given[0]}: expected {mean.numel()} values (as mean) or 1, "
                             f"received {scale.numel()}")
    if not bool((scale > 0).all()):
        raise PriorSpecError(f"{where}.{given[0]}: expected positive values, received {_floats(scale)}")
    return Gaussian.diag(mean, scale if given[0] == "std" else scale.sqrt())


def _mixture(spec: dict[str, Any], where: str) -> Mixture:
    comps = spec.get("components")
    if not isinstance(comps, list) or not comps:
        raise PriorSpecError(f"{where}.components: expected a non-empty list of prior specs, received {comps!r}")
    weights = _vector(spec, "weights", where)
    if weights.numel() != len(comps):
        raise PriorSpecError(f"{where}.weights: expected {len(comps)} values (one per component), "
                             f"received {weights.numel()}")
    if not bool((weights > 0).all()):
        raise PriorSpecError(f"{where}.weights: expected positive values, received {_floats(weights)}")
    parts = [prior_from_spec(c, where=f"{where}.components[{i}]") for i, c in enumerate(comps)]
    if any(isinstance(p, Mixture) for p in parts):
        raise PriorSpecError(f"{where}.components: expected gaussian or uniform components, received a mixture")
    dims = sorted({p.dim for p in parts})
    if len(dims) != 1:
        raise PriorSpecError(f"{where}.components: expected one dimension for all components, received {dims}")
    return Mixture(weights, parts)


def _vector(spec: dict[str, Any], key: str, where: str) -> torch.Tensor:
    value = spec.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value or not all(_is_number(v) for v in value):
        raise PriorSpecError(f"{where}.{key}: expected a non-empty list of finite numbers, received {value!r}"[:300])
    return torch.tensor(value, dtype=DTYPE)


def _matrix(value: Any, where: str, d: int) -> torch.Tensor:
    ok = (isinstance(value, list) and len(value) == d
          and all(isinstance(r, list) and len(r) == d and all(_is_number(v) for v in r) for r in value))
    if not ok:
        raise PriorSpecError(f"{where}: expected a {d}x{d} list of lists of numbers, received {value!r}"[:300])
    return torch.tensor(value, dtype=DTYPE)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _floats(t: torch.Tensor) -> list[float]:
    return [float(v) for v in t.reshape(-1)]
