"""Per-call cost of the PostgreSQL client-side deadline (tuner/storage/_watchdog.py), beside its baseline.

Times `SELECT 1` round trips on two connections to the same server, one a plain psycopg2 connection and
one a `GuardedConnection` (what tuner's engines use: a clock read and an attribute write before each call,
a lock taken to clear it after, a watchdog thread that looks every eighth of the deadline), both with the
same `statement_timeout` option. Rounds alternate between the two so drift and load hit them alike; each
row prints the fastest and the median round, per call, in microseconds. A loopback round trip varies by
tens of microseconds with scheduling, more than the guard adds, so the script also times the guard's own
work alone: its wrapper (`_call`) around a no-op, against the no-op called directly (timeit, best of
repeats, in nanoseconds).

Run: PYTHONPATH=. python benchmarks/pg_guard_overhead.py [--dsn DSN] [--rounds R] [--calls N]
(default DSN: the local test server, `dbname=test host=127.0.0.1`).
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit

import psycopg2

from tuner.storage._watchdog import GuardedConnection, _call


def _round(conn: psycopg2.extensions.connection, calls: int) -> float:
    cur = conn.cursor()
    t0 = time.perf_counter()
    for _ in range(calls):
        cur.execute("SELECT 1")
        cur.fetchone()
    dt = time.perf_counter() - t0
    conn.rollback()
    return dt / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default="dbname=test host=127.0.0.1")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    opts = "-c statement_timeout=60000"
    plain = psycopg2.connect(args.dsn, options=opts)
    guarded = psycopg2.connect(args.dsn, options=opts, connection_factory=GuardedConnection)
    assert guarded.tuner_limit_s == 60.0, "the guard did not read the statement timeout"
    times: dict[str, list[float]] = {"plain psycopg2": [], "GuardedConnection": []}
    for _ in range(args.rounds):
        times["plain psycopg2"].append(_round(plain, args.calls))
        times["GuardedConnection"].append(_round(guarded, args.calls))
    print(f"SELECT 1 round trips, {args.rounds} alternating rounds of {args.calls} calls (us per call)")
    print(f"{'connection':<20} {'fastest round':>14} {'median round':>14}")
    for name, ts in times.items():
        print(f"{name:<20} {min(ts):>14.1f} {statistics.median(ts):>14.1f}")
    best = {k: min(v) for k, v in times.items()}
    print(
        f"guard cost, fastest rounds: {best['GuardedConnection'] - best['plain psycopg2']:+.1f} us per call"
    )

    def noop() -> None:
        return None

    n = 100_000
    direct = min(timeit.repeat(noop, number=n, repeat=7)) / n * 1e9
    wrapped = min(timeit.repeat(lambda: _call(guarded, "statement", noop), number=n, repeat=7)) / n * 1e9
    bare = min(timeit.repeat(lambda: noop(), number=n, repeat=7)) / n * 1e9  # the lambda's own call
    print(
        f"the guard's own work (best of 7 x {n}): a no-op {direct:.0f} ns, through a lambda {bare:.0f} ns, "
        f"through the guard {wrapped:.0f} ns: {wrapped - bare:+.0f} ns per wrapped call"
    )
    plain.close()
    guarded.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
