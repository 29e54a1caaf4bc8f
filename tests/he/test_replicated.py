"""Replicated latency plans (``compile(replicate=True)``): one sample per ciphertext, its block tiled over every
slot, so rotation steps count modulo the period: fewer Galois keys for one-image clients, same results."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
from veil.he.compiler import compile, with_key_manifest
from veil.he.errors import CompileError
from veil.he.plan import FORMAT, REPLICATED_FORMAT, Plan

_SPEC = importlib.util.spec_from_file_location("he_test_conv", Path(__file__).with_name("test_conv.py"))
_CONV = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_CONV)
exported, encrypted, ort_run, simulate = _CONV.exported, _CONV.encrypted, _CONV.ort_run, _CONV.simulate
TOLERANCE = _CONV.TOLERANCE


@pytest.mark.parametrize("name", ["k3_stride2", "polynorm", "residual", "tutorial", "stem16"])
def test_replicated_plan_tiles_each_sample_and_matches_onnx_runtime(name: str) -> None:
    model = exported(name)
    plan = compile(model, mode="latency", replicate=True)
    plain = compile(model, mode="latency")
    period = plan.spec["period"]
    assert plan.replicated and plan.batch_capacity == 1 and plan.key_modulus == period < plan.slots
    assert plain.batch_capacity == plan.slots // period and plain.key_modulus == plain.slots
    x = np.random.default_rng(2).normal(size=(3, 1, 8, 8))
    vectors = plan.encode_inputs(x)
    assert len(vectors) == 3 and plan.ciphertexts_for(3) == 3
    for v in vectors:  # every block of a ciphertext is the same sample
        blocks = v.reshape(-1, period)
        assert np.array_equal(blocks, np.broadcast_to(blocks[0], blocks.shape)) and np.any(blocks[0])
    np.testing.assert_array_equal(vectors[1].reshape(-1, period)[0], plain.encode_inputs(x[1:2])[0][:period])
    np.testing.assert_allclose(simulate(plan, x), ort_run(model, x), atol=2e-4, rtol=1e-4)


def test_binary_keys_of_a_replicated_plan_stay_inside_the_period() -> None:
    model = exported("k3_1-4-8_gap")
    plain, tiled = (compile(model, mode="latency", rotation_keys="binary", replicate=r) for r in (False, True))
    period = tiled.spec["period"]
    assert tiled.galois_steps == [1 << k for k in range(int(math.log2(period)))]  # every bit below the period
    assert len(tiled.galois_steps) < len(plain.galois_steps)
    assert max(plain.galois_steps) >= period  # the negative steps' wrap-around needs the high bits unreplicated
    # the same rotations, each a shorter binary word modulo the period (a step of -s is period - s, not slots - s)
    assert tiled.spec["rotations"]["rotations"] == plain.spec["rotations"]["rotations"]
    assert tiled.spec["rotations"]["key_switches"] < plain.spec["rotations"]["key_switches"]
    exact = compile(model, mode="latency", replicate=True)
    assert all(-period // 2 < s <= period // 2 for s in exact.galois_steps)
    assert with_key_manifest(exact, "binary").galois_steps == tiled.galois_steps  # the key modulus travels


def test_replicated_binary_plan_runs_encrypted_with_its_keys_only() -> None:
    model = exported("k3_1-4-8_gap")  # 3 levels: N = 8192
    plan = compile(model, mode="latency", rotation_keys="binary", replicate=True)
    x = np.random.default_rng(4).normal(size=(2, 1, 8, 8))
    out, steps = encrypted(plan, x)
    np.testing.assert_allclose(out, ort_run(model, x), atol=TOLERANCE, rtol=0)
    assert sorted(set(steps)) == plan.galois_steps  # only the period's powers of two
    assert len(steps) == plan.spec["rotations"]["key_switches"] * 2  # one ciphertext per image


def test_replicated_plan_saves_as_format_4_and_plain_plans_stay_3(tmp_path: Path) -> None:
    model = exported("k1")
    tiled = compile(model, mode="latency", replicate=True)
    assert tiled.spec["format"] == REPLICATED_FORMAT and compile(model, mode="latency").spec["format"] == FORMAT
    loaded = Plan.load(tiled.save(tmp_path / "plan"))
    assert loaded.replicated and loaded.hash() == tiled.hash() and loaded.key_modulus == tiled.spec["period"]


def test_replicate_is_refused_in_throughput_mode() -> None:
    with pytest.raises(CompileError, match=r"replicate.*latency.*throughput"):
        compile(exported("k1"), mode="throughput", replicate=True)


def test_export_cli_refuses_replicate_with_throughput(capsys) -> None:
    from veil.export.he_cli import main

    assert main(["ckpt", "--repo", "r", "--name", "m", "--mode", "throughput", "--replicate"]) == 2
    assert "--replicate expected only with --mode latency, received --mode throughput" in capsys.readouterr().err
