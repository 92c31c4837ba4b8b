"""Device check of the runtime on a real Triton kernel: run it wherever a GPU is available (it also runs on
the CPU under the Triton interpreter, where it checks the same paths with the CPU timer).

Checks and prints: the device string in the key; which timer was chosen (do_bench on a GPU); that the
first call tunes and the second does not; the result is correct (restore= protects the in-place input);
the per-launch CPU-side cost of a hit against the plain launch and triton.autotune's hit; and that an
exported cache file loads read-only and serves the key offline without tuning.

Run: PYTHONPATH=. python benchmarks/runtime_device_check.py      (CPU: TRITON_INTERPRET=1 is set for you)
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tables import temp_tuner_home  # noqa: E402  (benchmarks/ is not a package)


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0]).parse_args(
        argv
    )  # --help; no options
    temp_tuner_home("tuner-devcheck-")  # removed at exit, unless the caller set TUNER_HOME
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # before any @triton.jit below
    import triton
    import triton.language as tl

    import tuner
    from tuner.runtime import ConfigCache, load_cache, write_cache_file

    dev = (
        "cuda"
        if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
        else "cpu"
    )
    n = 1 << 20 if dev == "cuda" else 4096
    configs = [
        triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((256, 2), (512, 4), (1024, 4), (2048, 8))
    ]

    def add_one_src(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1.0, mask=m)

    plain = triton.jit(add_one_src)
    tuned = tuner.autotune(configs=configs, key=["n"], budget=4, restore=["x_ptr"])(triton.jit(add_one_src))
    theirs = triton.autotune(configs=configs, key=["n"])(triton.jit(add_one_src))

    x = torch.zeros(n, device=dev)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)  # noqa: E731
    t0 = time.perf_counter()
    tuned[grid](x, n)
    t_tune = time.perf_counter() - t0
    ok = bool(torch.equal(x, torch.ones_like(x)))
    tuned[grid](x, n)
    ok2 = bool(torch.equal(x, torch.full_like(x, 2.0)))
    [entry] = ConfigCache().entries()
    raw = tuned.tuner._raw_timer((x, n), {}, entry.key.device)  # what the decorator timed with
    timer = getattr(raw, "__name__", type(raw).__name__)
    measured = ConfigCache().store.measurements(kernel=tuned.tuner.name)
    print(f"device in key: {entry.key.device!r}; versions {entry.key.versions_dict}; default timer: {timer}")
    print(
        f"first call tuned {len(measured)} configs in {t_tune:.2f}s -> {dict(entry.config)} "
        f"({entry.time_s * 1e6:.2f} us, spread {entry.spread_s * 1e6:.2f} us); result correct: {ok}; "
        f"second call did not tune: {tuned.tuner.stats['tuned'] == 1}, correct: {ok2}"
    )

    best = entry.config
    if dev == "cuda":
        theirs[grid](x, n)  # triton.autotune tunes its own cache on the first call
    else:  # its tuning needs a GPU driver; pre-populate its cache with our winner
        theirs.cache[(n, "torch.float32")] = next(
            c for c in configs if c.kwargs["BLOCK"] == best["BLOCK"] and c.num_warps == best["num_warps"]
        )

    def launches(f, reps):
        if dev == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            f()
        dt = time.perf_counter() - t
        if dev == "cuda":
            torch.cuda.synchronize()
        return dt / reps * 1e6

    reps = 2000 if dev == "cuda" else 20
    g_plain = plain[grid]
    g_ours = tuned[grid]
    g_theirs = theirs[grid]
    rows: dict[str, list[float]] = {"plain launch": [], "tuner.autotune hit": [], "triton.autotune hit": []}
    for _ in range(7):
        rows["plain launch"].append(
            launches(lambda: g_plain(x, n, BLOCK=best["BLOCK"], num_warps=best["num_warps"]), reps)
        )
        rows["tuner.autotune hit"].append(launches(lambda: g_ours(x, n), reps))
        rows["triton.autotune hit"].append(launches(lambda: g_theirs(x, n), reps))
    print(f"CPU-side time per launch ({dev}, {reps} launches x 7, median):")
    for k, v in rows.items():
        print(f"  {k:22s} {statistics.median(v):8.2f} us")

    f = os.path.join(os.environ["TUNER_HOME"], "shipped.json")
    write_cache_file(f, ConfigCache().entries())
    shipped = load_cache(f)
    prod = tuner.autotune(
        configs=configs, key=["n"], mode="offline", cache=shipped, storage=False, bench=lambda c: 1 / 0
    )(triton.jit(add_one_src))
    prod[grid](x, n)
    print(
        f"offline from shipped file: {prod.tuner.stats['from_file'] == 1 and prod.tuner.stats['tuned'] == 0}"
    )
    return 0 if ok and ok2 else 1


if __name__ == "__main__":
    sys.exit(main())
