"""`veil train uldnet` under torchrun: 2 processes (gloo on loopback) give one process's result at the same global
batch, and only rank 0 writes the checkpoint, prints the report and draws the progress bar."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from veil.training import distributed
from veil.training.uldnet.cli import main as train_main

# 90 samples -> a training split whose last global batch (of 16) is uneven over 2 ranks
ARGS = ["--arch", "mlp", "--width", "16", "--depth", "1", "--epochs", "3", "--warmup-epochs", "1",
        "--batch-size", "16", "--threads", "1", "--lr", "0.01"]


def test_one_process_is_a_world_of_one():
    assert distributed.setup() == distributed.World(0, 1, 0) and distributed.is_main()
    rows, local = distributed.batch_rows(5)
    assert rows.tolist() == [0, 1, 2, 3, 4] and local == 5 and distributed.loss_scale(5, 5) == 1.0
    assert distributed.global_mean(0.3, 5, 5) == 0.3


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_torchrun_two_processes_match_one(tmp_path, capsys):
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 30)
    x = (rng.normal(size=(90, 12)) + y[:, None]).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    args = ["--data", str(tmp_path / "data.npz"), *ARGS]
    assert train_main([*args, "--out", str(tmp_path / "one"), "--no-progress"]) == 0
    capsys.readouterr()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "--log-dir", str(tmp_path / "logs"), "--redirects", "3", "-m", "veil.cli", "train",
                           "uldnet", *args, "--out", str(tmp_path / "two")],
                          env=env, capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    assert one.keys() == two.keys()
    # same global batch: the same parameters within a tolerance (each rank's PolyNorm updates its running
    # variance from its own slice inside the forward; the average is restored after every step)
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-3, atol=1e-3, msg=name)
    metrics = [json.loads((tmp_path / r / "metrics.json").read_text()) for r in ("one", "two")]
    assert [m["processes"] for m in metrics] == [1, 2]  # the second run really split each batch over 2 ranks
    history = [m["history"] for m in metrics]
    losses = [[h["train_loss"] for h in run] for run in history]
    assert losses[1][0] == pytest.approx(losses[0][0], rel=1e-6)  # warm-up (exact LayerNorm): the same math
    np.testing.assert_allclose(losses[1], losses[0], rtol=2e-3)
    # rank 0 alone reported (stdout) and drew the progress bar (stderr)
    logs = {p.parent.name + "/" + p.name: p.read_text() for p in (tmp_path / "logs").rglob("std*.log")}
    rank0 = "".join(v for k, v in logs.items() if k.startswith("0/"))
    rank1 = "".join(v for k, v in logs.items() if k.startswith("1/"))
    assert '"checkpoint"' in rank0 and "train mlp" in rank0
    assert '"checkpoint"' not in rank1 and "train mlp" not in rank1, rank1[-500:]
