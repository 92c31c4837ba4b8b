"""Write the small store that tests/test_storage_migrations.py opens: a database written by the previous
release (schema version 1, main at commit 9afa98b), saved as an SQL text dump.

Run it with that release on the path, never with the current tree:

    git archive 9afa98b | tar -x -C /tmp/tuner-release1
    PYTHONPATH=/tmp/tuner-release1 python tests/data/make_store_release1.py tests/data/store_release1.sql

It records measurements, puts cache entries, holds a claim, registers, claims and finishes study tasks on
the board and runs a small Optuna study, all in one SQLite file, then dumps it (`sqlite3 .iterdump`).
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
from pathlib import Path


def main(out: str) -> None:
    import optuna

    from tuner.runtime._db import ConfigCache
    from tuner.runtime._entry import CacheEntry
    from tuner.runtime._key import CacheKey
    from tuner.store import ResultStore, TaskContext
    from tuner.studies._board import DONE, TaskBoard
    from tuner.studies._spec import StudyTask

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tuner.db"
        url = f"sqlite:///{path}"
        store = ResultStore(url)
        for i in range(6):
            task = TaskContext(
                kernel="matmul",
                problem={"M": 64 * (i % 3 + 1), "N": 64},
                device="cpu",
                versions={"triton": "3.7.1"},
            )
            store.record(
                task,
                "fp123",
                {"BLOCK": 16 * (i + 1)},
                1e-3 * (i + 1) if i != 4 else None,
                "ok" if i != 4 else "compile_error",
                stats={"duration_s": 0.5},
                error=None if i != 4 else "too much shared memory",
                study_name="s1" if i < 3 else None,
                trial_number=i,
                strategy="random",
                worker="w1",
            )
        cache = ConfigCache(store)
        for m in (64, 128, 256):
            key = CacheKey.make(
                "matmul", "0123abcd", {"M": m, "N": 64}, ["float32"], "cpu", {"triton": "3.7.1"}
            )
            cache.put(CacheEntry(key, {"BLOCK": m // 4}, 1e-4 * m, 1e-6, "2026-11-01T00:00:00Z", "fp123"))
        cache.claim("f" * 32, "oldhost:4242:abcd:1", 120.0)

        board = TaskBoard(url)
        tasks = [
            StudyTask(
                study="s1",
                key=f"matmul/M{m}",
                kernel="matmul",
                problem={"M": m, "dtype": "float32"},
                backend="triton",
                device="cpu",
                budget=4,
                time_budget_s=None,
                strategy="random",
                seed=0,
                seq=i,
            )
            for i, m in enumerate((64, 128))
        ]
        board.ensure(tasks)
        claim = board.claim("s1", "w1", 60.0)
        assert claim is not None
        board.finish(
            claim, DONE, result={"best_value": 0.5}, trials_done=4, best_value=0.5, best_config={"BLOCK": 16}
        )

        study = optuna.create_study(storage=store.optuna_storage(), study_name="s1/matmul")
        study.optimize(lambda t: t.suggest_int("BLOCK", 16, 64), n_trials=3)
        store.engine.dispose()
        board.close()

        con = sqlite3.connect(path)
        lines = list(con.iterdump())
        con.close()
    Path(out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out}: {len(lines)} statements")


if __name__ == "__main__":
    main(sys.argv[1])
