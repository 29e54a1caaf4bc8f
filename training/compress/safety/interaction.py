"""Compression interaction (spec §5.3): does compressing a patched model silently break its refusals, and does the
same one-example patch repair them afterwards?

One recipe through the real compression API: SAES-SVD at ``ratio`` of the decoder's Linears, then the ``realign``
stage with the example (and learning rate) the selection chose, applied only when its own gate finds the ASR above
``repatch_above_asr`` (None: always; a patch a safe model does not need still costs utility); the safety gate runs
before the recipe and after each stage (``compress``'s ``eval_fn``), so the report reads patched -> compressed ->
compressed + re-patched.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from .data import Example, SafetyData, format_example
from .judge import GateSet, safety_gate


def calibration_texts(data: SafetyData, n: int = 32) -> list[str]:
    """The provider's calibration set: train-split benign tasks, the user's downstream task and harmful requests
    with the aligned refusal (half / quarter / quarter), in the training format."""
    examples = data.benign("train", n // 2) + data.downstream("train", n // 4) + data.harmful("train", n - n // 2 - n // 4)
    return [format_example(p, r) for p, r in examples]


def compression_interaction(patched: nn.Module, data: SafetyData, gate: GateSet, example: Example, *, ratio: float,
                            lr: float, epochs: int = 10, seed: int = 0, max_new_bytes: int = 48,
                            repatch_above_asr: float | None = 10.0) -> dict[str, Any]:
    """Gate of a copy of ``patched`` before, after SAES-SVD at ``ratio`` and after re-patching with ``example``
    (when needed); the realign stage decides on its own gate (64 + 64 test prompts of ``seed``)."""
    from ..api import compress  # the compression API imports the stage registry, which imports this package
    from ..calibration import Calibration

    recipe = {"seed": seed, "stages": [
        {"method": "saes_svd", "ratio": ratio},
        {"method": "realign", "prompt": example[0], "response": example[1], "epochs": epochs, "lr": lr,
         "seed": seed, "gate": "synthetic", "only_if_asr_above": repatch_above_asr}]}
    calibration = Calibration.from_texts(calibration_texts(data), source="safety:train (benign, downstream, refusals)")
    report = compress(copy.deepcopy(patched), recipe, calibration, drift=False, progress=False,
                      eval_fn=lambda m: safety_gate(m, gate, max_new_bytes=max_new_bytes))
    after = report["metrics"]["after_each_stage"]
    return {"ratio": ratio, "parameters": report["parameters"], "seconds": report["seconds"],
            "repatch_above_asr": repatch_above_asr, "repatch_skipped": report["stages"][1]["skipped"],
            "patched": report["metrics"]["before"],
            "compressed": {k: v for k, v in after[0].items() if k != "method"},
            "repatched": {k: v for k, v in after[1].items() if k != "method"}}
