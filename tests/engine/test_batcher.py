"""The dynamic batcher on a fake run: grouping by non-batch dims, max_batch_size, split-back, draining."""

from __future__ import annotations

import asyncio
import logging
import threading

import numpy as np
import pytest
from veil.engine import errors
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
    # the first found the queue empty and ran at once; the others queued meanwhile: one run per shape group
    assert runs[0] == (1, 3) and sorted(runs[1:]) == [(3, 5), (5, 3)]
    stats = scheduler._metrics.stats
    assert (stats.inference_count, stats.execution_count) == (9, 3)


def test_max_batch_size_is_respected() -> None:
    scheduler, runs = make(max_batch_size=8, delay_us=20_000)
    submit_all(scheduler, [np.ones((3, 2), np.float32) for _ in range(5)])
    assert all(shape[0] <= 8 for shape in runs) and sum(shape[0] for shape in runs) == 15 and len(runs) < 5


def test_without_batching_every_request_runs_alone() -> None:
    scheduler, runs = make(max_batch_size=8, delay_us=0, batching=False)
    submit_all(scheduler, [np.ones((2, 2), np.float32) for _ in range(4)])
    assert runs == [(2, 2)] * 4


# -- issue 19 item 8: a failed run is the client's fault (4xx) or the server's (500, logged once) ------------
def _failing(exc: BaseException) -> Scheduler:
    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise exc

    metrics = Metrics().for_model("m", "1", "CPUExecutionProvider", "CPUExecutionProvider")
    return Scheduler(run, ["y"], 8, BatchingConfig(max_queue_delay_us=50_000), 1, metrics)


def _errors(scheduler: Scheduler, n: int) -> list[BaseException]:
    async def go() -> list[BaseException]:
        results = await asyncio.gather(*(scheduler.submit({"x": np.ones((1, 2), np.float32)}, 1) for _ in range(n)),
                                       return_exceptions=True)
        await scheduler.drain()
        return list(results)

    return asyncio.run(go())


@pytest.mark.parametrize("exc", [RuntimeError("bug"), MemoryError(), KeyError("x")])
def test_server_fault_in_a_run_is_500_logged_once(exc: BaseException, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="veil.engine")
    results = _errors(_failing(exc), 4)
    assert all(isinstance(r, errors.InternalError) and r.status_code == 500 for r in results)
    records = [r.getMessage() for r in caplog.records if r.exc_info]
    # the first ran alone (nothing queued yet), the other three as one batch: one log line per run
    assert len(records) == 2 and "1 request(s)" in records[0] and "3 request(s)" in records[1]


def test_onnxruntime_refusal_in_a_run_is_400_not_logged(caplog) -> None:
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

    caplog.set_level(logging.ERROR, logger="veil.engine")
    results = _errors(_failing(InvalidArgument("Got invalid dimensions for input: x")), 2)
    assert all(isinstance(r, errors.InferenceFailed) and r.status_code == 400 for r in results)
    assert "invalid dimensions" in str(results[0]) and not caplog.records


def test_engine_error_in_a_run_keeps_its_status() -> None:
    results = _errors(_failing(errors.DatatypeMismatch("input 'x': BYTES must be UTF-8")), 1)
    assert isinstance(results[0], errors.DatatypeMismatch)


# -- issue 20 §2: batching never costs a lone request; the window only holds a forming batch ----------------
def _gated(max_batch_size: int, delay_us: int, run_tagged=None) -> tuple[Scheduler, list[tuple], threading.Event]:
    """A scheduler whose runs block until the gate opens (so requests queue behind a running one)."""
    runs: list[tuple] = []
    gate = threading.Event()

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        gate.wait(10)
        runs.append(("base", feeds["x"].shape))
        return [feeds["x"] * 2]

    metrics = Metrics().for_model("m", "1", "CPUExecutionProvider", "CPUExecutionProvider")
    return Scheduler(run, ["y"], max_batch_size, BatchingConfig(max_queue_delay_us=delay_us), 1, metrics,
                     run_tagged=run_tagged), runs, gate


def test_a_lone_request_does_not_wait_the_window() -> None:
    """A 60 s window: a lone request (queue empty, instance free) still answers at once, bypassing the loop."""
    scheduler, runs, gate = _gated(8, 60_000_000)
    gate.set()

    async def go() -> None:
        for _ in range(3):  # one after another: each finds the queue empty
            out, _ = await asyncio.wait_for(scheduler.submit({"x": np.ones((1, 2), np.float32)}, 1), 5)
            np.testing.assert_array_equal(out["y"], np.full((1, 2), 2.0))
        assert scheduler._task is None  # the batching loop was never needed
        await scheduler.drain()

    asyncio.run(go())
    assert runs == [("base", (1, 2))] * 3


def test_requests_queued_behind_a_run_batch_and_a_full_batch_does_not_wait() -> None:
    """While one run is busy, arrivals queue and then run as one batch; reaching max_batch_size ends the
    60 s window at once."""
    scheduler, runs, gate = _gated(2, 60_000_000)

    async def go() -> None:
        first = asyncio.ensure_future(scheduler.submit({"x": np.ones((1, 2), np.float32)}, 1))
        await asyncio.sleep(0.05)  # the first is running (blocked on the gate)
        rest = [asyncio.ensure_future(scheduler.submit({"x": np.ones((1, 2), np.float32)}, 1)) for _ in range(2)]
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.wait_for(asyncio.gather(first, *rest), 5)
        await scheduler.drain()

    asyncio.run(go())
    assert runs == [("base", (1, 2)), ("base", (2, 2))]


def test_tags_group_through_the_run_tagged_hook() -> None:
    """The public grouped-execution hook: one run per tag (adapter), the untagged ones through ``run``."""
    untagged, _, _ = _gated(16, 20_000)
    with pytest.raises(ValueError, match="no run_tagged"):
        asyncio.run(untagged.submit({"x": np.ones((1, 2), np.float32)}, 1, "a"))

    async def go(s: Scheduler) -> list:
        blocker = asyncio.ensure_future(s.submit({"x": np.ones((1, 2), np.float32)}, 1))
        await asyncio.sleep(0.05)
        tags = ["a", None, "b", "a", None]
        queued = [asyncio.ensure_future(s.submit({"x": np.full((1, 2), i, np.float32)}, 1, t))
                  for i, t in enumerate(tags)]
        await asyncio.sleep(0.05)
        gate.set()
        results = await asyncio.wait_for(asyncio.gather(blocker, *queued), 5)
        await s.drain()
        return [out["y"][0, 0] for out, _ in results[1:]]

    tagged_runs: list[tuple] = []

    def run_tagged(feeds: dict[str, np.ndarray], tag) -> list[np.ndarray]:
        tagged_runs.append((tag, feeds["x"].shape))
        return [feeds["x"] * 3]

    scheduler, runs, gate = _gated(16, 20_000, run_tagged=run_tagged)
    values = asyncio.run(go(scheduler))
    assert values == [0.0, 2.0, 6.0, 9.0, 8.0]  # tagged x3, untagged x2, each back to its request
    assert sorted(tagged_runs) == [("a", (2, 2)), ("b", (1, 2))]
    assert runs == [("base", (1, 2)), ("base", (2, 2))]  # the blocker, then the two untagged together
