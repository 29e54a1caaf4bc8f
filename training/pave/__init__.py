"""veil.training.pave: PAVE parameter-vector specifications of models and of users' few-shot data.

A model's capability is the low-rank change of a shared base that refits the model's own predictions; a user's
task is the same change fitted on their labelled examples; the closest vector (cosine) is the model to reuse.
The file format and the comparison rules are torch-free, in :mod:`veil.pave`; the private (CKKS) matching is in
:mod:`veil.he.recommend`, and `veil recommend` (:mod:`veil.recommend`) joins the two. See docs/recommend.md.

Example:
    >>> from veil.training.pave import PaveConfig, SpecBase, model_spec, user_spec, rank_models
    >>> base = SpecBase.bundled(PaveConfig())
    >>> user = user_spec(base, ["the meal was great.", "the show was awful."], [1, 0])
"""

from __future__ import annotations

from veil.pave import PaveVector, SpecFormatError, SpecMismatch, check_comparable, rank_models

from veil.lazy import lazy_exports

from .config import PaveConfig

# the torch parts load on first use (`veil recommend --help` needs none of them)
__getattr__, __dir__ = lazy_exports(__name__, {
    "SpecBase": ".base", "projection": ".base", "weights_sha256": ".base", "classifier_predictor": ".fit",
    "fit_vector": ".fit", "model_spec": ".fit", "user_spec": ".fit"})

__all__ = ["PaveConfig", "PaveVector", "SpecBase", "SpecFormatError", "SpecMismatch", "check_comparable",
           "classifier_predictor", "fit_vector", "model_spec", "projection", "rank_models", "user_spec",
           "weights_sha256"]
