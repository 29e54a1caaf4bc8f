"""ParallelEvaluator (he/parallel.py): one request over forked processes agrees with the serial PlanEvaluator.

Plans are the tiny exported test models at N = 8192; ``min_rotations=1`` forces every linear op onto the workers.
Tolerance: both paths decrypt to the ONNX Runtime outputs within the serial path's own 1e-2 (tests/he/test_evaluate.py);
the two differ only by the order of additions, measured ~1e-6.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from veil.he.compiler import compile
from veil.he.evaluate import PlanEvaluator
from veil.he.keys import SecretKeyring
from veil.he.parallel import ParallelEvaluator

_SPEC = importlib.util.spec_from_file_location("he_test_compile_p", Path(__file__).with_name("test_compile.py"))
_MODELS = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_MODELS)
TOLERANCE = 1e-2


@pytest.fixture(scope="module")
def conv():
    model = _MODELS.exported("conv")
    plan = compile(model, mode="latency")
    params = plan.parameters()
    assert params.poly_modulus_degree == 8192
    ring = SecretKeyring.generate(params, plan.galois_steps)
    x = np.random.default_rng(3).normal(size=(2, 1, 8, 8))
    return plan, params, ring, ring.evaluation_keys(), x, _MODELS.ort_run(model, x)


def _decrypted(evaluator, plan, ring, keys, x, cts=None):
    out = evaluator.run(cts if cts is not None else ring.encrypt(plan.encode_inputs(x)), keys)
    return plan.decode_outputs(ring.decrypt(out), len(x))


def test_parallel_agrees_with_serial(conv) -> None:
    plan, params, ring, keys, x, reference = conv
    cts = ring.encrypt(plan.encode_inputs(x))
    serial = _decrypted(PlanEvaluator(plan, params), plan, ring, keys, x, cts)
    parallel = ParallelEvaluator(plan, params, processes=3, min_rotations=1)
    try:
        assert len(parallel.worker_pids()) == 2
        shares = [parallel.partition(enc, 3) for op, enc in zip(plan.ops, parallel.encoded, strict=True)
                  if op["op"] == "linear"]
        assert any(s is not None for s in shares)  # at least one op really splits
        for _ in range(2):  # the second call reuses the keys the workers hold
            got = _decrypted(parallel, plan, ring, keys, x, cts)
            np.testing.assert_allclose(got, serial, atol=1e-4, rtol=0)
            np.testing.assert_allclose(got, reference, atol=TOLERANCE, rtol=0)
        assert parallel.failures == 0
    finally:
        parallel.close()


def test_one_process_is_the_serial_path(conv) -> None:
    plan, params, ring, keys, x, reference = conv
    evaluator = ParallelEvaluator(plan, params, processes=1, min_rotations=1)
    assert evaluator.workers == [] and evaluator.partition(evaluator.encoded[0] or [], 1) is None
    np.testing.assert_allclose(_decrypted(evaluator, plan, ring, keys, x), reference, atol=TOLERANCE, rtol=0)


def test_crashed_worker_is_survived_and_replaced(conv, caplog) -> None:
    plan, params, ring, keys, x, reference = conv
    parallel = ParallelEvaluator(plan, params, processes=2, min_rotations=1)
    try:
        np.testing.assert_allclose(_decrypted(parallel, plan, ring, keys, x), reference, atol=TOLERANCE, rtol=0)
        (pid,) = parallel.worker_pids()
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        with caplog.at_level("WARNING", logger="veil.he"):
            got = _decrypted(parallel, plan, ring, keys, x)  # the dead worker's share is recomputed here
        np.testing.assert_allclose(got, reference, atol=TOLERANCE, rtol=0)
        assert parallel.failures >= 1 and sum("logged once" in r.message for r in caplog.records) == 1
        got = _decrypted(parallel, plan, ring, keys, x)  # the next request forks a fresh pool
        assert parallel.worker_pids() and parallel.worker_pids()[0] != pid
        np.testing.assert_allclose(got, reference, atol=TOLERANCE, rtol=0)
    finally:
        parallel.close()


def test_a_worker_that_raises_mid_request_has_its_shares_computed_in_the_parent(conv, monkeypatch) -> None:
    # a worker's error arrives where its partial sums were due; the parent computes that share itself
    from veil.he.pool import ForkedPool

    plan, params, ring, keys, x, reference = conv
    pool = ForkedPool(2)
    parallel = ParallelEvaluator(plan, params, pool=pool, min_rotations=1)

    def failing(*args, **kwargs):
        if parallel._in_worker:
            raise RuntimeError("injected worker failure")
        return ParallelEvaluator.partial_sums(parallel, *args, **kwargs)

    monkeypatch.setattr(parallel, "partial_sums", failing)  # before the fork: the worker inherits it
    pool.start()
    try:
        np.testing.assert_allclose(_decrypted(parallel, plan, ring, keys, x), reference, atol=TOLERANCE, rtol=0)
        assert parallel.failures == 1 and parallel.workers == []  # the pool closed, forked again next request
    finally:
        pool.close()


def test_a_refused_input_leaves_the_workers_in_step(conv) -> None:
    # the parent checks the ciphertext before any worker starts on it: no answer is left unread in a pipe
    from veil.he.errors import MismatchError

    plan, params, ring, keys, x, reference = conv
    parallel = ParallelEvaluator(plan, params, processes=2, min_rotations=1)
    try:
        (ct,) = ring.encrypt(plan.encode_inputs(x))
        ct.scale = ct.scale * 2
        pids = parallel.worker_pids()
        with pytest.raises(MismatchError, match="fresh ciphertexts"):
            parallel.run([ct], keys)
        np.testing.assert_allclose(_decrypted(parallel, plan, ring, keys, x), reference, atol=TOLERANCE, rtol=0)
        assert parallel.failures == 0 and parallel.worker_pids() == pids
    finally:
        parallel.close()


def test_independent_ciphertexts_on_workers(conv) -> None:
    plan, params, ring, keys, _, _ = conv
    images = plan.batch_capacity + 3  # two ciphertexts, each a whole evaluation
    x = np.random.default_rng(5).normal(size=(images, 1, 8, 8))
    cts = ring.encrypt(plan.encode_inputs(x))
    assert len(cts) == 2
    parallel = ParallelEvaluator(plan, params, processes=2)
    try:
        got = plan.decode_outputs(ring.decrypt(parallel.run(cts, keys)), images)
        want = plan.decode_outputs(ring.decrypt(PlanEvaluator(plan, params).run(cts, keys)), images)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
        assert parallel.failures == 0
    finally:
        parallel.close()


def test_a_shared_pool_serves_several_evaluators_with_one_worker(conv) -> None:
    # a deep model's rounds: one pool, forked once after both evaluators encoded their plaintexts; a worker per
    # round each parsing the same key set is what took a ResNet-20's server past the machine's memory
    from veil.he.pool import ForkedPool

    plan, params, _, _, x, reference = conv
    other = compile(_MODELS.exported("conv"), mode="latency", replicate=True)  # a second plan, the same parameters
    assert other.parameters().hash() == params.hash() and other.hash() != plan.hash()
    ring = SecretKeyring.generate(params, sorted(set(plan.galois_steps) | set(other.galois_steps)))
    keys = ring.evaluation_keys()  # one key set for both rounds, as a client's for one parameter set
    pool = ForkedPool(2)
    first = ParallelEvaluator(plan, params, pool=pool, min_rotations=1)
    second = ParallelEvaluator(other, params, pool=pool, min_rotations=1)
    assert first.workers == second.workers == []  # nothing forked before the owner starts the pool
    pool.start()
    try:
        (worker,) = pool.workers
        assert first.worker_pids() == second.worker_pids() == [worker.process.pid]
        np.testing.assert_allclose(_decrypted(first, plan, ring, keys, x), reference, atol=TOLERANCE, rtol=0)
        got = other.decode_outputs(ring.decrypt(second.run(ring.encrypt(other.encode_inputs(x[:1])), keys)), 1)
        np.testing.assert_allclose(got, reference[:1], atol=TOLERANCE, rtol=0)
        assert list(worker.keys) == [id(keys)]  # sent and parsed once, for both evaluators
        assert first.failures == second.failures == 0
    finally:
        pool.close()
    assert first.workers == [] and second.workers == []


def test_a_pool_keeps_one_parsed_key_set_per_parameter_set_of_its_rounds() -> None:
    # a ResNet-20's rounds use three parameter sets; a two-set LRU evicted the 1 GB N = 32768 set every request and
    # sent it to the worker again (+17 s a request)
    from types import SimpleNamespace

    from veil.he.pool import KEY_SETS, ForkedPool

    def evaluator(params_hash: str):
        return SimpleNamespace(plan=SimpleNamespace(parameters=lambda: SimpleNamespace(hash=lambda: params_hash)))

    pool = ForkedPool(2)
    assert pool.key_sets == KEY_SETS == 2
    for params_hash in ("stem", "body", "body", "body", "head"):
        pool.add(evaluator(params_hash))
    assert pool.key_sets == 3 and len(pool.evaluators) == 5 and pool.workers == []


def _registered_after_the_fork(conv, tmp_path):
    """Fresh keys (no earlier test held them, so no fork inherited them) registered in a key store after a worker
    forked: (ring, keys held parsed only, input ciphertexts, the serial result, the parallel evaluator)."""
    from veil.he.keystore import KeyStore

    plan, params, _, _, x, _ = conv
    ring = SecretKeyring.generate(params, plan.galois_steps)
    keys = ring.evaluation_keys()
    cts = ring.encrypt(plan.encode_inputs(x))
    serial = _decrypted(PlanEvaluator(plan, params), plan, ring, keys, x, cts)
    parallel = ParallelEvaluator(plan, params, processes=2, min_rotations=1)  # forked before the keys exist
    store = KeyStore(tmp_path / "keys", quota_bytes=10**9, ttl_seconds=3600.0)
    reg = store.register(keys.to_bytes())
    held = store.get(reg.key_id, reg.key_secret)
    assert held.source is not None and held._relin_bytes is None
    return ring, held, cts, serial, parallel


def test_workers_read_key_store_keys_from_their_file(conv, tmp_path) -> None:
    # keys the key store holds parsed only (no seeded bytes in memory), registered after the worker forked, reach it
    # as their file's path and key id
    plan, _, _, _, x, _ = conv
    ring, held, cts, serial, parallel = _registered_after_the_fork(conv, tmp_path)
    try:
        np.testing.assert_allclose(_decrypted(parallel, plan, ring, held, x, cts), serial, atol=1e-4, rtol=0)
        assert parallel.failures == 0 and all(len(w.keys) == 1 for w in parallel.workers)  # the worker loaded them
    finally:
        parallel.close()


def test_a_worker_refuses_a_key_file_changed_since_registration(conv, tmp_path) -> None:
    # the worker checks the file's SHA-256 against the key id: another client's valid keys swapped into the file are
    # refused (the parent computes the share with the keys it holds), never silently evaluated with
    plan, params, _, _, x, _ = conv
    ring, held, cts, serial, parallel = _registered_after_the_fork(conv, tmp_path)
    held.source.chmod(0o600)
    held.source.write_bytes(SecretKeyring.generate(params, plan.galois_steps).evaluation_keys().to_bytes())
    try:
        np.testing.assert_allclose(_decrypted(parallel, plan, ring, held, x, cts), serial, atol=1e-4, rtol=0)
        assert parallel.failures >= 1
    finally:
        parallel.close()


def test_a_worker_forked_after_the_keys_were_held_shares_them(conv, tmp_path, monkeypatch) -> None:
    # the server forks its workers at the first request, when the client's keys are held: a worker takes its
    # parent's parsed keys (copy-on-write) and never parses the file again (a ResNet-20: 2.5 GB per process before)
    from veil.he.keys import EvaluationKeys
    from veil.he.keystore import KeyStore

    plan, params, ring, keys, x, _ = conv
    store = KeyStore(tmp_path / "keys", quota_bytes=10**9, ttl_seconds=3600.0)
    reg = store.register(keys.to_bytes())
    held = store.get(reg.key_id, reg.key_secret)
    assert EvaluationKeys.held(reg.key_id) is held

    def parsed(*_args, **_kwargs):
        raise AssertionError("a worker parsed keys its parent held when it forked")

    monkeypatch.setattr(EvaluationKeys, "from_file", parsed)  # inherited by the worker
    cts = ring.encrypt(plan.encode_inputs(x))
    serial = _decrypted(PlanEvaluator(plan, params), plan, ring, keys, x, cts)
    parallel = ParallelEvaluator(plan, params, processes=2, min_rotations=1)
    try:
        np.testing.assert_allclose(_decrypted(parallel, plan, ring, held, x, cts), serial, atol=1e-4, rtol=0)
        assert parallel.failures == 0 and all(len(w.keys) == 1 for w in parallel.workers)
    finally:
        parallel.close()


def test_the_exchange_cost_gate_keeps_an_op_serial_when_pipes_cost_more_than_the_split_saves(conv) -> None:
    # partition's gate: split only if the largest share plus EXCHANGE_COST per ciphertext crossing a pipe (the
    # op's inputs out, each output's partial sum back) beats the serial op
    from veil.he import parallel as par

    plan, params, *_ = conv
    evaluator = ParallelEvaluator(plan, params, processes=1, min_rotations=1)
    evaluator._switches = lambda step: 0 if step == 0 else 1  # one key switch per rotation
    mask = np.ones(4)
    many_babies = [([(0, b, 0, mask) for b in range(1, 17)], [], None, [])]  # 1 input, 1 output, 16 rotations
    shares = evaluator.partition(many_babies, 2)
    assert shares is not None and len(shares) == 2
    assert sorted(t for share in shares for _, ts in share for t in ts) == list(range(16))  # every term once
    # 16 outputs sharing 4 baby rotations: a split saves ~2 key switches, 17 ciphertexts cross the pipes
    shared = [([(0, b, 0, mask) for b in range(1, 5)], [], None, []) for _ in range(16)]
    assert evaluator.partition(shared, 2) is None
    # the same op with free pipes would split: it is the exchange cost that keeps it serial
    saved = par.EXCHANGE_COST
    try:
        par.EXCHANGE_COST = 0.0
        assert evaluator.partition(shared, 2) is not None
    finally:
        par.EXCHANGE_COST = saved


def test_concurrent_first_requests_fork_one_worker_set(conv) -> None:
    # the server forks at a model's first request: two requests arriving together must not fork a set each
    import threading

    from veil.he.pool import ForkedPool

    plan, params, *_ = conv
    pool = ForkedPool(2)
    ParallelEvaluator(plan, params, pool=pool)
    threads = [threading.Thread(target=pool.start) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert len(pool.workers) == 1 and pool.workers[0].process.is_alive()
    finally:
        pool.close()


def _keyed_with_serial(model, seed: int):
    """A latency plan of ``model`` with keys, one random 8x8 image encrypted, and the serial path's output."""
    plan = compile(model, mode="latency")
    params = plan.parameters()
    ring = SecretKeyring.generate(params, plan.galois_steps)
    keys = ring.evaluation_keys()
    x = np.random.default_rng(seed).normal(size=(1, 1, 8, 8))
    cts = ring.encrypt(plan.encode_inputs(x))
    return plan, params, ring, keys, x, cts, _decrypted(PlanEvaluator(plan, params), plan, ring, keys, x, cts)


def test_a_polynorm_mean_is_block_summed_beside_the_diagonal_sums_not_after_them() -> None:
    # an output's broadcast terms (a PolyNorm's mean) read only the op's inputs, so their block sum is a group of
    # the split: a share computes it while the others compute diagonal sums, and the parent never rotates it after
    # the shares came back (py-spy, ResNet-20 on 2 cores: that serial block sum was 23 % of the server's time)
    from veil.he.parallel import BROADCAST

    model = _MODELS.exported("norm_conv")
    plan, params, ring, keys, x, cts, serial = _keyed_with_serial(model, seed=5)
    parallel = ParallelEvaluator(plan, params, processes=2, min_rotations=1)
    try:
        with_means = [(op, enc) for op, enc in zip(plan.ops, parallel.encoded, strict=True)
                      if op["op"] == "linear" and any(sums for _, sums, *_ in enc)]
        shares = [parallel.partition(enc, 2, op["window"]) for op, enc in with_means]
        assert any(BROADCAST in ts for split in shares if split for share in split for _, ts in share)
        finishing, late = [False], []
        finish, broadcast_sum = parallel._finish, parallel._broadcast_sum

        def tracked_finish(*args):
            finishing[0] = True
            try:
                return finish(*args)
            finally:
                finishing[0] = False

        parallel._finish = tracked_finish
        parallel._broadcast_sum = lambda *args: late.append(finishing[0]) or broadcast_sum(*args)
        got = _decrypted(parallel, plan, ring, keys, x, cts)
        np.testing.assert_allclose(got, serial, atol=1e-4, rtol=0)
        np.testing.assert_allclose(got, _MODELS.ort_run(model, x), atol=TOLERANCE, rtol=0)
        assert parallel.failures == 0 and not any(late)  # none computed in the parent after the shares
    finally:
        parallel.close()


def test_a_polynorm_right_after_a_cut_block_sums_its_mean_on_a_worker_beside_the_square_sum() -> None:
    # a segment that starts with a PolyNorm (a ResNet block after a refresh cut) opens with a linear op too cheap
    # to split (one diagonal and the mean); its mean's block sum and the next op's (sumsq) square block sum are
    # independent, so a worker takes the first while the parent does the second (py-spy, ResNet-20 on 2 cores:
    # that serial mean was 16 % of the server's time)
    torch = pytest.importorskip("torch")
    from veil.export import export_graph

    torch.manual_seed(0)
    norm = _MODELS.PolyNorm(1, _MODELS.PolyNormConfig(), layout="channels")
    norm.running_var.fill_(0.3)
    model = export_graph(torch.nn.Sequential(norm, _MODELS.poly_act(1, 2, channel_dim=1),
                                             torch.nn.Conv2d(1, 2, 3, padding=1), torch.nn.Flatten(),
                                             torch.nn.Linear(128, 10)).eval(),
                         (torch.randn(4, 1, 8, 8),), ["x"], ["logits"], {"x": {0: "batch"}}).model
    plan, params, ring, keys, x, cts, serial = _keyed_with_serial(model, seed=7)
    parallel = ParallelEvaluator(plan, params, processes=2, min_rotations=1)
    try:
        (pair,) = parallel._pairs
        assert plan.ops[pair + 1]["op"] == "sumsq"
        assert parallel.partition(parallel.encoded[pair], 2, plan.ops[pair]["window"]) is None  # not split
        means, broadcast_sum = [], parallel._broadcast_sum
        parallel._broadcast_sum = lambda xs, sums, *args: (sums and means.append(1)) or broadcast_sum(xs, sums, *args)
        for _ in range(2):
            got = _decrypted(parallel, plan, ring, keys, x, cts)
            np.testing.assert_allclose(got, serial, atol=1e-4, rtol=0)
            np.testing.assert_allclose(got, _MODELS.ort_run(model, x), atol=TOLERANCE, rtol=0)
        assert parallel.failures == 0 and means == []  # the only mean was summed on the worker, both times
    finally:
        parallel.close()


def test_concurrent_requests_on_one_model_each_send_the_workers_their_own_op(conv) -> None:
    # the server runs requests to one model in threads: while one request holds the workers, another runs
    # serially through the same evaluator; the first must still send its own op to the workers (before: the op
    # and keys were attributes of the evaluator, so it sent the op the second request reached last)
    import threading

    plan, params, ring, keys, x, reference = conv
    parallel = ParallelEvaluator(plan, params, processes=2, min_rotations=1)
    paused, resumed, results = threading.Event(), threading.Event(), {}
    partition = parallel.partition

    def pausing(*args, **kwargs):  # the first request stops inside its first split, holding the workers
        if threading.current_thread().name == "first" and not paused.is_set():
            paused.set()
            resumed.wait(120)
        return partition(*args, **kwargs)

    def second() -> None:
        paused.wait(120)
        try:
            results["second"] = _decrypted(parallel, plan, ring, keys, x[1:])
        finally:
            resumed.set()

    parallel.partition = pausing
    try:
        threads = [threading.Thread(target=lambda: results.update(first=_decrypted(parallel, plan, ring, keys,
                                                                                    x[:1])), name="first"),
                   threading.Thread(target=second, name="second")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        np.testing.assert_allclose(results["first"], reference[:1], atol=TOLERANCE, rtol=0)
        np.testing.assert_allclose(results["second"], reference[1:], atol=TOLERANCE, rtol=0)
        assert paused.is_set() and parallel.failures == 0
    finally:
        parallel.close()
