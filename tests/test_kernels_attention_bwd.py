"""Flash attention backward on Triton (kernels/attention_bwd.py) under the CPU interpreter: the kernel
against the float64 gradient of the reference (causal and not, S not divisible by the blocks, B and H > 1,
fp32 / fp16 / bf16), torch autograd through `tuner.kernel("flash_attention", backend="triton")` against
torch's own autograd of the reference, the backward being the Triton kernel (no S x S tensor saved), and
its configs tuned and stored under a key of its own."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from tuner.kernels import attention_bwd, get_kernel
from tuner.kernels._common import to_numpy
from tuner.kernels.attention import attention_reference, flash_attention_triton
from tuner.search_spaces import devices

import tuner

torch = pytest.importorskip("torch")

BWD = "flash_attention_bwd"


def _problem(**kw: Any) -> dict[str, Any]:
    return {"B": 2, "H": 2, "S": 37, "D": 64, "causal": True, "dtype": "float32", **kw}


@pytest.mark.parametrize(
    ("causal", "dtype", "config"),
    [
        (True, "float32", {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 1, "num_stages": 1}),
        (False, "float32", {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 2, "num_stages": 2}),
        (True, "float16", {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 3}),
        (False, "float16", {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1}),
        (True, "bfloat16", {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 2, "num_stages": 2}),
    ],
)
def test_backward_kernel_matches_the_reference_gradient(causal: bool, dtype: str, config: dict) -> None:
    spec = get_kernel(BWD)
    problem = _problem(causal=causal, dtype=dtype)
    assert not spec.space(problem, devices.CPU, "triton").violations(config)
    inputs = spec.make_inputs(problem, "triton", 0)
    assert spec.output_buffer == "grads" and torch.isnan(inputs["grads"]).all()
    out = to_numpy(spec.run(problem, "triton", inputs, config))
    ref = spec.reference(problem, inputs)
    assert out.shape == ref.shape == (3, 2, 2, 37, 64)
    assert not np.isnan(out).any(), f"{int(np.isnan(out).sum())} gradient elements not written"
    rtol, atol = spec.tolerance(dtype)
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol, err_msg=f"{problem} {config}")


def test_grad_reference_is_torch_autograd_of_the_reference() -> None:
    rng = np.random.default_rng(3)
    q, k, v, do = (rng.standard_normal((2, 2, 11, 64)) for _ in range(4))
    for causal in (True, False):
        got = attention_bwd.attention_grad_reference(q, k, v, do, causal=causal, sm_scale=0.2)
        t = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
        o = torch.nn.functional.scaled_dot_product_attention(*t, is_causal=causal, scale=0.2)
        o.backward(torch.tensor(do))
        for i in range(3):
            np.testing.assert_allclose(got[i], t[i].grad.numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(
            o.detach().numpy(), attention_reference(q, k, v, causal=causal, sm_scale=0.2)
        )


def test_forward_lse_rows_leave_the_output_unchanged() -> None:
    spec = get_kernel("flash_attention")
    problem = _problem(S=37, causal=True)
    inputs = spec.make_inputs(problem, "triton", 0)
    q, k, v = (inputs[n] for n in ("q", "k", "v"))
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1}
    plain = flash_attention_triton(q, k, v, causal=True, **cfg)
    lse = torch.full((2, 2, 37), float("nan"))
    saving = flash_attention_triton(q, k, v, causal=True, lse=lse, **cfg)
    assert torch.equal(plain, saving)
    want = attention_bwd._lse_rows(q.double().numpy(), k.double().numpy(), True, None)
    np.testing.assert_allclose(lse.numpy(), want, rtol=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match="lse must be a contiguous float32"):
        flash_attention_triton(q, k, v, causal=True, lse=torch.empty(2, 2, 36), **cfg)


def _leaf_inputs(problem: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    inputs = get_kernel("flash_attention").make_inputs(problem, "triton", seed)
    for n in ("q", "k", "v"):
        inputs[n].requires_grad_(True)
    return inputs


def _torch_grads(inputs: dict[str, Any], problem: dict[str, Any], grad: Any) -> list[Any]:
    """torch autograd of the reference in float64 on the very (rounded) inputs the kernel gets."""
    t = [inputs[n].detach().double().requires_grad_(True) for n in ("q", "k", "v")]
    scale = problem.get("sm_scale") or 1 / math.sqrt(problem["D"])
    o = torch.nn.functional.scaled_dot_product_attention(*t, is_causal=problem["causal"], scale=scale)
    o.backward(grad.double())
    return [x.grad for x in t]


@pytest.mark.parametrize(
    "problem",
    [
        _problem(causal=True),
        _problem(causal=False, S=45, sm_scale=0.3),
        _problem(causal=True, dtype="float16", B=1, H=3, S=29),
        _problem(causal=False, dtype="float16", S=33),
    ],
)
def test_torch_autograd_through_tuner_kernel(problem: dict[str, Any]) -> None:
    f = tuner.kernel("flash_attention", backend="triton", mode="offline", storage=False)
    inputs = _leaf_inputs(problem)
    with torch.no_grad():  # no autograd: the plain launcher, the same output
        plain = f(problem, {**inputs, "out": inputs["out"].clone()}).clone()
    y = f(problem, inputs)
    assert y.grad_fn is not None and y is not inputs["out"]
    assert torch.equal(y.detach(), plain) and torch.equal(inputs["out"], plain)
    grad = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(y.dtype)
    y.backward(grad)
    want = _torch_grads(inputs, problem, grad)
    rtol, atol = get_kernel(BWD).tolerance(problem["dtype"])
    for n, w in zip("qkv", want, strict=True):
        g = inputs[n].grad
        assert g is not None and g.dtype == inputs[n].dtype and g.shape == inputs[n].shape
        np.testing.assert_allclose(
            g.double().numpy(), w.numpy(), rtol=rtol, atol=atol, err_msg=f"d{n} {problem}"
        )


def test_sum_loss_and_a_grad_for_one_input_only() -> None:
    """`out.sum()` hands back a stride-0 gradient; only k requires grad."""
    problem = _problem(causal=False, S=20, B=1, H=1)
    f = tuner.kernel("flash_attention", backend="triton", mode="offline", storage=False)
    inputs = get_kernel("flash_attention").make_inputs(problem, "triton", 2)
    inputs["k"].requires_grad_(True)
    f(problem, inputs).sum().backward()
    _, dk, _ = _torch_grads(inputs, problem, torch.ones(1, 1, 20, 64))
    np.testing.assert_allclose(inputs["k"].grad.numpy(), dk.numpy(), rtol=2e-4, atol=2e-4)
    assert inputs["q"].grad is None and inputs["v"].grad is None


def test_the_backward_is_the_triton_kernel_and_saves_no_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []
    launcher = attention_bwd.flash_attention_bwd_triton

    def counting(*args: Any, **kw: Any) -> Any:
        calls.append(kw)
        return launcher(*args, **kw)

    def no_reference(*args: Any, **kw: Any) -> Any:
        raise AssertionError("the backward ran the reference")

    monkeypatch.setattr(attention_bwd, "flash_attention_bwd_triton", counting)
    monkeypatch.setattr(attention_bwd, "attention_grad_reference", no_reference)
    problem = _problem(S=40)
    f = tuner.kernel("flash_attention", backend="triton", mode="offline", storage=False)
    inputs = _leaf_inputs(problem)
    y = f(problem, inputs)
    # what autograd keeps for the backward: Q, K, V, O (B, H, S, D) and the lse rows (B, H, S), no S x S
    saved = [tuple(t.shape) for t in y.grad_fn.saved_tensors]
    assert sorted(saved) == sorted([(2, 2, 40, 64)] * 4 + [(2, 2, 40)])
    assert not calls
    y.backward(torch.ones_like(y))
    assert len(calls) == 1 and calls[0]["causal"] is True
    assert f.backward is not None and f.backward().spec.name == BWD


def test_backward_configs_are_tuned_and_stored_under_their_own_key(tmp_path: Any) -> None:
    timed: list[int] = []

    def bench(call: Any) -> float:
        call()
        timed.append(1)
        return 1e-3 * len(timed)

    url = f"sqlite:///{tmp_path}/s.db"
    problem = _problem(S=24, B=1, H=1)
    f = tuner.kernel("flash_attention", backend="triton", budget=2, storage=url, bench=bench)
    f(problem, _leaf_inputs(problem)).sum().backward()
    bwd = f.backward()
    assert f.tuner.stats["tuned"] == 1 and bwd.tuner.stats["tuned"] == 1
    key = bwd.tuner.last_choice["key"]
    assert key["kernel"] == BWD and key != f.tuner.last_choice["key"]
    config = bwd.tuner.last_choice["config"]
    assert not get_kernel(BWD).space(problem, devices.CPU, "triton").violations(config)
    # a new process's kernel: both configs come from the store, nothing is tuned again
    g = tuner.kernel("flash_attention", backend="triton", budget=2, storage=url, bench=bench)
    n = len(timed)
    g(problem, _leaf_inputs(problem)).sum().backward()
    assert len(timed) == n
    assert g.tuner.stats["from_store"] == 1 and g.backward().tuner.stats["from_store"] == 1
    assert g.backward().tuner.last_choice["config"] == config


def test_gradcheck_in_float64() -> None:
    pytest.skip(
        "the Triton attention kernels take float16, bfloat16 and float32 only (no float64 path), so "
        "torch.autograd.gradcheck's float64 finite differences cannot run through them; the gradients "
        "are checked against torch autograd of the float64 reference instead"
    )


def test_backward_space() -> None:
    spec = get_kernel(BWD)
    big = {**_problem(S=4096, D=128, dtype="float16")}
    with pytest.raises(ValueError, match="unknown backend"):
        spec.space(big, devices.CPU, "cuda")
    huge = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3}
    sm80 = spec.space(big, devices.get_device("sm80"), "triton").violations(huge)
    assert any("shared memory" in r and "BLOCK_M=128" in r for r in sm80), sm80
    small = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}
    assert not spec.space(big, devices.get_device("sm90"), "triton").violations(small)
    cpu = spec.space(_problem(S=20), devices.CPU, "triton")
    assert all(c["BLOCK_M"] <= 32 and c["BLOCK_N"] <= 32 for c in cpu.enumerate())
    assert spec.flops(big) == 2.5 * get_kernel("flash_attention").flops(big)
