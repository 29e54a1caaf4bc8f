"""Every script in examples/ runs end to end with small settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_train_polycnn_digits(tmp_path) -> None:
    out = run("train_polycnn_digits.py", "--epochs", "2", "--warmup-epochs", "1", "--out", str(tmp_path / "ck"))
    assert "total depth: 28" in out and "test accuracy:" in out
    assert (tmp_path / "ck" / "model.safetensors").is_file()


def test_train_uldnet_own_data_npz(tmp_path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 4)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=(x[:, 0] > 0).astype(int))
    out = run("train_uldnet_own_data.py", "--npz", str(tmp_path / "d.npz"), "--epochs", "3")
    assert "'depth_total': 6" in out


def test_uldnet_photos32(tmp_path) -> None:
    out = run("uldnet_photos32.py", "--width", "4", "--depth", "1", "--epochs", "3", "--train-size", "2400",
              "--workdir", str(tmp_path))
    assert "PolyResNet width 4, 1 blocks per stage: 37 levels, test accuracy:" in out
    assert 'input contract: {"dtype": "float32"' in out and "standardisation" in out
    assert "argmax agreement with PyTorch 100.00 %" in out
    assert (tmp_path / "models" / "photos32" / "1" / "model.onnx").is_file()


def test_serve_and_query() -> None:
    out = run("serve_and_query.py")
    assert out.startswith("affine -> y [1, 3]:")


def test_export_polycnn(tmp_path) -> None:
    out = run("export_polycnn.py", "--epochs", "3", "--repo", str(tmp_path / "models"))
    assert '"functions": ["PolyAct", "PolyNorm"]' in out and "ONNX Runtime test accuracy" in out
    assert (tmp_path / "models" / "digits" / "config.pbtxt").is_file()


@pytest.mark.slow
def test_export_minilm(tmp_path) -> None:
    out = run("export_minilm.py", "--repo", str(tmp_path / "models"))
    assert "LayerNormalization" in out and "cosine similarities" in out


def test_encrypted_inference(tmp_path) -> None:
    out = run("encrypted_inference.py", "--epochs", "4", "--images", "2", "--workdir", str(tmp_path))
    assert "plan: 6 levels, N=16384" in out and "encrypted predictions:" in out


def test_finetune_lora_minilm(tmp_path) -> None:
    out = run("finetune_lora_minilm.py", "--train-size", "16", "--epochs", "1", "--task", "number",
              "--out", str(tmp_path / "lora"))
    assert "trainable params:" in out and "test accuracy:" in out and "max |logit diff|" in out
    assert (tmp_path / "lora" / "adapter_model.safetensors").is_file()


def test_forecast(tmp_path) -> None:
    out = run("forecast.py", "--series", "elnino", "--lookback", "24", "--horizon", "6", "--workdir", str(tmp_path))
    assert "rrr" in out and "exported" in out and "encrypted forecast (N=8192, 1 level)" in out
    assert float(out.rsplit("max |enc - plain| ", 1)[1]) < 1e-3
    assert (tmp_path / "models" / "elnino" / "1" / "model.onnx").is_file()


def test_every_example_is_tested() -> None:
    tested = {"train_polycnn_digits.py", "train_uldnet_own_data.py", "serve_and_query.py", "export_polycnn.py",
              "export_minilm.py", "encrypted_inference.py", "finetune_lora_minilm.py", "uldnet_photos32.py",
              # tested beside their rooms: tests/training/{lm,optim,rl}/test_example.py,
              # tests/training/compress/test_example_svd.py and compress/{heapr,safety}/test_example.py,
              # tests/codec/test_examples.py, tests/posterior/test_example.py, tests/algorithms/test_examples.py
              "cluster.py", "games.py",
              "train_tiny_lm.py", "optim_lora_minilm.py", "grpo_toy.py", "compress_tiny_lm.py",
              "compress_moe_heapr.py", "safety_realign_tiny.py", "codec_progressive.py",
              "priorguide_gaussian_linear.py", "forecast.py", "recommend.py"}  # recommend: tests/training/pave
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested
