"""Issue 19 item 13: loading and querying a sampler model leaves torch's thread count alone (it used to set it to
1 for the whole server process, slowing every other torch-backed model)."""

from __future__ import annotations

import threading

import pytest
import torch
from fastapi.testclient import TestClient
from veil.engine.server import create_app
from veil.export.sampler import export_sampler
from veil.training.priorguide import SamplerTrainConfig, ScoreNetConfig, get_task, save_sampler, train_score


def _threads_in_a_new_thread() -> int:
    """torch's count as a thread started now sees it (new threads take the process-wide setting)."""
    seen: list[int] = []
    worker = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    worker.start()
    worker.join()
    return seen[0]


@pytest.fixture
def two_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(previous)


def test_sampler_leaves_torch_thread_count_alone(tmp_path, oip, two_threads: int) -> None:
    task = get_task("gaussian_linear", 2)
    theta, x = task.simulate_pairs(256, seed=0)
    result = train_score(theta, x, task.prior, ScoreNetConfig(dim=2, x_dim=2, hidden=8),
                         SamplerTrainConfig(simulations=256, steps=5, batch_size=64), progress=False)
    save_sampler(result, tmp_path / "ck", {"name": task.name, "dim": 2})
    export_sampler(tmp_path / "ck", tmp_path / "repo", "gl2")
    with TestClient(create_app(oip.make_config(tmp_path / "repo"))) as client:
        assert torch.get_num_threads() == two_threads and _threads_in_a_new_thread() == two_threads  # after load
        r = client.post("/v2/models/gl2/infer", json={
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [0.1, 0.0]}],
            "parameters": {"num_samples": 20, "steps": 4, "langevin_steps": 1, "pilot": 20, "seed": 0}})
        assert r.status_code == 200, r.text
        assert torch.get_num_threads() == two_threads and _threads_in_a_new_thread() == two_threads  # after a request
