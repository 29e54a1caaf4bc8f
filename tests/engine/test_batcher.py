"""The dynamic batcher on a fake run: grouping by non-batch dims, max_batch_size, split-back, draining."""

from __future__ import annotations

import asyncio

import numpy as np
from veil.engine.batcher import Scheduler
from veil.engine.metrics import Metrics
from veil.engine.repository import BatchingConfig


def make(max_batch_size: int, delay_us: int, batching: bool = True) -> tuple[Scheduler, list[tuple]]:
    runs: list[tuple] = []

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        runs.append(feeds["x"].shape)
        return [feeds["x"] * 2, feeds["x"].sum(axis=1)]

    metrics = Metrics().for_model("m", "1", "CPUExecutionProvider", "CPUExecutionProvider")
    config = BatchingConfig(max_queue_delay_us=delay_us) if batching else None
    return Scheduler(run, ["double", "total"], max_batch_size, config, 1, metrics), runs


def submit_all(scheduler: Scheduler, arrays: list[np.ndarray]) -> list[dict[str, np.ndarray]]:
    async def go() -> list[dict[str, np.ndarray]]:
        results = await asyncio.gather(*(scheduler.submit({"x": a}, len(a)) for a in arrays))
        await scheduler.drain()
        return [outputs for outputs, _ in results]

    return asyncio.run(go())


def test_matching_shapes_concatenate_and_split_back() -> None:
    scheduler, runs = make(max_batch_size=16, delay_us=50_000)
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(n, w)).astype(np.float32) for n, w in ((1, 3), (2, 3), (1, 5), (3, 3), (2, 5))]
    outs = submit_all(scheduler, arrays)
    for a, out in zip(arrays, outs, strict=True):
        np.testing.assert_allclose(out["double"], a * 2)
        np.testing.assert_allclose(out["total"], a.sum(axis=1), rtol=1e-6)
    assert sorted(runs) == [(3, 5), (6, 3)]  # one run per shape group
    stats = scheduler._metrics.stats
    assert (stats.inference_count, stats.execution_count) == (9, 2)


def test_max_batch_size_is_respected() -> None:
    scheduler, runs = make(max_batch_size=8, delay_us=20_000)
    submit_all(scheduler, [np.ones((3, 2), np.float32) for _ in range(5)])
    assert all(shape[0] <= 8 for shape in runs) and sum(shape[0] for shape in runs) == 15 and len(runs) < 5


def test_without_batching_every_request_runs_alone() -> None:
    scheduler, runs = make(max_batch_size=8, delay_us=0, batching=False)
    submit_all(scheduler, [np.ones((2, 2), np.float32) for _ in range(4)])
    assert runs == [(2, 2)] * 4
