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
    plain = compile(model, mode="latency")  # a stem grown on patches for one image: test_one_image_plan_...
    plan = compile(model, mode="latency", replicate=True, input_im2col="gather" in plain.spec["inputs"][0])
    period = plan.spec["period"]
    assert plan.replicated and plan.batch_capacity == 1 and plan.key_modulus == period < plan.slots
    assert plain.batch_capacity == plain.slots // plain.spec["period"] and plain.key_modulus == plain.slots
    # a block sum is cyclic over a replicated block: no broadcast window doubling the period
    assert period == plain.spec["period"] // (2 if plain.spec["window"] else 1) and plan.spec["window"] in (0, period)
    x = np.random.default_rng(2).normal(size=(3, 1, 8, 8))
    vectors = plan.encode_inputs(x)
    assert len(vectors) == 3 and plan.ciphertexts_for(3) == 3
    for v in vectors:  # every block of a ciphertext is the same sample
        blocks = v.reshape(-1, period)
        assert np.array_equal(blocks, np.broadcast_to(blocks[0], blocks.shape)) and np.any(blocks[0])
    positions = plain.spec["inputs"][0]["positions"]
    np.testing.assert_array_equal(vectors[1][positions], plain.encode_inputs(x[1:2])[0][positions])
    np.testing.assert_allclose(simulate(plan, x), ort_run(model, x), atol=2e-4, rtol=1e-4)


def test_one_image_plan_takes_a_stem_grown_on_im2col_patches_when_it_costs_less() -> None:
    # a 3x3 stem on 8x8: 9 taps x 64 positions of patches need a 1024-slot block, the conv's own is 256, so a plan
    # that batches keeps the plain input; with one image a request the larger block costs no images, and compile
    # keeps whichever plan has the lower cost objective (seconds plus the keys' one-time cost spread)
    from veil.he.compiler import _compile
    from veil.he.cost import objective, plan_cost

    def both(model):
        return [_compile(model, "latency", 20, "exact", True, True, grow_stem=g) for g in (False, True)]

    model = exported("k3_1-4-8_gap")
    plain, grown = both(model)
    assert "gather" not in compile(model, mode="latency").spec["inputs"][0] and "gather" not in plain.spec["inputs"][0]
    assert grown.spec["inputs"][0]["features"] == 9 * 64 and grown.spec["period"] > plain.spec["period"]
    assert grown.slots == plain.slots  # the ring does not grow with the block
    assert objective([plan_cost(grown)]) < objective([plan_cost(plain)])
    assert grown.spec["rotations"]["key_switches"] < plain.spec["rotations"]["key_switches"]
    assert compile(model, mode="latency", replicate=True).hash() == grown.hash()
    x = np.random.default_rng(5).normal(size=(2, 1, 8, 8))
    out, steps = encrypted(grown, x)
    np.testing.assert_allclose(out, ort_run(model, x), atol=TOLERANCE, rtol=0)
    assert set(steps) <= set(grown.galois_steps)
    # where the grown block's extra keys outweigh its seconds (k3 stride 2: 37 -> 36 rotations, 4 MB more keys)
    # the plain input stays
    plain, grown = both(exported("k3_stride2"))
    assert objective([plan_cost(grown)]) > objective([plan_cost(plain)])
    assert compile(exported("k3_stride2"), mode="latency", replicate=True).hash() == plain.hash()
    # "binary" asks for the fewest keys: a grown block whose steps reach further is not taken for its seconds
    binary = [with_key_manifest(p, "binary") for p in both(model)]
    assert len(binary[1].galois_steps) > len(binary[0].galois_steps)
    assert compile(model, mode="latency", rotation_keys="binary", replicate=True).galois_steps == binary[0].galois_steps


def test_binary_keys_of_a_replicated_plan_stay_inside_the_period() -> None:
    model = exported("k3_1-4-8_gap")
    # (the plain input on both sides: a stem grown on patches for one image is another layout)
    plain, tiled = (compile(model, mode="latency", rotation_keys="binary", replicate=r, input_im2col=False)
                    for r in (False, True))
    period = tiled.spec["period"]
    assert tiled.galois_steps == [1 << k for k in range(int(math.log2(period)))]  # every bit below the period
    assert len(tiled.galois_steps) < len(plain.galois_steps)
    assert max(plain.galois_steps) >= period  # the negative steps' wrap-around needs the high bits unreplicated
    # the same rotations, each a shorter binary word modulo the period (a step of -s is period - s, not slots - s)
    assert tiled.spec["rotations"]["rotations"] == plain.spec["rotations"]["rotations"]
    assert tiled.spec["rotations"]["key_switches"] < plain.spec["rotations"]["key_switches"]
    exact = compile(model, mode="latency", replicate=True, input_im2col=False)
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


def _stage_block(channels: int = 8, side: int = 4):
    """A ResNet stage's later block at small scale: PolyNorm, PolyAct, conv, PolyNorm, PolyAct, conv, identity add,
    on a (C, side, side) input whose C·side² values fill a quarter of the smallest ring's slots (refresh rounds start
    a segment like this one from a freshly encrypted cut)."""
    import torch
    from torch import nn
    from veil.export import export_graph

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(_CONV.norm(channels), _CONV.act(channels),
                                      nn.Conv2d(channels, channels, 3, padding=1), _CONV.norm(channels),
                                      _CONV.act(channels), nn.Conv2d(channels, channels, 3, padding=1))

        def forward(self, x):
            return self.body(x) + x

    torch.manual_seed(3)
    return export_graph(Block().eval(), (torch.randn(4, channels, side, side),), ["x"], ["y"],
                        {"x": {0: "batch"}}).model


def _products(plan: Plan) -> int:
    return sum(len(plan.tensors[part["masks"]]) for op in plan.ops if op["op"] == "linear"
               for row in op["diagonals"] for part in (row or []) if part is not None)


def test_replicated_period_is_the_extent_without_the_broadcast_window() -> None:
    from veil.he.latency import replicated_period

    plain, tiled = (compile(_stage_block(), mode="latency", replicate=r) for r in (False, True))
    assert replicated_period(plain) == replicated_period(tiled) == tiled.spec["period"] == plain.spec["period"] // 2


@pytest.mark.isolated  # SEAL keeps what it took (issue 35 CI: two workers reached 12 + 8.7 GB)
def test_replicated_block_merges_diagonals_modulo_the_period_and_runs_encrypted() -> None:
    # a conv over C channels laid out C x (side x side) has offsets (c_in - c_out) side² + tap: (2C - 1) k² diagonals
    # in a block; a replicated block (the client tiles it) is cyclic, so those equal modulo C side² merge: C k²
    model = _stage_block()
    plain, tiled = (compile(model, mode="latency", replicate=r) for r in (False, True))
    assert plain.spec["period"] == 2 * tiled.spec["period"] == 256  # PolyNorm's window doubles only the plain block
    assert tiled.spec["window"] == tiled.spec["period"]  # its block sums are cyclic
    assert _products(tiled) <= 0.6 * _products(plain), (_products(tiled), _products(plain))
    assert tiled.spec["rotations"]["rotations"] < plain.spec["rotations"]["rotations"]
    x = np.random.default_rng(5).normal(size=(2, 8, 4, 4))
    reference = ort_run(model, x)
    np.testing.assert_allclose(simulate(tiled, x), reference, atol=2e-4, rtol=1e-4)
    out, steps = encrypted(tiled, x)
    np.testing.assert_allclose(out, reference, atol=TOLERANCE, rtol=0)
    assert set(steps) <= set(tiled.galois_steps)


def _two_scale_cnn():
    """16 channels at 16 x 16 (a block that fills N = 8192's slots: one image per ciphertext), a stride-2 conv, then
    16 channels at 8 x 8 (a quarter of them): deeper than one set at N <= 8192, so cut into refresh rounds."""
    import torch
    from torch import nn
    from veil.export import export_graph

    torch.manual_seed(4)
    layers = [nn.Conv2d(4, 16, 3, padding=1), _CONV.act(16), nn.Conv2d(16, 16, 3, stride=2, padding=1), _CONV.act(16),
              nn.Conv2d(16, 16, 3, padding=1), _CONV.act(16), nn.Conv2d(16, 16, 3, padding=1), _CONV.act(16),
              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5)]
    return export_graph(nn.Sequential(*layers).eval(), (torch.randn(4, 4, 16, 16),), ["x"], ["logits"],
                        {"x": {0: "batch"}}).model


@pytest.mark.isolated  # SEAL keeps what it took (issue 35 CI: two workers reached 12 + 8.7 GB)
def test_refresh_segments_are_replicated_where_a_request_holds_one_image_anyway() -> None:
    from veil.he.latency import replicated_period
    from veil.he.segments import compile_segmented

    model = _two_scale_cnn()
    options = {"precision_bits": 14, "refresh": True, "max_poly_modulus_degree": 8192}
    auto, off = compile_segmented(model, **options), compile_segmented(model, replicate=False, **options)
    assert auto.cuts == off.cuts and auto.rounds >= 2
    assert min(p.batch_capacity for p in off.plans) == 1  # the 16 x 16 x 16 block fills the ring
    tiled = [p.replicated for p in auto.plans]
    assert tiled == [replicated_period(p) < p.slots for p in off.plans] == auto.report["replicated"]
    assert any(tiled) and not tiled[0] and not any(p.replicated for p in off.plans)
    for a, o in zip(auto.plans, off.plans, strict=True):  # never more work for the one image
        assert _products(a) <= _products(o) and a.spec["rotations"]["rotations"] <= o.spec["rotations"]["rotations"]
    assert sum(map(_products, auto.plans)) < sum(map(_products, off.plans))
    x = np.random.default_rng(6).normal(size=(2, 4, 16, 16))
    reference, y = ort_run(model, x), x
    for plan in auto.plans:  # the slot program of each round, the client re-encoding between them
        y = simulate(plan, y)
    np.testing.assert_allclose(y, reference, atol=2e-4, rtol=1e-4)
    batched = compile_segmented(_stage_block(), precision_bits=14, refresh=True)  # 8 images per ciphertext: as is
    assert batched.plans[0].batch_capacity > 1 and not any(p.replicated for p in batched.plans)
    forced = compile_segmented(_stage_block(), precision_bits=14, refresh=True, replicate=True)
    assert all(p.replicated and p.batch_capacity == 1 for p in forced.plans)
