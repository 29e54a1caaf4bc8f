"""Calibration constructors, the content hash and the module log."""

from __future__ import annotations

import io

import pytest
import torch
from veil.training.compress.calibration import Calibration
from veil.training.compress.log import ModuleLog


def test_constructors_shapes_and_hash(tmp_path) -> None:
    a = Calibration.from_tokens(torch.arange(100), batch_size=3, seq_len=10)
    assert len(a) == 4 and a.batches[0]["input_ids"].shape == (3, 10) and a.num_tokens == 100
    assert a.sha256 == Calibration.from_tokens(torch.arange(100), batch_size=3, seq_len=10).sha256
    assert a.sha256 != Calibration.from_tokens(torch.arange(1, 101), batch_size=3, seq_len=10).sha256
    texts = Calibration.from_texts(["abc", "hello world"], batch_size=2)
    ids, mask = texts.batches[0]["input_ids"], texts.batches[0]["attention_mask"]
    assert ids.shape == mask.shape == (2, 11) and int(mask.sum()) == 14 and texts.num_tokens == 14
    path = tmp_path / "notes.txt"
    path.write_bytes(bytes(range(256)) * 4)
    f = Calibration.from_text_file(path, seq_len=32, num_sequences=5, batch_size=2)
    assert f.num_sequences == 5 and f.batches[0]["input_ids"].max() <= 255 and f.source == "file:notes.txt"
    c = Calibration.from_callable(lambda: [torch.zeros(2, 4, dtype=torch.long)])
    assert c.batches[0]["input_ids"].dtype == torch.int64
    assert {"source", "sha256", "batches", "sequences", "tokens"} <= set(c.describe())


def test_refusals(tmp_path) -> None:
    with pytest.raises(ValueError, match="at least one batch"):
        Calibration([])
    with pytest.raises(ValueError, match="integer"):
        Calibration.from_tokens(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="seq_len"):
        Calibration.from_bytes(b"abc", seq_len=10)
    with pytest.raises(FileNotFoundError, match="--calibration"):
        Calibration.from_text_file(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="attention_mask"):
        Calibration([{"input_ids": torch.zeros(2, 3, dtype=torch.long), "attention_mask": torch.ones(2, 4)}])


def test_module_log_lines_and_totals() -> None:
    out = io.StringIO()
    log = ModuleLog(stream=out)
    log.stage = "svd"
    log("a.q", seconds=0.5, error=0.25, params_before=100, params_after=40, rank=2)
    log("a.k", seconds=0.5, error=None, params_before=100, params_after=60)
    assert "[svd] a.q: 0.50s error=0.25 params 100->40 (keep 0.400) rank=2" in out.getvalue()
    assert log.totals() == {"modules": 2, "seconds": 1.0, "params_before": 200, "params_after": 100}
    assert log.records[1]["stage"] == "svd" and log.records[1]["error"] is None
