"""veil.posterior: PriorGuide posterior sampling over a trained (or analytic) diffusion score.

Priors, Gaussian-mixture prior ratios, guided reverse diffusion with Langevin correction and diagnostics;
shared by training (evaluation) and the engine (the sampler service). Imports torch, never veil.training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from veil.lazy import lazy_exports

if TYPE_CHECKING:
    from .diagnostics import c2st
    from .priors import Gaussian, Mixture, Prior, PriorSpecError, Uniform, prior_from_spec
    from .sampler import PriorGuidePosterior, SamplerSettings, Samples
    from .score import GaussianLinearScore, NetworkScore, VESchedule

# public name -> the submodule that defines it, imported on first use (a CLI's --help never imports torch)
__getattr__, __dir__ = lazy_exports(__name__, {
    "c2st": ".diagnostics",
    "Gaussian": ".priors",
    "Mixture": ".priors",
    "Prior": ".priors",
    "PriorSpecError": ".priors",
    "Uniform": ".priors",
    "prior_from_spec": ".priors",
    "PriorGuidePosterior": ".sampler",
    "SamplerSettings": ".settings",
    "Samples": ".sampler",
    "GaussianLinearScore": ".score",
    "NetworkScore": ".score",
    "VESchedule": ".score",
})

__all__ = ["Gaussian", "GaussianLinearScore", "Mixture", "NetworkScore", "Prior", "PriorGuidePosterior",
           "PriorSpecError", "SamplerSettings", "Samples", "Uniform", "VESchedule", "c2st", "prior_from_spec"]
