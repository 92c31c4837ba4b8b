"""Compile the part-B Triton kernels for sm80 / sm90 without a GPU and print the compiler's shared memory
and ptxas's register / spill counts beside the search spaces' estimates and verdicts.

Triton compiles to PTX and cubin on a machine with no GPU (the CUDA backend and ptxas ship in the wheel),
so this checks that the kernels build for real targets (the interpreter tests cannot) and how far the
resource estimates in search_spaces/ are from what the compiler allocates.

    PYTHONPATH=$PWD python benchmarks/triton_resources_b.py [--quick]

Each compile takes several seconds; --quick compiles one config per kernel and arch.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU, not the interpreter
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _ptxas_stats(ptx: str, arch: int) -> tuple[int, int]:
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    arch_flag = f"sm_{arch}a" if arch == 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx, encoding="utf-8")
        res = subprocess.run(
            [str(ptxas), f"-arch={arch_flag}", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
            capture_output=True,
            text=True,
            check=True,
            encoding="utf-8",
        )
    out = res.stdout + res.stderr
    regs = int(re.search(r"Used (\d+) registers", out).group(1))  # type: ignore[union-attr]
    spill = re.search(r"(\d+) bytes spill stores", out)
    return regs, int(spill.group(1)) if spill else 0


def _signature(fn: Any, constexprs: dict[str, Any]) -> dict[str, str]:
    """fp16 pointers, fp32 scale / eps, int32 sizes and strides, the rest constexpr."""
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*fp16"
        elif name in ("qk_scale", "eps"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def _compile(
    fn: Any, constexprs: dict[str, Any], arch: int, num_warps: int, num_stages: int
) -> tuple[int, int, int, float]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = _signature(fn, constexprs)
    # What Triton's launcher specializes on a real call: pointers and strides divisible by 16 (the tests'
    # and typical problems' strides are); without it loads cannot be vectorized and nothing is pipelined.
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(fn.arg_names)
        if name.endswith("_ptr") or (name.startswith("s") and signature[name] == "i32")
    }
    t0 = time.perf_counter()
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    c = triton.compile(
        src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps, "num_stages": num_stages}
    )
    regs, spill = _ptxas_stats(c.asm["ptx"], arch)
    return int(c.metadata.shared), regs, spill, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()

    from tuner.kernels.attention import _triton_kernel
    from tuner.kernels.norms import _triton_kernels
    from tuner.search_spaces import attention as att_space
    from tuner.search_spaces import devices
    from tuner.search_spaces import norms as norm_space

    dev = {80: devices.SM80, 90: devices.SM90}
    print(
        f"{'kernel':10s} {'arch':5s} {'config':44s} {'smem est':>9s} {'smem':>7s} {'regs est':>8s} "
        f"{'regs':>5s} {'spill B':>7s} {'space':>7s} {'s':>5s}"
    )

    # flash attention, fp16, D=128 and 64
    att_cfgs = [
        (128, 128, 64, 4, 1),
        (128, 128, 64, 4, 3),
        (128, 128, 128, 8, 3),
        (128, 128, 128, 8, 4),
        (128, 256, 64, 8, 5),
        (64, 128, 128, 8, 3),
        (64, 64, 64, 4, 2),
    ]
    if args.quick:
        att_cfgs = att_cfgs[:1]
    for arch in (80, 90):
        for d, bm, bn, nw, ns in att_cfgs:
            consts = {
                "D": d,
                "BLOCK_M": bm,
                "BLOCK_N": bn,
                "CAUSAL": True,
                "UPCAST": False,
                "PRECISION": "tf32",
            }
            cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": nw, "num_stages": ns}
            shared, regs, spill, dt = _compile(_triton_kernel(), consts, arch, nw, ns)
            prob = {"B": 1, "H": 1, "S": 4096, "D": d, "causal": True, "dtype": "float16"}
            ok = att_space.attention_space(prob, dev[arch], "triton").contains(cfg)
            print(
                f"{'attn':10s} sm{arch:<3d} {f'D={d} {cfg}':44s} {att_space.triton_smem_bytes(d, 'float16', cfg, f'sm{arch}'):9d} "
                f"{shared:7d} {att_space.triton_regs_per_thread(d, 'float16', cfg):8d} {regs:5d} {spill:7d} "
                f"{'valid' if ok else 'reject':>7s} {dt:5.1f}",
                flush=True,
            )

    # row kernels, fp16, multi-pass (N = 16384)
    row_cfgs = [(4096, 1, 8, 1), (2048, 4, 8, 3), (1024, 2, 4, 1)]
    if args.quick:
        row_cfgs = row_cfgs[:1]
    kernels = _triton_kernels()
    for arch in (80, 90):
        for kind in ("softmax", "rmsnorm", "layernorm"):
            for bn, rows, nw, ns in row_cfgs:
                consts = {"ROWS": rows, "BLOCK_N": bn, "SINGLE": False}
                cfg = {"BLOCK_N": bn, "ROWS_PER_PROGRAM": rows, "num_warps": nw}  # num_stages: not tuned
                shared, regs, spill, dt = _compile(kernels[kind], consts, arch, nw, ns)
                prob = {"M": 4096, "N": 16384, "dtype": "float16"}
                ok = norm_space.rowwise_space(kind, prob, dev[arch], "triton").contains(cfg)
                print(
                    f"{kind:10s} sm{arch:<3d} {str(cfg) + f' s={ns}':44s} "
                    f"{norm_space.triton_smem_bytes(kind, 16384, 'float16', cfg):9d} {shared:7d} "
                    f"{norm_space.triton_regs_per_thread(kind, cfg):8d} {regs:5d} {spill:7d} "
                    f"{'valid' if ok else 'reject':>7s} {dt:5.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
