"""int64 offsets in the Triton kernels for tensors past 2**31 elements.

Triton computes `index * stride` in int32 when both are int32 (program ids, aranges, strides below 2**31),
so an element more than 2**31 - 1 elements from a tensor's start (a 4 GiB fp16 activation: 524288 tokens x
4096) was addressed through a wrapped, negative offset. The kernels now take a WIDE constexpr, chosen by
`wide_offsets` from the tensors' shapes and strides, that widens their indices to int64. Such tensors are
too large for the interpreter, so these tests check the choice on meta tensors (no memory) and run every
kernel with WIDE forced on small inputs against its reference, through the interpreter."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


def test_wide_offsets_from_shapes_and_strides() -> None:
    from tuner.kernels._common import wide_offsets

    edge = torch.empty(2**16, 2**15, device="meta")  # last element at 2**31 - 1: still int32
    assert not wide_offsets(edge)
    assert wide_offsets(torch.empty(2**16, 2**15 + 1, device="meta"))
    assert wide_offsets(edge, torch.empty(2**31 + 1, device="meta"))
    # a view's offsets count, not its element count: every other row of a wide buffer
    assert wide_offsets(torch.empty(2**16, 2**16, device="meta")[::2, :4])
    assert not wide_offsets(torch.empty(0, 2**40, device="meta"), None)
    assert not wide_offsets(torch.empty(2**20, 2**20, device="meta").expand(2**20, 2**20)[:1])


class _Spy:
    """Wraps a JIT function: records the WIDE each launch passes, then launches it."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.wide: list[bool] = []

    def __getitem__(self, grid: Any) -> Any:
        launch = self.fn[grid]

        def run(*args: Any, **kwargs: Any) -> Any:
            self.wide.append(bool(kwargs["WIDE"]))
            return launch(*args, **kwargs)

        return run


def _force(monkeypatch: pytest.MonkeyPatch, module: Any, on: bool) -> None:
    if on:
        monkeypatch.setattr(module, "wide_offsets", lambda *tensors: True)


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("split_k", [1, 2])
def test_matmul_and_int8(monkeypatch: pytest.MonkeyPatch, wide: bool, split_k: int) -> None:
    from tuner.kernels import _matmul_triton as mm

    main, reduce = _Spy(mm._matmul_kernel), _Spy(mm._splitk_reduce_kernel)
    monkeypatch.setattr(mm, "_matmul_kernel", main)
    monkeypatch.setattr(mm, "_splitk_reduce_kernel", reduce)
    _force(monkeypatch, mm, wide)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(37, 40, generator=gen)
    b = torch.randn(40, 21, generator=gen)
    bias = torch.randn(21, generator=gen)
    cfg: dict[str, Any] = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, SPLIT_K=split_k, num_warps=1)
    got = mm.matmul(a, b, bias, "relu", **cfg)
    np.testing.assert_allclose(got.numpy(), torch.relu(a @ b + bias).numpy(), rtol=1e-4, atol=1e-4)
    w8 = torch.randint(-127, 128, (40, 21), generator=gen, dtype=torch.int8)
    scale = torch.rand(21, generator=gen)
    got8 = mm.int8_matmul(a, w8, scale, **cfg)
    np.testing.assert_allclose(got8.numpy(), ((a @ w8.float()) * scale).numpy(), rtol=1e-4, atol=1e-3)
    assert set(main.wide) == {wide} and len(main.wide) == 2
    assert reduce.wide == ([wide, wide] if split_k > 1 else [])


@pytest.mark.parametrize("wide", [False, True])
def test_moe_gemm(monkeypatch: pytest.MonkeyPatch, wide: bool) -> None:
    from tuner.kernels import _moe_triton as moe

    spy = _Spy(moe._moe_kernel)
    monkeypatch.setattr(moe, "_moe_kernel", spy)
    _force(monkeypatch, moe, wide)
    gen = torch.Generator().manual_seed(1)
    sizes = torch.tensor([5, 0, 19], dtype=torch.int32)
    x = torch.randn(24, 32, generator=gen)
    w = torch.randn(3, 32, 20, generator=gen)
    got = moe.moe_gemm(x, w, sizes, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_warps=1)
    want = torch.cat([x[:5] @ w[0], x[5:] @ w[2]])
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)
    assert spy.wide == [wide]


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("single", [False, True])
def test_norms(monkeypatch: pytest.MonkeyPatch, wide: bool, single: bool) -> None:
    from tuner.kernels import norms

    spies = {k: _Spy(v) for k, v in norms._triton_kernels().items()}
    monkeypatch.setattr(norms, "_triton_kernels", lambda: spies)
    _force(monkeypatch, norms, wide)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(11, 48, generator=gen)
    w, b = torch.randn(48, generator=gen), torch.randn(48, generator=gen)
    cfg: dict[str, Any] = dict(BLOCK_N=64 if single else 16, ROWS_PER_PROGRAM=2, num_warps=1)
    xn = x.numpy()
    np.testing.assert_allclose(norms.softmax_triton(x, **cfg).numpy(), norms.softmax_reference(xn), atol=1e-5)
    np.testing.assert_allclose(
        norms.rmsnorm_triton(x, w, **cfg).numpy(), norms.rmsnorm_reference(xn, w.numpy()), atol=1e-4
    )
    np.testing.assert_allclose(
        norms.layernorm_triton(x, w, b, **cfg).numpy(),
        norms.layernorm_reference(xn, w.numpy(), b.numpy()),
        atol=1e-4,
    )
    assert [spy.wide for spy in spies.values()] == [[wide]] * 3


@pytest.mark.parametrize("wide", [False, True])
def test_attention(monkeypatch: pytest.MonkeyPatch, wide: bool) -> None:
    from tuner.kernels import attention

    spy = _Spy(attention._triton_kernel())
    monkeypatch.setattr(attention, "_triton_kernel", lambda: spy)
    _force(monkeypatch, attention, wide)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 20, 64, generator=gen) for _ in range(3))
    cfg: dict[str, Any] = dict(causal=True, BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1)
    got = attention.flash_attention_triton(q, k, v, **cfg)
    want = attention.attention_reference(q.numpy(), k.numpy(), v.numpy(), causal=True)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
    assert spy.wide == [wide]


def _gpu_with(gib: float) -> bool:
    from tuner.kernels._common import on_gpu

    if not on_gpu():
        return False
    free, _ = torch.cuda.mem_get_info()
    return bool(free >= gib * 2**30)


@pytest.mark.gpu
@pytest.mark.skipif(
    not _gpu_with(20),
    reason="needs a CUDA GPU with TRITON_INTERPRET=0 and 20 GiB free (tensors past 2**31 elements); the "
    "CPU twins above run every kernel's int64 path on small inputs",
)
def test_rows_past_int32_on_gpu() -> None:
    """Softmax and RMSNorm over 2**19 + 64 rows of 4096 fp16 (4.3 GB): the last rows lie past 2**31
    elements. Before WIDE their offsets wrapped (an illegal address, or other rows read)."""
    from tuner.kernels import norms

    rows, n = 2**19 + 64, 4096
    x = torch.randn(rows, n, device="cuda", dtype=torch.float16)
    w = torch.randn(n, device="cuda", dtype=torch.float16)
    tail = slice(rows - 128, rows)
    got = norms.softmax_triton(x, BLOCK_N=4096, num_warps=8)
    torch.testing.assert_close(got[tail], torch.softmax(x[tail].float(), -1).half(), rtol=2e-2, atol=1e-3)
    del got
    got = norms.rmsnorm_triton(x, w, BLOCK_N=4096, num_warps=8)
    xt = x[tail].float()
    want = xt * torch.rsqrt((xt * xt).mean(-1, keepdim=True) + 1e-6) * w.float()
    torch.testing.assert_close(got[tail].float(), want, rtol=2e-2, atol=2e-2)
