"""veil.pave: the plaintext PAVE specification (vectors, identity, scoring), numpy only.

Training computes specs (:mod:`veil.training.pave`), export writes them beside models, the engine ranks them and
he encrypts them (:mod:`veil.he.recommend`); this room is below all four, so none of them imports another for it.
The file format and the comparison rules are in :mod:`veil.pave.spec`. See docs/recommend.md.
"""

from __future__ import annotations

from .spec import (
    ADAPTER_SPEC_DIR,
    MAX_DIM,
    SPEC_FILE,
    PaveVector,
    SpecFormatError,
    SpecMismatch,
    check_comparable,
    check_identity,
    identity_hash,
    rank_models,
    spec_paths,
)

__all__ = ["ADAPTER_SPEC_DIR", "MAX_DIM", "SPEC_FILE", "PaveVector", "SpecFormatError", "SpecMismatch",
           "check_comparable", "check_identity", "identity_hash", "rank_models", "spec_paths"]
