"""veil.posterior: PriorGuide posterior sampling over a trained (or analytic) diffusion score.

Priors, Gaussian-mixture prior ratios, guided reverse diffusion with Langevin correction and diagnostics;
shared by training (evaluation) and the engine (the sampler service). Imports torch, never veil.training.
"""

from .diagnostics import c2st
from .priors import Gaussian, Mixture, Prior, PriorSpecError, Uniform, prior_from_spec
from .sampler import PriorGuidePosterior, SamplerSettings, Samples
from .score import GaussianLinearScore, NetworkScore, VESchedule

__all__ = ["Gaussian", "GaussianLinearScore", "Mixture", "NetworkScore", "Prior", "PriorGuidePosterior",
           "PriorSpecError", "SamplerSettings", "Samples", "Uniform", "VESchedule", "c2st", "prior_from_spec"]
