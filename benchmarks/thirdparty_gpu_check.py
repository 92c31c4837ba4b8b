"""GPU check of what tests/test_thirdparty_triton.py runs under the interpreter, where the interpreter
cannot show it: `kernel[grid](...)` returns the compiled kernel (FlagGems' libentry launches that
object on later calls), a triton.Config subclass's `all_kwargs()` reaches the compiled launch, a
deep-copied kernel and a `run` assigned to the instance work. Both decorators; prints one line each.

    python benchmarks/thirdparty_gpu_check.py   (exits 1 if the two differ, 2 without CUDA)
    TRITON_INTERPRET=1 python benchmarks/thirdparty_gpu_check.py --allow-cpu   (its CPU self-test; the
    interpreter's launch returns None, so the libentry step reports an error for both)
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tables import temp_tuner_home  # noqa: E402  (benchmarks/ is not a package)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--allow-cpu", action="store_true", help="without CUDA: the CPU self-test (interpreter)")
    args = ap.parse_args(argv)

    temp_tuner_home("tuner-gpucheck-")  # removed at exit, unless the caller set TUNER_HOME
    import torch
    import triton
    import triton.language as tl

    import tuner

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.allow_cpu:
        print("no CUDA device")
        return 2
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)"
    print("torch", torch.__version__, "triton", triton.__version__, name)

    class Scaled(triton.Config):
        def __init__(self, kwargs, scale=1, **opts):
            super().__init__(kwargs, **opts)
            self.scale = scale

        def __setstate__(self, state):  # triton.Config's keeps only its own fields (deepcopy goes through it)
            super().__setstate__(state)
            self.scale = state.get("scale", 1)

        def all_kwargs(self):
            return {
                **super().all_kwargs(),
                "SCALE": getattr(self, "scale", 1),
            }  # deepcopy hashes it half-built

    def bench(kernel_call, quantiles):
        kernel_call()
        return [1.0, 1.0, 1.0] if bench.n == 1 else [2.0, 2.0, 2.0]

    results = {}
    for name, autotune in (("triton", triton.autotune), ("tuner", tuner.autotune)):
        bench.n = 0

        def counting(kernel_call, quantiles):
            bench.n += 1
            return bench(kernel_call, quantiles)

        @autotune(
            configs=[Scaled({"BLOCK": 64}, scale=2), Scaled({"BLOCK": 128}, scale=3)],
            key=["N"],
            do_bench=counting,
        )
        @triton.jit
        def fill(dst, N, BLOCK: tl.constexpr, SCALE: tl.constexpr = 1):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(dst + offs, tl.full([BLOCK], BLOCK * SCALE, tl.float32), mask=offs < N)

        n = 1000
        dst = torch.zeros(n, device=device)
        grid = lambda m, n=n: (triton.cdiv(n, m["BLOCK"]),)  # noqa: E731
        first = fill[grid](dst, n)
        again = fill[grid](dst, n)
        out = [type(first).__name__, type(again).__name__, float(dst[0])]
        # libentry launches the returned kernel itself on later calls
        dst.zero_()
        try:
            again[(triton.cdiv(n, 128), 1, 1)](dst, n)
            out.append(float(dst[0]))
        except Exception as exc:  # noqa: BLE001 - reported, compared between the two
            out.append(type(exc).__name__)
        # triton 3.6's own autotuned kernel cannot be deep-copied once it has compiled on a GPU (its
        # device caches hold a lock): the outcome, value or error, is what the two must share
        try:
            twin = copy.deepcopy(fill)
            dst.zero_()
            twin[grid](dst, n)
            out.append(float(dst[0]))
        except Exception as exc:  # noqa: BLE001 - reported, compared between the two
            out.append(f"deepcopy: {type(exc).__name__}")
        out.append(bench.n)
        seen = []
        orig = fill.run
        fill.run = lambda *a, _s=seen, _o=orig, **kw: (_s.append(1), _o(*a, **kw))[1]
        fill[grid](dst, n)
        out.append(len(seen))
        if device == "cuda":
            torch.cuda.synchronize()
        results[name] = out
        print(name, out)
    ours, theirs = results["tuner"], results["triton"]
    # Where triton's own kernel fails to deep-copy (triton 3.6 on a GPU), tuner's may work: not a difference
    copy_at = 4
    if str(theirs[copy_at]).startswith("deepcopy:") and not str(ours[copy_at]).startswith("deepcopy:"):
        print(f"tuner's kernel deep-copies where triton's does not ({theirs[copy_at]})")
        ours = ours[:copy_at] + ours[copy_at + 1 :]
        theirs = theirs[:copy_at] + theirs[copy_at + 1 :]
    same = ours == theirs
    print("same" if same else "DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
