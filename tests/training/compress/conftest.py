"""Fixtures of the compression tests: a micro byte-LM (briefly trained so activations are anisotropic) and its
calibration / held-out data, built once per session on one thread."""

from __future__ import annotations

import pytest
import torch
from veil.training.compress.calibration import Calibration


@pytest.fixture(scope="session")
def micro_lm() -> torch.nn.Module:
    """The micro preset (2 blocks, width 64) after 60 AdamW steps on the pydoc text; ~3 s on one core."""
    from veil.training.lm import PRESETS, LMModelConfig, LMTrainConfig, load_pydoc_topics, train_lm

    torch.set_num_threads(1)
    train = LMTrainConfig(steps=60, batch_size=8, block_size=64, eval_every=60, eval_blocks=4, seed=0)
    return train_lm(LMModelConfig(**PRESETS["micro"]), train, load_pydoc_topics(), progress=False).model.eval()


@pytest.fixture(scope="session")
def micro_calibration() -> Calibration:
    from veil.training.compress.workloads import lm_calibration

    return lm_calibration(num_sequences=8, seq_len=64, batch_size=4)


@pytest.fixture(scope="session")
def micro_blocks() -> torch.Tensor:
    from veil.training.compress.workloads import lm_eval_blocks

    return lm_eval_blocks(seq_len=64, max_blocks=8)
