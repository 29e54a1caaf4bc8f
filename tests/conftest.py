"""Shared pytest set-up: Triton kernels run in its interpreter without CUDA; ``load_benchmark`` imports a
benchmark script; ``isolated`` tests run in a forked child."""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

# `make test` spreads files over two xdist workers on two cores: each worker (and every process it starts) gets
# one OpenMP / BLAS thread, so the two workers' intra-op pools never oversubscribe the cores. Measured here: two
# torch-training tests side by side took 204 s and 206 s with the default pools, 46 s and 53 s with one thread
# each. Set before torch is first imported (it sizes its pool from OMP_NUM_THREADS); an explicit setting wins.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")

import torch
from hypothesis import settings

# CI (CI=true) explores the same hypothesis examples on every run: a fuzz test still finds new inputs on developers'
# machines, but a submission's CI cannot fail on an input no earlier run drew (print_blob lets one reproduce it)
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# Triton reads the flag when it is first imported and when a kernel is defined: set it before any test module
# (or a library it imports) gets there, so the kernel tests run on CPU (engine.md §3.4)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="session")
def load_benchmark() -> Callable[[str], ModuleType]:
    """``load_benchmark(name)``: ``benchmarks/<name>.py`` as a fresh module (the scripts are not a package)."""
    def load(name: str) -> ModuleType:
        if str(BENCHMARKS) not in sys.path:  # as `python benchmarks/<name>.py` has it: `from common import ...`
            sys.path.insert(0, str(BENCHMARKS))
        spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
        assert spec is not None and spec.loader is not None, name
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load


# Tests marked `isolated` run in a forked child of the process that set up their fixtures: SEAL's memory pool never
# gives memory back, so a test that evaluates deep plans at N = 16384 would otherwise leave gigabytes held by the
# session for every later test (the whole suite peaked at 24 GB, the machine's size, before this). The child shares
# the parent's imports and fixtures copy-on-write (a fresh interpreter per test cost ~10 s of imports and fixture
# set-up each, ~3 min of the suite), runs the test body, reports its outcome over a pipe and exits; whatever it
# allocated goes with it. The child runs torch on one thread (xdist workers already do, above): GNU OpenMP's
# thread pool does not survive a fork. The parent's objects are frozen out of the child's garbage collector
# (``gc.freeze``): finalizers of what earlier tests left behind must not run in the child. After
# tests/engine/test_grpc.py (a gRPC aio server, its poller thread left running) in the same worker, the child of
# tests/he/test_evaluate.py sat in ``Thread.join(timeout=0.2)`` called from collections during torch.onnx.export
# (py-spy), a thread the child does not have: a 10 s test timed out at 900 s in CI. Reproduced by running those two
# files in one process; the freeze fixes it.
def _run_forked(pyfuncitem: pytest.Function) -> tuple[str, str]:
    """Run the test function in a forked child: ("passed" | "skipped" | "failed", message)."""
    import pickle
    import traceback

    read, write = os.pipe()
    gc.freeze()  # the child never collects what it inherited (below)
    pid = os.fork()
    if pid != 0:
        gc.unfreeze()
    if pid == 0:  # the child: run the body, send the outcome, never return into pytest
        os.close(read)
        try:
            torch.set_num_threads(1)  # an OpenMP pool the parent used is not the child's: one thread needs none
            args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
            pyfuncitem.obj(**args)
            outcome = ("passed", "")
        except pytest.skip.Exception as exc:
            outcome = ("skipped", str(exc))
        except BaseException:  # every failure goes back to the parent as text
            outcome = ("failed", traceback.format_exc())
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            with os.fdopen(write, "wb") as pipe:
                pipe.write(pickle.dumps(outcome))
        finally:
            os._exit(0)
    os.close(write)
    try:
        with os.fdopen(read, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
    except BaseException:  # a timeout or an interrupt in the parent: the child goes too
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise
    if not data:
        code = os.waitstatus_to_exitcode(status)
        return "failed", "the forked child died without reporting (" + (f"signal {-code})" if code < 0 else f"exit {code})")
    return pickle.loads(data)


@pytest.fixture
def run_forked() -> Callable[[pytest.Function], tuple[str, str]]:
    """The `isolated` runner itself, for its own tests (importlib mode cannot import conftest)."""
    return _run_forked


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if pyfuncitem.get_closest_marker("isolated") is None or not hasattr(os, "fork"):
        return None  # run here, as usual
    kind, message = _run_forked(pyfuncitem)
    if kind == "skipped":
        pytest.skip(message)
    if kind == "failed":
        pytest.fail(f"isolated (forked) run of {pyfuncitem.nodeid} failed:\n{message}", pytrace=False)
    return True


@pytest.fixture(scope="session")
def tiny_polymlp(tmp_path_factory: pytest.TempPathFactory):
    """(checkpoint folder, splits) of a tiny ULD-Net PolyMLP on a 3-class 6-feature task, for the HE tests
    (engine serving, Ray, gRPC kinds, the client-only install)."""
    from veil.training.uldnet import ModelConfig, TrainConfig, save_uldnet, train_uldnet
    from veil.training.uldnet.data import split_stratified

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 40)
    x = rng.normal(size=(120, 6)).astype(np.float32)
    x[np.arange(120), y] += 3.0
    data = split_stratified(x, y, ["a", "b", "c"], "test")
    result = train_uldnet(ModelConfig(arch="mlp", input_shape=[6], num_classes=3, width=8),
                          TrainConfig(epochs=8, warmup_epochs=2, lr=1e-2, batch_size=16), data, progress=False)
    checkpoint = tmp_path_factory.mktemp("polymlp") / "ck"
    save_uldnet(result, checkpoint, data)
    return checkpoint, data


# VEIL_TEST_RSS=FILE: after each test, append "<worker> <nodeid> <rss MiB> <peak rss MiB>" of the process running it, to find
# the tests that hold SEAL memory (two xdist workers share this machine's 24 GB; mark such tests `isolated`)
@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    path = os.environ.get("VEIL_TEST_RSS")
    if not path:
        return
    import resource

    with open("/proc/self/statm") as statm:
        rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open(path, "a") as out:
        out.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')} {item.nodeid} {rss:.0f} {peak:.0f}\n")
