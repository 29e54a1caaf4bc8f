"""Every Triton kernel against its PyTorch reference, in Triton's interpreter on CPU (fp32 and fp16).

Tolerances as engine.md §3.4: fp32 ~1e-5 relative to the output scale, fp16 2e-3 absolute / 2 % relative.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from veil.engine.kernels import interpreting, ops, reference
from veil.engine.kernels.lora import group_rows, lora_apply
from veil.engine.kernels.lowrank import lowrank_linear
from veil.engine.kernels.poly import linear_polyact, polynorm

DTYPES = [(torch.float32, 1e-5, 1e-5), (torch.float16, 2e-3, 2e-2)]
pytestmark = pytest.mark.skipif(not torch.cuda.is_available() and not interpreting(),
                                reason="needs CUDA or TRITON_INTERPRET=1")


def close(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out.float(), ref.float(), atol=atol * max(1.0, float(ref.float().abs().max())), rtol=rtol)


@pytest.mark.parametrize(("dtype", "atol", "rtol"), DTYPES)
@pytest.mark.parametrize(("m", "k", "r", "n", "adapters"), [(37, 48, 8, 40, 5), (5, 33, 3, 17, 8), (70, 64, 16, 64, 2)])
def test_lora_gathered_matches_reference(dtype, atol, rtol, m, k, r, n, adapters) -> None:
    g = torch.Generator().manual_seed(m)
    x, y = torch.randn(m, k, generator=g).to(dtype), torch.randn(m, n, generator=g).to(dtype)
    a = (torch.randn(adapters, k, r, generator=g) * 0.3).to(dtype)
    b = (torch.randn(adapters, r, n, generator=g) * 0.3).to(dtype)
    scales = torch.rand(adapters, generator=g) + 0.5
    index = torch.randint(-1, adapters, (m,), generator=g, dtype=torch.int32)
    out = lora_apply(x, y, a, b, scales, index)
    close(out, reference.lora_reference(x, y, a, b, scales, index), atol, rtol)
    assert torch.equal(out[index < 0], y[index < 0])  # rows without an adapter are never written
    assert torch.equal(y, y.clone()) and out.data_ptr() != y.data_ptr()  # the input is not modified


def test_lora_edge_cases_all_none_and_one_adapter() -> None:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(9, 16, generator=g), torch.randn(9, 12, generator=g)
    a, b = torch.randn(3, 16, 4, generator=g), torch.randn(3, 4, 12, generator=g)
    scales = torch.ones(3)
    none = torch.full((9,), -1, dtype=torch.int32)
    assert torch.equal(lora_apply(x, y, a, b, scales, none), y)
    same = torch.full((9,), 2, dtype=torch.int32)
    expected = y + (x @ a[2]) @ b[2]
    torch.testing.assert_close(lora_apply(x, y, a, b, scales, same), expected, atol=1e-5, rtol=1e-5)


def test_group_rows_offsets_and_bad_index() -> None:
    order, starts, counts = group_rows(torch.tensor([2, -1, 0, 2, 0, 1], dtype=torch.int32), 3)
    assert counts.tolist() == [2, 1, 2] and starts.tolist() == [0, 2, 3]
    assert order.tolist()[:5] == [2, 4, 5, 0, 3] and order.tolist()[5] == 1  # stable; -1 rows last
    with pytest.raises(ValueError, match=r"index: expected adapter ids in \[-1, 2\]"):
        group_rows(torch.tensor([0, 3]), 3)


@pytest.mark.parametrize(("dtype", "atol", "rtol"), DTYPES)
@pytest.mark.parametrize("epilogue", ["none", "bias", "bias+poly", "shared_poly"])
def test_lowrank_fused_matches_two_matmuls(dtype, atol, rtol, epilogue) -> None:
    g = torch.Generator().manual_seed(7)
    m, k, r, n = 19, 70, 12, 100
    x = torch.randn(m, k, generator=g).to(dtype)
    u, v = (torch.randn(k, r, generator=g) * 0.2).to(dtype), (torch.randn(r, n, generator=g) * 0.2).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype) if "bias" in epilogue else None
    coeffs = {"bias+poly": torch.randn(n, 3, generator=g) * 0.3, "shared_poly": torch.tensor([0.1, 0.5, 0.2])}.get(epilogue)
    for tiles in (1, 3):
        out = lowrank_linear(x, u, v, bias, coeffs, tiles_per_program=tiles)
        close(out, reference.lowrank_reference(x, u, v, bias, coeffs), atol, rtol)


def test_lowrank_refuses_ranks_that_do_not_fit_on_chip() -> None:
    with pytest.raises(ValueError, match="rank: expected <= 256"):
        lowrank_linear(torch.randn(2, 8), torch.randn(8, 300), torch.randn(300, 4))


@pytest.mark.parametrize(("dtype", "atol", "rtol"), DTYPES)
def test_linear_polyact_and_polynorm(dtype, atol, rtol) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(21, 40, generator=g).to(dtype)
    w, b = (torch.randn(24, 40, generator=g) * 0.2).to(dtype), torch.randn(24, generator=g).to(dtype)
    coeffs = torch.randn(24, 4, generator=g) * 0.2  # degree 3, per channel
    close(linear_polyact(x, w, b, coeffs), reference.linear_poly_reference(x, w, b, coeffs), atol, rtol)
    tokens = torch.randn(3, 5, 48, generator=g).to(dtype)
    gain, shift = torch.rand(48, generator=g).to(dtype), torch.randn(48, generator=g).to(dtype)
    quad = (-1.0 / (4 * (1 - 4.0) * 2.0**2.5), 8.0, 1.0 / (4 * 2.0**0.5))  # PolyNormConfig() defaults: k 4, mu 2
    close(polynorm(tokens, 1.3, quad, 2.0, gain, shift),
          reference.polynorm_reference(tokens, 1.3, quad, 2.0, gain, shift), atol, rtol)


def test_custom_ops_pass_opcheck_and_route_to_the_kernels() -> None:
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(6, 16, generator=g), torch.randn(6, 8, generator=g)
    a, b = torch.randn(2, 16, 4, generator=g), torch.randn(2, 4, 8, generator=g)
    index = torch.tensor([0, 1, -1, 1, 0, 0], dtype=torch.int32)
    checks = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.veil.lora_apply, (x, y, a, b, torch.ones(2), index), test_utils=checks)
    u, v = torch.randn(16, 4, generator=g), torch.randn(4, 8, generator=g)
    torch.library.opcheck(torch.ops.veil.lowrank_linear, (x, u, v, None, None), test_utils=checks)
    torch.library.opcheck(torch.ops.veil.linear_polyact, (x, torch.randn(8, 16), None, torch.ones(3)), test_utils=checks)
    torch.library.opcheck(torch.ops.veil.polynorm, (x, 1.0, -0.01, 8.0, 0.35, 2.0, None, None), test_utils=checks)
    on_cpu = ops.lora_apply(x, y, a, b, torch.ones(2), index)  # the reference path
    with ops.force_triton():
        assert ops.use_triton(x)
        via_kernel = ops.lora_apply(x, y, a, b, torch.ones(2), index)
    assert not ops.use_triton(x)
    torch.testing.assert_close(via_kernel, on_cpu, atol=1e-5, rtol=1e-5)
