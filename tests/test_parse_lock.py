"""tuner parses Python source one thread at a time (`tuner._parse`): CPython 3.11's AST constructor keeps
its recursion depth in state the threads share, and two parses at once can fail with `SystemError: AST
constructor recursion depth mismatch` (python/cpython gh-106905). Seen in CI: four threads missed the cache
of one decorated function at once, each hashed its source, and one thread's call raised that SystemError."""

from __future__ import annotations

import ast
import threading
import time

import pytest

import tuner


def test_threads_that_miss_at_once_parse_the_source_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    real = ast.parse
    lock = threading.Lock()
    inside = [0]
    most = [0]

    def watched_parse(*args, **kwargs):
        source = args[0] if args else kwargs.get("source", "")
        if "def inc(" not in str(source):  # the stdlib's own parses (inspect.signature of a builtin)
            return real(*args, **kwargs)
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            time.sleep(0.05)  # long enough for another thread to enter, were it let in
            return real(*args, **kwargs)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(ast, "parse", watched_parse)

    @tuner.autotune(configs=[{"b": 1}, {"b": 2}], key=["n"], bench=lambda call: call() or 1e-3, storage=False)
    def inc(n, *, b):
        return n + b

    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        start.wait()
        try:
            inc(n)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in (10, 20, 30, 40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert most[0] >= 1, "the source was never parsed: the test checks nothing"
    assert most[0] == 1, f"{most[0]} threads parsed at once"


def test_restrictions_parse_through_the_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.search_spaces._restrictions import _Expr

    import tuner._parse as parse_mod

    calls: list[int] = []
    monkeypatch.setattr(parse_mod, "_LOCK", _Recording(calls))
    r = _Expr("a * b <= 4", ["a", "b"])
    assert calls, "a restriction was parsed without the lock"
    assert r.text == "a * b <= 4"


class _Recording:
    def __init__(self, calls: list[int]) -> None:
        self.calls = calls
        self.lock = threading.Lock()

    def __enter__(self) -> None:
        self.calls.append(1)
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()
