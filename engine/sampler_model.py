"""A PriorGuide sampler version: posterior draws under a prior chosen per request, served as an OIP v2 model.

Request:
    input ``x``      FP32, shape [d_x] or [1, d_x]: the observation.
    input ``prior``  BYTES, shape [1], optional: the test prior's JSON spec (or send it as ``parameters.prior``).
    ``parameters``   ``prior`` (a spec object or its JSON text; omitted: the training prior, unguided) and the
                     sampling settings ``num_samples``, ``seed``, ``steps``, ``langevin_steps``, ``nfe_budget``,
                     ``kernel``, ``jacobian``, ``pilot``, ``eta``, ``rho``, ``ratio``, ``k``, ``fit_covariance``,
                     ``fit_steps``, ``restarts`` (defaults from the artifact's sampler.json).
Response: ``samples`` FP32 [num_samples, d] and ``diagnostics`` BYTES [1], a JSON object (seed, NFE, ratio
method and fit error, OOD fraction, SIR ESS and Pareto k̂ of the unguided pilot, seconds); a predictive model
(trained on the joint (θ, x*)) adds ``predictive`` FP32 [num_samples, d_x*], the x* drawn with each θ.

Prior spec: ``{"family": "gaussian", "mean": [...], "std"|"var": [...] | "cov": [[...]]}``,
``{"family": "uniform", "low": [...], "high": [...]}`` or ``{"family": "mixture", "weights": [...],
"components": [...]}``. A bad spec, setting or observation is a 400 naming the field, the expected and the
received value; the sampler runs in a worker thread, one request at a time per model.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from veil.posterior.artifact import SamplerArtifact, load_artifact
from veil.posterior.priors import PriorSpecError, prior_from_spec
from veil.posterior.ratio import RatioError
from veil.posterior.sampler import SamplerSettings, Samples

from veil.config import ConfigError

from .errors import (
    DatatypeMismatch,
    InvalidSamplerRequest,
    MissingInput,
    ModelLoadFailed,
    ShapeMismatch,
    UnknownInput,
)
from .metrics import Metrics, ModelMetrics
from .protocol import InputTensor
from .repository import PbtxtConfig, TensorConfig

if TYPE_CHECKING:
    from .dataplane import DataPlane

logger = logging.getLogger("veil.engine")
X, PRIOR, SAMPLES, DIAGNOSTICS, PREDICTIVE = "x", "prior", "samples", "diagnostics", "predictive"
SETTINGS = ("num_samples", "seed", "steps", "langevin_steps", "nfe_budget", "kernel", "jacobian", "pilot", "eta",
            "rho", "ratio", "k", "fit_covariance", "fit_steps", "restarts")
PROTOCOL_PARAMETERS = ("binary_data_output", "sequence_id", "sequence_start", "sequence_end", "priority", "timeout")


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """torch on one intra-op thread for the sampler's call, restored afterwards (the setting is process-wide).

    The sampler's operations are small (a few thousand rows), so more threads only add synchronisation, and on a
    busy machine each waits for a descheduled peer (measured: 1 000 draws 0.7 s on one thread, 62 s on two while
    the other core was busy). Other torch-backed models keep their own thread count.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class SamplerModel:
    """A ``backend: "veil_sampler"`` model: one exported sampler version (sampler.json + score.pt2).

    Args:
        config: the model's config.pbtxt.
        version: the version folder number.
        path: the version's ``sampler.json``.
        manifest: veil.json (kind "priorguide-sampler").
        plane: the data plane (unused: the sampler shares no server-wide state).
    """

    def __init__(self, config: PbtxtConfig, version: int, path: Path, manifest: dict[str, Any] | None,
                 plane: DataPlane) -> None:
        self.config, self.name, self.version, self.path = config, config.name, str(version), path
        self.manifest = manifest
        self.ready, self.session, self.scheduler = False, None, None  # no ORT session, no batcher
        self.metrics: ModelMetrics | None = None
        self.inputs: dict[str, TensorConfig] = {}
        self.outputs: dict[str, TensorConfig] = {}
        self._lock = threading.Lock()

    def load(self, metrics: Metrics) -> None:
        """Load the artifact (sampler.json + the torch.export score program); then ready.

        torch's thread count is left as it is: the sampler sets it for its own calls only (:func:`_one_thread`)."""
        try:
            self.artifact: SamplerArtifact = load_artifact(self.path)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise ModelLoadFailed(f"model '{self.name}' version {self.version}: {self.path}: {exc}") from None
        spec = self.artifact.spec
        self.dim, self.x_dim, self.extra = spec["theta_dim"], spec["x_dim"], spec["dim"] - spec["theta_dim"]
        self.inputs = {X: TensorConfig(X, "FP32", [self.x_dim]), PRIOR: TensorConfig(PRIOR, "BYTES", [1])}
        self.outputs = {SAMPLES: TensorConfig(SAMPLES, "FP32", [-1, self.dim]),
                        DIAGNOSTICS: TensorConfig(DIAGNOSTICS, "BYTES", [1])}
        if self.extra:
            self.outputs[PREDICTIVE] = TensorConfig(PREDICTIVE, "FP32", [-1, self.extra])
        self.metrics = metrics.for_model(self.name, self.version, "veil_sampler", "veil_sampler")
        self.ready = True
        logger.info("sampler '%s' version %s ready (θ %d-d, x %d-d)", self.name, self.version, self.dim, self.x_dim)

    def check_inputs(self, inputs: list[InputTensor], parameters: dict[str, Any] | None = None
                     ) -> tuple[dict[str, Any], int]:
        """FP32 ``x`` of x_dim values, the prior (input or parameter) and the settings, all checked here."""
        params = dict(parameters or {})
        unknown = sorted(set(params) - set(SETTINGS) - {PRIOR} - set(PROTOCOL_PARAMETERS))
        if unknown:
            raise InvalidSamplerRequest(f"model '{self.name}': unknown parameters {unknown}; expected "
                                        f"{[PRIOR, *SETTINGS]}")
        feeds: dict[str, Any] = {}
        for tensor in inputs:
            if tensor.name not in (X, PRIOR):
                raise UnknownInput(f"model '{self.name}' has no input '{tensor.name}'; expected ['{X}', '{PRIOR}']")
            expected = "FP32" if tensor.name == X else "BYTES"
            if tensor.datatype != expected:
                raise DatatypeMismatch(f"input '{tensor.name}': datatype expected {expected}, received {tensor.datatype}")
            if tensor.name == X:
                if list(tensor.shape) not in ([self.x_dim], [1, self.x_dim]):
                    raise ShapeMismatch(f"input '{X}': shape expected [{self.x_dim}] or [1, {self.x_dim}], "
                                        f"received {tensor.shape}")
                x = np.asarray(tensor.data, dtype=np.float64).reshape(-1)
                if not np.isfinite(x).all():
                    raise InvalidSamplerRequest(f"input '{X}': expected finite values, received NaN or inf")
                feeds[X] = x
            else:
                if list(tensor.shape) != [1]:
                    raise ShapeMismatch(f"input '{PRIOR}': shape expected [1] (one JSON spec), received {tensor.shape}")
                raw = tensor.data.reshape(-1)[0]
                feeds[PRIOR] = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        if X not in feeds:
            raise MissingInput(f"model '{self.name}': missing inputs ['{X}']")
        if PRIOR in feeds and PRIOR in params:
            raise InvalidSamplerRequest(f"model '{self.name}': prior given twice (input '{PRIOR}' and "
                                        "parameters.prior); expected one of them")
        spec = feeds.pop(PRIOR, params.get(PRIOR))
        try:
            feeds[PRIOR] = None if spec is None else prior_from_spec(spec, dim=self.dim)
            feeds["settings"] = self.artifact.defaults.replace(**{k: params[k] for k in SETTINGS if k in params})
        except (PriorSpecError, ConfigError) as exc:
            raise InvalidSamplerRequest(str(exc)) from None
        return feeds, 1

    async def infer(self, feeds: dict[str, Any], batch: int) -> tuple[dict[str, np.ndarray], int]:
        """Run the sampler in a worker thread (one request at a time per model: the sampler is CPU-bound)."""
        out = await asyncio.to_thread(self._sample, feeds)
        outputs = {SAMPLES: out.theta.numpy().astype(np.float32),
                   DIAGNOSTICS: np.array([json.dumps(out.diagnostics).encode()], dtype=object)}
        if out.predictive is not None:
            outputs[PREDICTIVE] = out.predictive.numpy().astype(np.float32)
        return outputs, 0

    def _sample(self, feeds: dict[str, Any]) -> Samples:
        settings: SamplerSettings = feeds["settings"]
        with self._lock, _one_thread():
            try:
                out = self.artifact.posterior.sample(x=torch.from_numpy(feeds[X]), prior=feeds[PRIOR],
                                                     settings=settings)
            except RatioError as exc:
                raise InvalidSamplerRequest(str(exc)) from None
        return out

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        """OIP metadata plus the sampler's dims, training prior, N_train, schedule and default settings."""
        spec = self.artifact.spec
        return {"name": self.name, "versions": versions, "platform": "veil_sampler",
                "inputs": [{"name": X, "datatype": "FP32", "shape": [self.x_dim]},
                           {"name": PRIOR, "datatype": "BYTES", "shape": [1], "optional": True}],
                "outputs": [{"name": t.name, "datatype": t.datatype, "shape": t.dims} for t in self.outputs.values()],
                "parameters": {"sampler": {k: spec[k] for k in ("dim", "theta_dim", "x_dim", "sde", "train_prior",
                                                                 "train_prior_hash", "n_train", "defaults",
                                                                 "max_samples", "task")},
                               "veil": self.manifest}}

    async def unload(self) -> None:
        self.ready = False
