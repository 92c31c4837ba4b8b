"""The last step of the quickstart: a program that uses the tuned configs without ever tuning.

    tuner study run studies/quickstart.toml        # tune, report, export <output>/cache.json
    python studies/quickstart_use.py               # call each kernel offline with that file

For every task of the study it calls the registered kernel through the runtime cache, offline and with
no database (`tuner.kernel(name, backend, mode="offline", storage=False, cache=tuner.load_cache(file))`),
prints the config it picked and where from, and checks the output against the kernel's reference.
Exit status: 0 when every call was an exact cache hit with a correct output; 1 when a call fell back
(the file has no entry for it: a different device, versions or kernel source) or an output is wrong;
2 when the cache file is missing or unreadable.

Options: `python studies/quickstart_use.py [STUDY.toml] [--cache FILE]` (default: studies/quickstart.toml
and the cache file `tuner study run` wrote for it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("study", nargs="?", default=str(HERE / "quickstart.toml"), help="the study file")
    ap.add_argument("--cache", help="the exported cache file (default: <study output>/cache.json)")
    args = ap.parse_args(argv)

    from tuner.kernels import prepare_triton

    prepare_triton()  # the Triton interpreter on a machine without a GPU, before any kernel is defined

    from tuner.kernels import get_kernel
    from tuner.kernels._common import to_numpy

    import tuner
    from tuner.runtime import CacheFileError
    from tuner.studies import load_study

    spec = load_study(args.study)
    path = Path(args.cache) if args.cache else spec.output_dir / "cache.json"
    try:
        cache = tuner.load_cache(path)
    except (OSError, CacheFileError) as exc:
        print(
            f"cannot read the cache file {path}: {exc}\n(run `tuner study run {args.study}` first)",
            file=sys.stderr,
        )
        return 2
    print(f"cache: {path} ({len(cache)} entries)")

    bad = 0
    for task in spec.tasks:
        kspec = get_kernel(task.kernel)
        f = tuner.kernel(task.kernel, backend=task.backend, mode="offline", storage=False, cache=cache)
        problem = dict(task.problem)
        inputs = kspec.make_inputs(problem, task.backend, 0)
        out = f(problem, inputs)
        choice = f.tuner.last_choice
        hit = f.tuner.stats["from_file"] == 1 and f.tuner.stats["offline_fallback"] == 0
        rtol, atol = kspec.tolerance(task.dtype)
        ref = np.asarray(kspec.reference(problem, inputs), dtype=np.float64)
        got = np.asarray(to_numpy(out), dtype=np.float64)
        ok = got.shape == ref.shape and bool(np.allclose(got, ref, rtol=rtol, atol=atol))
        err = float(np.max(np.abs(got - ref))) if got.shape == ref.shape and got.size else float("nan")
        print(
            f"{task.kernel} [{task.backend}] {task.key}: config {choice['config']} -- "
            f"{'cache hit' if hit else 'NOT a cache hit'} ({choice['why']}); "
            f"output {'matches' if ok else 'DOES NOT match'} the reference (max abs error {err:.2e})"
        )
        if not hit:
            print(f"  why not: {f.tuner.last_miss_reason}", file=sys.stderr)
        bad += (not hit) + (not ok)
    print(
        "all calls used the exported configs and matched the references"
        if not bad
        else f"{bad} problem(s): see above"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
