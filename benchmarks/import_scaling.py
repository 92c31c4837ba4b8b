"""Time per entry of `tuner cache import FILE` and of reading a cache file (`load_cache`, what
$TUNER_CACHE_FILE does at a process's first miss), as the file grows; with `--old CHECKOUT`, the same
calls on another checkout of tuner (the code before a change) in the same run.

For each size a cache file of that many entries of one kernel is written; it is imported into an empty
store ("into empty": every entry added), then a second file with the same keys, every other entry faster,
into that store ("into full": half replaced, half kept), through the CLI's own function (`tuner.cli.main`).
`load_cache` then reads the first file. Each code base runs in a child process of its own
(`PYTHONPATH` = this checkout or `--old`), which first imports a small file so that imports are not
timed. The sizes above `--old-max` are run on this checkout only.

`--pg ADMIN_URL` (a PostgreSQL server's URL with the right to create databases, e.g.
postgresql+psycopg2://postgres@127.0.0.1:5432/postgres) runs the imports on PostgreSQL too, each in a
database of its own, made for it and dropped after it.

Run: PYTHONPATH=. python benchmarks/import_scaling.py [--sizes 2000,10000,50000] [--old CHECKOUT]
     [--old-max 10000] [--pg ADMIN_URL]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tables import positive_int, positive_ints, temp_dir, temp_tuner_home  # noqa: E402  (benchmarks/ is not a package)

REPO = Path(__file__).resolve().parent.parent


def entries(n: int, faster_every_other: bool = False) -> list[Any]:
    from tuner.runtime import CacheEntry, CacheKey

    out = []
    for i in range(n):
        key = CacheKey.make(
            "bench.matmul",
            "ab" * 16,
            {"M": 64 * (i % 1000 + 1), "N": 128 * (i // 1000 + 1), "K": 4096, "causal": i % 2 == 0},
            ["float16", "float16"],
            "NVIDIA H100 80GB HBM3 (sm90)",
            {"python": "3.11", "torch": "2.11.0", "triton": "3.6.0"},
        )
        t = 1e-4 * (1 + i % 7)
        if faster_every_other:  # the second file: even entries faster (replaced), odd ones slower (kept)
            t *= 0.5 if i % 2 == 0 else 2.0
        cfg = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3, "GROUP": 8}
        out.append(CacheEntry(key, cfg, t, 1e-6, "2026-12-01T00:00:00Z", "bench"))
    return out


def cli_import(path: str, url: str) -> float:
    from tuner.cli import main

    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        rc = main(["cache", "import", path, "--storage", url])
    dt = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"tuner cache import {path} exited {rc}")
    return dt


def child(files: Sequence[str], urls: Sequence[str]) -> int:
    """Time the import of files[1] and files[2] into urls[1] (after a warm-up: files[0] into urls[0]) and
    load_cache of files[1]; print them as JSON."""
    from tuner.runtime import ConfigCache, load_cache

    cli_import(files[0], urls[0])
    load_cache(files[0])
    len(ConfigCache(urls[1]))  # the store's tables made before the clock starts
    t_empty = cli_import(files[1], urls[1])
    t_full = cli_import(files[2], urls[1])
    t0 = time.perf_counter()
    n = len(load_cache(files[1]))
    print(json.dumps({"empty": t_empty, "full": t_full, "load": time.perf_counter() - t0, "n": n}))
    return 0


@contextlib.contextmanager
def pg_database(admin_url: str) -> Iterator[str]:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"tuner_bench_import_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def run_child(code: Path, files: Sequence[Path], urls: Sequence[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", *map(str, files), "--urls", *urls]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, encoding="utf-8").stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--sizes", type=positive_ints, default="2000,10000,50000")
    ap.add_argument("--old", metavar="CHECKOUT", help="a checkout of tuner to time beside this one")
    ap.add_argument("--old-max", type=positive_int, default=10000, help="the largest size --old runs")
    ap.add_argument(
        "--pg", metavar="ADMIN_URL", help="also on PostgreSQL: a server URL that may create databases"
    )
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--urls", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child(a.child, a.urls)
    if a.old and not (Path(a.old) / "tuner" / "__init__.py").is_file():
        ap.error(f"--old {a.old}: not a checkout of tuner (no tuner/__init__.py)")
    temp_tuner_home("tuner-bench-")  # before tuner is imported; removed at exit, unless the caller set it
    from tuner.runtime import write_cache_file

    tmp = Path(temp_dir("tuner-import-"))
    warm = tmp / "warm.json"
    write_cache_file(warm, entries(20))
    codes = [("new", REPO)] + ([("old", Path(a.old).resolve())] if a.old else [])
    print(f"ms per entry; new: {REPO.name}" + (f", old: {Path(a.old).name}" if a.old else ""))
    print(f"{'entries':>8} {'store':>10} {'code':>4} {'into empty':>11} {'into full':>10} {'load_cache':>11}")
    for n in a.sizes:
        first, second = tmp / f"a{n}.json", tmp / f"b{n}.json"
        write_cache_file(first, entries(n))
        write_cache_file(second, entries(n, faster_every_other=True))
        for backend in ["sqlite"] + (["postgresql"] if a.pg else []):
            for label, code in codes:
                if label == "old" and n > a.old_max:
                    continue
                run = uuid.uuid4().hex[:6]
                warm_url = f"sqlite:///{tmp / f'warm_{run}.db'}"
                with contextlib.ExitStack() as stack:
                    if backend == "sqlite":
                        url = f"sqlite:///{tmp / f'{label}_{n}_{run}.db'}"
                    else:
                        url = stack.enter_context(pg_database(a.pg))
                    t = run_child(code, [warm, first, second], [warm_url, url])
                print(
                    f"{n:>8} {backend:>10} {label:>4} {t['empty'] / n * 1e3:11.3f} {t['full'] / n * 1e3:10.3f} "
                    f"{t['load'] / n * 1e3:11.3f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
