"""The commands that only read a store (`tuner cache show`, `cache export`, `cache prune --dry-run`,
`study report`, `study export`) leave a store of an older tuner's schema as it is: they refuse it, one line
naming `tuner cache upgrade`, which upgrades it (docs/production.md, "Upgrading tuner on a fleet that shares
a store"). They used to upgrade it in place: a migration write by a command that only reads, after which
the older tuner still running beside it refused the store."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.test_storage_migrations import _release1_store
from tests.test_studies import FAKE, cli, write_study


def _revision(path: Path) -> str | None:
    con = sqlite3.connect(path)
    try:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "tuner_alembic_version" not in names:
            return None
        return con.execute("SELECT version_num FROM tuner_alembic_version").fetchone()[0]
    finally:
        con.close()


def _refused(capsys: pytest.CaptureFixture[str], command: str, *args: str) -> None:
    code = cli(*args)
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"`{command}` only reads a store, so it does not upgrade it" in err, err
    assert "run `tuner cache upgrade`" in err and len(err.strip().splitlines()) == 1, err


def test_cache_commands_that_only_read_leave_an_older_store_as_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _release1_store(tmp_path)
    db = tmp_path / "release1.db"
    before = db.read_bytes()
    out = tmp_path / "c.json"
    _refused(capsys, "tuner cache show", "cache", "show", "--storage", url)
    _refused(capsys, "tuner cache export", "cache", "export", "--out", str(out), "--storage", url)
    _refused(
        capsys,
        "tuner cache prune --dry-run",
        "cache",
        "prune",
        "--older-than",
        "0",
        "--dry-run",
        "--storage",
        url,
    )
    assert db.read_bytes() == before and not out.exists()

    assert cli("cache", "upgrade", "--storage", url) == 0
    assert "upgraded to this tuner's schema" in capsys.readouterr().out
    from tuner.storage import SCHEMA_REVISION

    assert _revision(db) == SCHEMA_REVISION
    assert cli("cache", "upgrade", "--storage", url) == 0
    assert "already at this tuner's schema" in capsys.readouterr().out

    # upgraded, it is read also where its folder cannot be written (once its last writer closed it, as the
    # command's process does when it ends)
    from tuner.storage import engine_of

    eng = engine_of(url)
    if eng is not None:
        eng.dispose()
    real_access = os.access
    monkeypatch.setattr(
        "tuner.storage._engine.os.access",
        lambda p, mode, **kw: False if str(p) == str(tmp_path) else real_access(p, mode, **kw),
    )
    assert cli("cache", "show", "--storage", url) == 0
    assert capsys.readouterr().out.strip().endswith("3 entries")


def _downgrade(url: str, revision: str) -> None:
    """The store as an older tuner left it: its schema migrated down to `revision`."""
    from alembic import command
    from alembic.config import Config

    from tuner.storage._migrate import MIGRATIONS_DIR

    eng = create_engine(url)
    try:
        with eng.begin() as conn:
            cfg = Config()
            cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, revision)
            assert conn.execute(text("SELECT version_num FROM tuner_alembic_version")).scalar() == revision
    finally:
        eng.dispose()


def test_study_report_and_export_leave_an_older_store_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.studies import load_study, run_study
    from tuner.studies._spec import normalize_url

    monkeypatch.chdir(tmp_path)
    study = write_study(tmp_path, n_m=1, budget=2)
    spec = load_study(study, check_kernels=False)
    run_study(spec, executor=FAKE)
    url = normalize_url(spec.storage)
    _downgrade(url, "0001")
    from tuner.storage import sqlite_path

    db = Path(sqlite_path(url) or "")
    before = db.read_bytes()
    out = tmp_path / "c.json"
    _refused(capsys, "tuner study report", "study", "report", str(study), "--out", str(tmp_path / "rep"))
    _refused(capsys, "tuner study export", "study", "export", str(study), "--out", str(out))
    assert db.read_bytes() == before and _revision(db) == "0001" and not out.exists()

    assert cli("cache", "upgrade", "--storage", url) == 0
    capsys.readouterr()
    assert cli("study", "export", str(study), "--out", str(out)) == 0, capsys.readouterr().err
    assert out.exists()


@pytest.fixture
def pg_url():
    from tests.pg import fresh_database

    yield from fresh_database()


@pytest.mark.postgres
def test_an_older_postgresql_store_is_refused_by_show_and_upgraded_by_upgrade(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.storage import SCHEMA_REVISION
    from tuner.store import ResultStore

    url = pg_url
    ResultStore(url)  # a store of this tuner's schema ...
    _downgrade(url, "0001")  # ... as the first migrated release left it

    def revision() -> str:
        eng = create_engine(url)
        try:
            with eng.connect() as conn:
                return str(conn.execute(text("SELECT version_num FROM tuner_alembic_version")).scalar())
        finally:
            eng.dispose()

    _refused(capsys, "tuner cache show", "cache", "show", "--storage", url)
    assert revision() == "0001"
    assert cli("cache", "upgrade", "--storage", url) == 0
    assert revision() == SCHEMA_REVISION
    assert cli("cache", "show", "--storage", url) == 0
    assert "no cached entries" in capsys.readouterr().out


def _tables(url: str) -> list[str]:
    from sqlalchemy import inspect

    eng = create_engine(url)
    try:
        return sorted(inspect(eng).get_table_names())
    finally:
        eng.dispose()


@pytest.mark.postgres
def test_commands_that_only_read_make_no_tables_in_an_empty_postgresql_database(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tuner cache show --storage postgresql://.../<an empty database>` created every tuner table there (as
    did export, prune --dry-run, study report and export): a read that changed the store. As for a SQLite
    file that does not exist yet, an empty database holds nothing and is left empty."""
    url = pg_url
    out = tmp_path / "c.json"
    _only_read(url, tmp_path, out, capsys, after_show=lambda: _tables(url) == [])
    assert _tables(url) == [] and not out.exists()
    assert cli("cache", "prune", "--older-than", "0", "--storage", url) == 0  # nothing to remove: none made
    assert _tables(url) == []


def _only_read(
    url: str,
    tmp_path: Path,
    out: Path,
    capsys: pytest.CaptureFixture[str],
    after_show: Callable[[], bool] | None = None,
) -> None:
    """Run every command that only reads on the store `url` where none is: cache show (also --json), prune
    --dry-run, export (exit 1), study report and export (exit 1, "it never ran"). `after_show`: a check
    made right after the first `cache show`."""
    study = write_study(tmp_path, n_m=1, budget=1)
    assert cli("cache", "show", "--storage", url) == 0
    assert "no cached entries" in capsys.readouterr().out
    if after_show is not None:
        assert after_show()
    assert cli("cache", "show", "--json", "--storage", url) == 0
    assert cli("cache", "prune", "--older-than", "0", "--dry-run", "--storage", url) == 0
    assert cli("cache", "export", "--out", str(out), "--storage", url) == 1
    for command in ("report", "export"):
        extra = ["--out", str(out)] if command == "export" else []
        assert cli("study", command, str(study), *extra, "--storage", url) == 1
        assert "it never ran" in capsys.readouterr().err


def _sqlite_tables(path: Path) -> list[str]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return sorted(r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
    finally:
        con.close()


@pytest.mark.parametrize("content", ["empty", "other tables"])
def test_commands_that_only_read_make_no_tables_in_an_existing_sqlite_file_without_a_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str
) -> None:
    """`touch s.db; tuner cache show --storage sqlite:///$PWD/s.db` created every tuner table in the file
    (as did export, prune --dry-run, study report and export, and `cache upgrade`, which says "nothing to
    upgrade" for a file that does not exist): only a file that did not exist counted as no store."""
    db = tmp_path / "s.db"
    if content == "empty":
        db.touch()
    else:  # a SQLite database of something else: tuner's tables are not added to it by reading
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE notes (x TEXT)")
        con.commit()
        con.close()
    before, tables = db.read_bytes(), _sqlite_tables(db)
    url = f"sqlite:///{db}"
    out = tmp_path / "c.json"
    _only_read(url, tmp_path, out, capsys)
    capsys.readouterr()
    assert cli("cache", "upgrade", "--storage", url) == 2
    assert f"no store at {db}: nothing to upgrade" in capsys.readouterr().err
    assert db.read_bytes() == before and _sqlite_tables(db) == tables and not out.exists()
    # a command that writes makes the store there as before
    assert cli("cache", "prune", "--older-than", "0", "--storage", url) == 0
    from tuner.store import ResultStore

    ResultStore(url)
    assert "tuner_alembic_version" in _sqlite_tables(db)
    assert cli("cache", "show", "--storage", url) == 0
    assert "no cached entries" in capsys.readouterr().out


def test_a_sqlite_file_that_is_not_a_database_is_refused_not_taken_for_an_empty_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.db"
    db.write_bytes(b"not a database at all, but more than a header's worth of bytes " * 4)
    before = db.read_bytes()
    assert cli("cache", "show", "--storage", f"sqlite:///{db}") == 1
    assert "not a database" in capsys.readouterr().err
    assert db.read_bytes() == before


@pytest.mark.postgres
def test_upgrade_of_an_empty_postgresql_database_makes_no_store(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tuner cache upgrade --storage postgresql://.../<an empty database>` created the schema, where for a
    SQLite file that does not exist it says there is nothing to upgrade (exit 2)."""
    from tuner.storage import redact

    assert cli("cache", "upgrade", "--storage", pg_url) == 2
    err = capsys.readouterr().err
    assert f"no store at {redact(pg_url)}: nothing to upgrade" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert _tables(pg_url) == []
