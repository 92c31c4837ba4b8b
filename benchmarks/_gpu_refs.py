"""Fast references on the GPU for benchmarks/gpu_validate.py's large problems (the kernels' own
references run on the host in float64, which takes minutes at these sizes). Module-level so that the
measurer's worker processes can import them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def matmul_reference_gpu(problem: Mapping[str, Any], inputs: Mapping[str, Any]) -> np.ndarray:
    """act(A @ B + bias) in float64 on the device, returned as float32 numpy."""
    import torch

    if problem.get("activation", "none") not in ("none", None):
        raise ValueError("matmul_reference_gpu supports activation='none' only")
    acc = inputs["a"].double() @ inputs["b"].double()
    if problem.get("bias"):
        acc = acc + inputs["bias"].double()[None, :]
    out = acc.float().cpu().numpy()
    del acc
    torch.cuda.empty_cache()
    return out


def attention_reference_gpu(problem: Mapping[str, Any], inputs: Mapping[str, Any]) -> np.ndarray:
    """softmax(Q K^T * scale [+ causal mask]) V in float32 on the device, one batch at a time."""
    import torch

    q, k, v = (inputs[n] for n in ("q", "k", "v"))
    b, h, s, d = q.shape
    scale = problem.get("sm_scale") or 1.0 / math.sqrt(d)
    out = torch.empty((b, h, s, d), dtype=torch.float32, device=q.device)
    mask = torch.ones((s, s), dtype=torch.bool, device=q.device).tril() if problem.get("causal") else None
    for i in range(b):
        scores = torch.matmul(q[i].float(), k[i].float().transpose(-1, -2)) * scale
        if mask is not None:
            scores.masked_fill_(~mask, float("-inf"))
        out[i] = torch.matmul(torch.softmax(scores, dim=-1), v[i].float())
        del scores
    res = out.cpu().numpy()
    del out
    torch.cuda.empty_cache()
    return res
