"""Store and cache-file faults never reach the caller: a read-only home, a corrupt, truncated or locked
database, a full disk and an unusable cache file each degrade to memory and the other layers, with one
warning per cause, and the decorated call returns the right output every time (a store that is readable
but cannot be written is read: its entries still hit). And a stored entry that
the current space rules out is replaced by the new winner, so a narrowed space is re-tuned once.

The read-only and full-disk cases need mount (root); they skip, saying so, where it is not permitted.
Root ignores file permissions, so an unreadable file is made by other means (a directory, corrupt
bytes, a missing path) and a read-only home by a read-only bind mount."""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import tuner
from tuner import PowerOfTwo, SearchSpace
from tuner.runtime import CacheEntry, CacheKey, ConfigCache, write_cache_file
from tuner.runtime._sources import close_stores

SPACE = SearchSpace([PowerOfTwo("block", 16, 256)])
X = np.arange(8.0)


class Bench:
    """Runs the call once and reports a time that is lowest at block 64 (the call's config is read from
    the kernel's last run)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, call):
        self.calls += 1
        call()
        return 1e-3 * (1 + abs(np.log2(_last["block"]) - 6))


_last: dict[str, int] = {}


def make(space: SearchSpace = SPACE, **kw):
    bench = Bench()
    kw.setdefault("budget", 4)

    @tuner.autotune(space, key=["n"], bench=bench, **kw)
    def scale(x, n, *, block):
        _last["block"] = block
        return x * 2.0

    return scale, bench


def check_calls(f, ns) -> None:
    for n in ns:
        np.testing.assert_array_equal(f(X, n), X * 2.0)


def store_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "tuner.runtime._sources" and r.levelno >= logging.WARNING
    ]


@pytest.fixture(autouse=True)
def _fresh_stores() -> Iterator[None]:
    close_stores()
    yield
    close_stores()


@pytest.fixture
def mount() -> Iterator[Callable[..., None]]:
    """mount(args..., target): mount, or skip the test when mounting is not permitted here."""
    done: list[Path] = []

    def do(*args: str, target: Path) -> None:
        if shutil.which("mount") is None or os.geteuid() != 0:
            pytest.skip("this fault needs root and mount(8) to make the filesystem (not permitted here)")
        r = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True, encoding="utf-8")
        if r.returncode != 0:
            pytest.skip(f"mount is not permitted here ({r.stderr.strip()[:200]}); this fault needs it")
        if target not in done:
            done.append(target)

    yield do
    close_stores()
    for t in reversed(done):
        subprocess.run(["umount", "-l", str(t)], capture_output=True)


def _populate(home: Path, ns=(100,), **kw) -> None:
    """A store with tuned entries for `ns`, every connection closed and the WAL checkpointed; `kw` goes to
    make (strategy="random" fills a store of many keys without fitting each new key's model on the
    ones before)."""
    f, _ = make(**kw)
    check_calls(f, ns)
    close_stores()
    with sqlite3.connect(home / "tuner.db") as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()


def _both_modes(caplog) -> None:
    """Online and offline, stored and new keys, twice each: right output, no repeated warning."""
    for mode in ("online", "offline"):
        f, bench = make(mode=mode)
        check_calls(f, (100, 200, 300))
        calls = bench.calls
        check_calls(f, (100, 200, 300))  # hits: memory, whatever the store does
        assert bench.calls == calls
        if mode == "online":
            assert f.tuner.stats["tuned"] + f.tuner.stats["from_store"] == 3
    msgs = store_warnings(caplog)
    assert len(msgs) == len(set(msgs)), msgs  # one warning per cause


def test_read_only_home(tmp_path: Path, monkeypatch, caplog, capsys, mount):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("TUNER_HOME", str(home))
    _populate(home)
    before = (home / "tuner.db").read_bytes()
    mount("--bind", str(home), target=home)
    mount("-o", "remount,ro,bind", target=home)
    caplog.set_level(logging.WARNING)
    _stored_key_hits_read_only()
    _both_modes(caplog)
    assert store_warnings(caplog), "a store that cannot be written is worth one warning"
    assert (home / "tuner.db").read_bytes() == before
    # an empty read-only home: listing it finds nothing (reading makes no store); no store can be created
    # there to import into, and the CLI says why in one line (exit 1)
    from tuner.cli import main

    empty = tmp_path / "empty"
    empty.mkdir()
    mount("--bind", str(empty), target=empty)
    mount("-o", "remount,ro,bind", target=empty)
    monkeypatch.setenv("TUNER_HOME", str(empty))
    capsys.readouterr()
    assert main(["cache", "show"]) == 0
    assert "no cached entries" in capsys.readouterr().out
    shipped = (
        Path(__file__).resolve().parent.parent / "docs" / "examples" / "quickstart-report" / "cache.json"
    )
    assert main(["cache", "import", str(shipped)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"folder {empty} cannot be written" in err, err
    # a home that does not exist yet under a read-only directory cannot even be created
    monkeypatch.setenv("TUNER_HOME", str(home / "missing" / "home"))
    f, _ = make()
    check_calls(f, (100, 200))
    assert any("home cannot be used" in m or "cannot be opened" in m for m in store_warnings(caplog))


def _stored_key_hits_read_only() -> None:
    """The entries of a store that cannot be written (a read-only mount, a store shipped in an image)
    still hit, in every mode; a new key is tuned in memory."""
    for mode in ("offline", "record", "online"):
        close_stores()
        f, bench = make(mode=mode)
        check_calls(f, (100,))
        assert f.tuner.stats["from_store"] == 1 and bench.calls == 0, (mode, f.tuner.stats)
    check_calls(f, (200,))
    assert f.tuner.stats["tuned"] == 1
    close_stores()


def test_store_in_a_folder_that_cannot_be_written(_tuner_home: Path, monkeypatch, caplog):
    """What a read-only mount does, without mount(8): the folder reports itself not writable and SQLite
    cannot create its WAL files beside the database (here: a folder in the way of the `-wal` file)."""
    _populate(_tuner_home)
    db = _tuner_home / "tuner.db"
    before = db.read_bytes()
    (_tuner_home / "tuner.db-wal").mkdir()  # SQLite cannot open the WAL database in the usual way now
    real_access = os.access
    home = str(_tuner_home)
    monkeypatch.setattr(
        "tuner.storage._engine.os.access",
        lambda p, mode, **kw: False if str(p) == home else real_access(p, mode, **kw),
    )
    caplog.set_level(logging.WARNING)
    _stored_key_hits_read_only()
    assert db.read_bytes() == before
    msgs = store_warnings(caplog)
    assert len(msgs) == 1 and "readonly database" in msgs[0], msgs
    # the CLI reads it too; a write is refused as a failure (exit 1), the store unchanged
    from tuner.cli import main

    out = _tuner_home.parent / "exported.json"
    assert main(["cache", "export", "--out", str(out)]) == 0
    assert main(["cache", "import", str(out), "--prefer-import"]) == 1
    assert db.read_bytes() == before


def test_corrupt_db(_tuner_home: Path, caplog):
    junk = b"this is not a database, " * 400
    (_tuner_home / "tuner.db").write_bytes(junk)
    caplog.set_level(logging.WARNING)
    _both_modes(caplog)
    assert any(f"store {_tuner_home / 'tuner.db'} is corrupt" in m for m in store_warnings(caplog))
    assert (_tuner_home / "tuner.db").read_bytes() == junk  # never overwritten: data is not ours to drop


def test_truncated_db(_tuner_home: Path, caplog):
    _populate(_tuner_home, ns=range(100, 140), strategy="random")
    db = _tuner_home / "tuner.db"
    size = db.stat().st_size
    with open(db, "r+b") as fh:
        fh.truncate(size // 2)
    caplog.set_level(logging.WARNING)
    _both_modes(caplog)
    assert store_warnings(caplog)


def test_locked_db(_tuner_home: Path, caplog):
    _populate(_tuner_home)
    db = _tuner_home / "tuner.db"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE')\n"
            "print('locked', flush=True)\n"
            "time.sleep(2.0)\n"
            "c.execute('COMMIT')\n",
            str(db),
        ],
        stdout=subprocess.PIPE,
        text=True,
        encoding="utf-8",
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        caplog.set_level(logging.WARNING)
        off, bench = make(mode="offline")
        check_calls(off, (100, 555))  # reads are not blocked by a writer (WAL)
        assert off.tuner.stats["from_store"] == 1 and bench.calls == 0
        on, bench = make()
        check_calls(on, (100, 777))  # a new key waits for the lock, then tunes and stores
        assert on.tuner.stats["from_store"] == 1 and on.tuner.stats["tuned"] == 1
    finally:
        holder.wait(timeout=60)
    assert {e.key.fields_dict["n"] for e in ConfigCache().entries()} == {100, 777}
    assert not store_warnings(caplog)


def test_a_lock_held_past_the_timeout_pauses_writes_instead_of_waiting_per_key(
    _tuner_home: Path, caplog, monkeypatch
):
    """Another process holds the SQLite write lock for long: the first new key waits out the busy
    timeout and tunes in memory; the next new keys do not wait it out again (writes are paused for
    STORE_RETRY_S; was: every new key waited the whole timeout, 60 s by default, before tuning), and
    once the pause is over and the lock free, winners are stored again."""
    import tuner.runtime._sources as sources
    import tuner.storage._engine as engine

    _populate(_tuner_home)
    monkeypatch.setattr(engine, "SQLITE_TIMEOUT_S", 1)
    claims: list[int] = []
    real_claim = ConfigCache.claim

    def claim(self, *a, **kw):
        claims.append(1)
        return real_claim(self, *a, **kw)

    monkeypatch.setattr(ConfigCache, "claim", claim)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE')\n"
            "print('locked', flush=True)\n"
            "sys.stdin.readline()\n"
            "c.execute('COMMIT')\n",
            str(_tuner_home / "tuner.db"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        encoding="utf-8",
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        caplog.set_level(logging.WARNING)
        on, bench = make()
        check_calls(on, (100, 201, 202, 203))  # a stored key, then three new ones
        assert on.tuner.stats["from_store"] == 1 and on.tuner.stats["tuned"] == 3
        assert len(claims) == 1, f"{len(claims)} writes waited out the lock, one was enough"
        assert any("not written to for" in w for w in store_warnings(caplog)), store_warnings(caplog)
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=60)
    monkeypatch.setattr(sources, "STORE_RETRY_S", 0.0)  # the pause is over
    check_calls(on, (204,))
    assert {e.key.fields_dict["n"] for e in ConfigCache().entries()} == {100, 204}


@pytest.mark.parametrize("size", ["64k", "1m"])  # 64k: the schema does not fit; 1m: it does, then fills
def test_full_disk(tmp_path: Path, monkeypatch, caplog, mount, size):
    home = tmp_path / "small"
    home.mkdir()
    mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", target=home)
    monkeypatch.setenv("TUNER_HOME", str(home))
    caplog.set_level(logging.WARNING)
    f, _ = make()
    check_calls(f, range(1, 9))
    # fill what is left, then go on: every write fails
    try:
        with open(home / "filler", "wb") as fh:
            while True:
                fh.write(b"\0" * 4096)
                fh.flush()
    except OSError:
        pass
    check_calls(f, range(9, 17))
    g, _ = make()
    check_calls(g, range(1, 20))
    off, _ = make(mode="offline")
    check_calls(off, range(1, 30))
    msgs = store_warnings(caplog)
    assert msgs and len(msgs) == len(set(msgs)), msgs


def test_unusable_cache_file(tmp_path: Path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    good = tmp_path / "good.json"
    key = CacheKey.make("k", "ab" * 16, {"n": 1}, [], "cpu", {})
    write_cache_file(good, [CacheEntry(key, {"block": 16}, 1e-3, 0.0)])
    truncated = tmp_path / "truncated.json"
    truncated.write_bytes(good.read_bytes()[:40])
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_bytes(b"\xff\xfe" * 100)
    for bad in (tmp_path / "missing.json", tmp_path, truncated, corrupt):
        monkeypatch.setenv("TUNER_CACHE_FILE", str(bad))
        for mode in ("offline", "online"):
            f, _ = make(mode=mode)
            check_calls(f, (1, 2))
        g, _ = make(mode="offline", cache=bad)  # the function's own file: skipped, not raised
        check_calls(g, (3,))
        # this file's warnings, not those of the files in it (tmp_path is a folder, and a path of each)
        mine = [m for m in store_warnings(caplog) if f"{bad}:" in m or f"{bad} is" in m]
        assert 1 <= len(mine) <= 2, mine  # once for TUNER_CACHE_FILE, once for cache=


# ---- stale entries are replaced ---------------------------------------------------------------------------
def test_narrowed_space_retunes_once_then_hits():
    wide, bench = make()
    check_calls(wide, (100,))
    [e] = ConfigCache().entries()
    assert e.config == {"block": 64}
    narrow_space = SearchSpace([PowerOfTwo("block", 128, 256)])  # 64 is no longer allowed
    narrow, bench = make(narrow_space)
    check_calls(narrow, (100,))
    assert narrow.tuner.stats["tuned"] == 1 and bench.calls == 2
    assert "not in the current search space" in (narrow.tuner.last_miss_reason or "")
    [e] = ConfigCache().entries()
    assert e.config == {"block": 128}  # replaced, although the old entry's time was lower
    for _ in range(3):  # every later process start: a store hit, no tuning
        again, bench = make(narrow_space)
        check_calls(again, (100,))
        assert again.tuner.stats["from_store"] == 1 and bench.calls == 0


def test_stale_versions_retune_once_then_hit():
    f, _ = make()
    ck = f.tuner.full_key((X, 100), {})
    old = CacheKey.make(ck.kernel, ck.source_hash, ck.fields_dict, ck.dtypes, ck.device, {"numpy": "0.1"})
    ConfigCache().put(CacheEntry(old, {"block": 16}, 1e-9, 0.0))
    check_calls(f, (100,))
    assert f.tuner.stats["tuned"] == 1 and "versions differ" in (f.tuner.last_miss_reason or "")
    again, bench = make()
    check_calls(again, (100,))
    assert again.tuner.stats["from_store"] == 1 and bench.calls == 0
    assert again.tuner.last_choice["config"] == {"block": 64}


def test_unreachable_server(caplog):
    caplog.set_level(logging.WARNING)
    for mode in ("online", "offline"):  # nothing listens on port 9: the connection is refused
        f, _ = make(mode=mode, storage="postgresql://postgres@127.0.0.1:9/test")
        check_calls(f, (1, 2))
    msgs = store_warnings(caplog)
    assert len(msgs) == 1 and "cannot be opened" in msgs[0], msgs


def test_explain_says_when_the_store_could_not_be_read(tmp_path: Path) -> None:
    """`f.explain(x)` with the store unreachable said "miss: no cached entry ..." (or "no entry for key
    ...", with a shipped file) as though the store had been read and held nothing for the key."""
    off, _ = make(mode="offline", storage="postgresql://postgres:SECRET@127.0.0.1:9/test")
    why = off.explain(X, 1)
    assert why.startswith("miss: ") and "store postgresql://127.0.0.1:9/test could not be read" in why, why
    assert "SECRET" not in why
    # a store that opened, then failed a read (its table gone): the same
    db = tmp_path / "s.db"
    f, _ = make(storage=f"sqlite:///{db}")
    check_calls(f, (1,))
    assert "could not be read" not in f.explain(X, 2)  # read: it holds another key
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE tuner_cache_entries")
    why = f.explain(X, 2)
    assert why.startswith("miss: ") and f"store sqlite:///{db} could not be read" in why, why


def test_server_that_never_answers(caplog, monkeypatch):
    """A PostgreSQL URL whose server accepts the TCP connection but never answers (a hung server, a proxy
    whose backend is gone): libpq would wait for ever; the call takes the fallback after the connect
    timeout instead."""
    import socket
    import threading

    import tuner.storage._engine as engine_mod

    monkeypatch.setattr(engine_mod, "PG_CONNECT_TIMEOUT_S", 1, raising=False)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # the kernel completes the handshakes; nobody ever reads or answers
    port = listener.getsockname()[1]
    caplog.set_level(logging.WARNING)
    done: list[str] = []

    def calls() -> None:
        for mode in ("offline", "online"):
            close_stores()
            f, _ = make(mode=mode, storage=f"postgresql://postgres@127.0.0.1:{port}/test")
            check_calls(f, (1, 2))
            done.append(mode)

    worker = threading.Thread(target=calls, daemon=True)
    try:
        worker.start()
        worker.join(timeout=30)
        assert not worker.is_alive(), "a decorated call hung on a server that does not answer"
    finally:
        listener.close()
    assert done == ["offline", "online"]
    msgs = store_warnings(caplog)
    assert msgs and all("timeout expired" in m for m in msgs), msgs


def test_a_read_that_timed_out_stops_using_the_store_for_a_while(_tuner_home: Path, monkeypatch, caplog):
    """A read that waited out the store's timeout (a stuck PostgreSQL server) is not repeated by every
    next call: the store is left alone for STORE_RETRY_S, then opened again."""
    import tuner.runtime._sources as sources
    from tuner.store import StoreTimeout

    db = sources.open_store(None, create=True)
    assert db is not None

    def stuck() -> None:
        raise StoreTimeout("store sqlite:///x: read an entry ran past 60 s (synthetic)")

    caplog.set_level(logging.WARNING)
    assert sources.guarded(db, "read", "read an entry", stuck, "fallback") == "fallback"
    assert any("not used for 30 s" in w for w in store_warnings(caplog)), store_warnings(caplog)
    assert sources.open_store(None, create=True) is None  # left alone meanwhile
    monkeypatch.setattr(sources, "STORE_RETRY_S", 0.0)
    assert sources.open_store(None, create=True) is not None  # and opened again after


def test_an_untimed_choice_names_its_own_miss_reason_not_another_threads() -> None:
    # `_offline_choice` read the miss reason back from `.tuner.last_miss_reason` after the chain had run:
    # another thread's miss of the same function in between (here: while the cost model is asked) wrote
    # its own there, and this call's note said why that other key missed.
    import threading

    seen: list[int] = []

    def hook(name: str, key: CacheKey, space: SearchSpace) -> None:
        if key.fields_dict["n"] == 2 and not seen:
            seen.append(2)
            other = threading.Thread(
                target=f.tuner._offline_choice, args=((X, 3), {}, f.tuner.fn, "not timed")
            )
            other.start()
            other.join()

    f, _ = make(cost_model=hook)
    f(X.astype(np.float32), 1)  # an entry of the kernel, of another family: no nearest key for float64
    f.tuner._offline_choice((X, 2), {}, f.tuner.fn, "not timed", unknown="unknown{reason}; {chosen}")
    why = f.tuner.last_choice["why"]
    assert seen and why.startswith("not timed; unknown (no entry for key {'n': 2}; "), why
    assert "'n': 3" not in why, why
    close_stores()


def test_a_store_opening_that_a_close_overtakes_keeps_nothing_and_opens_again(tmp_path: Path, monkeypatch):
    """`close_stores` runs while another thread is opening a store (outside `_dbs_lock`, under that store's
    own lock). Was: the close did not wait for it, and the opening registered its store and engine after
    the close, the one the close was meant to drop. Now that opening disposes of what it made and opens
    the store again: the caller gets a store made after the close, and the close does not wait for it."""
    import threading

    import tuner.runtime._db as db_mod
    import tuner.runtime._sources as sources
    from tuner.storage import sqlite_url

    url = sqlite_url(tmp_path / "s.db")
    started, release = threading.Event(), threading.Event()
    made: list[ConfigCache] = []

    class Held(ConfigCache):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)
            if len(made) == 1:  # the first opening stays in progress until the test releases it
                started.set()
                assert release.wait(30)

    monkeypatch.setattr(db_mod, "ConfigCache", Held)
    got: dict[str, object] = {}
    opener = threading.Thread(target=lambda: got.update(c=sources.open_store(url, create=True)))
    opener.start()
    try:
        assert started.wait(30)
        closer = threading.Thread(target=close_stores)
        closer.start()
        closer.join(10)
        assert not closer.is_alive()  # the close does not wait for the opening
    finally:
        release.set()
        opener.join(30)
    assert len(made) == 2, made  # opened again after the close
    assert got["c"] is made[1] and sources._dbs.get(url) is made[1], (got, made)
    assert sources.open_store(url, create=True) is made[1]


@pytest.mark.parametrize("op", ["read", "write"])
def test_a_step_whose_connection_cannot_be_made_stops_using_the_store_for_a_while(
    _tuner_home: Path, monkeypatch, caplog, op: str
) -> None:
    """An open store whose PostgreSQL server stops answering: each step's new connection waits out libpq's
    `connect_timeout` (10 s) and raises `StoreUnreachable`. Was: only a connection limit's refusal (a
    `StoreUnreachable` too) stopped the use of the store; after any other the next read and write of the
    same miss, and of every next miss, waited out `connect_timeout` again. Now the store is left alone for
    STORE_RETRY_S after the first, then opened again."""
    import tuner.runtime._sources as sources
    from tuner.store import StoreUnreachable

    db = sources.open_store(None, create=True)
    assert db is not None
    tries: list[str] = []

    def unanswered() -> None:
        tries.append(op)
        raise StoreUnreachable(
            "cannot connect to store postgresql+psycopg2://h:5432/db (reading an entry): timeout expired "
            "(connect_timeout=10 s); nothing was written (synthetic)"
        )

    caplog.set_level(logging.WARNING)
    assert sources.guarded(db, op, "read an entry", unanswered, "fallback") == "fallback"
    for then in ("read", "write"):
        assert sources.guarded(db, then, "a next step", unanswered, "fallback") == "fallback"
    assert tries == [op], tries  # the next steps did not try to connect
    assert any("not used for 30 s" in w for w in store_warnings(caplog)), store_warnings(caplog)
    assert sources.open_store(None, create=True) is None  # left alone meanwhile
    monkeypatch.setattr(sources, "STORE_RETRY_S", 0.0)
    assert sources.open_store(None, create=True) is not None  # and opened again after
