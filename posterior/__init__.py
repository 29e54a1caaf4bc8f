"""veil.posterior: PriorGuide posterior sampling over a trained (or analytic) diffusion score.

Priors, Gaussian-mixture prior ratios, guided reverse diffusion with Langevin correction and diagnostics;
shared by training (evaluation) and the engine (the sampler service). Imports torch, never veil.training.
"""
