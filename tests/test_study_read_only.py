"""The read commands of `tuner study` (report, export) on a study whose folder cannot be written (a
read-only mount, an archived study): they read the database as it is and create, migrate or write nothing
there; the report goes to `--out`, and without one the command says which folder it cannot write. `tuner
study run`, which must write, refuses in one line.

The study runs in a subprocess, as a worker does, so its database is closed (checkpointed) before it is
archived. The faithful case is a read-only bind mount (root and mount(8)); it skips where mounting is not
permitted, and its twin makes the folder report itself unwritable with SQLite unable to open the database
the usual way (a folder in the way of its `-wal` file), as tests/test_runtime_faults.py does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests._env import repo_pythonpath  # noqa: E402
from tests.test_runtime_faults import mount  # noqa: F401 - the fixture
from tests.test_studies import FAKE, REPO, cli, write_study


def _ran_study(tmp_path: Path) -> tuple[Path, Path]:
    """A finished study (one task, 4 trials) in tmp_path/study; returns (study file, its database)."""
    folder = tmp_path / "study"
    folder.mkdir()
    path = write_study(folder, n_m=1, budget=4)
    cmd = [sys.executable, "-m", "tuner.cli", "study", "run", str(path), "--executor", FAKE]
    r = subprocess.run(
        [*cmd, "--quiet", "--no-report"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": repo_pythonpath()},
        capture_output=True,
        text=True,
        timeout=300,
        encoding="utf-8",
    )
    assert r.returncode == 0, r.stderr
    db = folder / "out-s" / "study.db"
    assert db.is_file() and not (folder / "out-s" / "study.db-wal").exists()
    return path, db


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _read_commands_work(
    path: Path, db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], *, default_out_fails: bool
) -> None:
    folder = path.parent
    before = _listing(folder)
    capsys.readouterr()
    if default_out_fails:
        # the default report folder is inside the read-only study folder: say so, and where to write instead
        assert cli("study", "report", str(path)) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert f"cannot write the report of study s into {db.parent / 'report'}" in err, err
        assert "--out DIR" in err, err
    out = tmp_path / "elsewhere" / "rep"
    assert cli("study", "report", str(path), "--out", str(out), "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["markdown"] == str(out / "report.md")
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "| `fakemm/triton/float32/K=32,M=64,N=64` | done | 4/4 |" in md, md
    assert md.count("![convergence of") == 1
    cache = tmp_path / "elsewhere" / "cache.json"
    assert cli("study", "export", str(path), "--out", str(cache)) == 0
    assert json.loads(cache.read_text(encoding="utf-8"))["entries"][0]["kernel"] == "fakemm"
    # a run must write the store: refused in one line, nothing done
    capsys.readouterr()
    assert cli("study", "run", str(path), "--executor", FAKE, "--quiet") == 1
    err = capsys.readouterr().err.strip()
    assert "is read-only (its folder cannot be written)" in err and "`tuner study report`" in err, err
    assert _listing(folder) == before  # nothing created, migrated or written there (no -wal, -shm, .lock)


def test_read_commands_on_a_read_only_mount(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    mount: Callable[..., None],  # noqa: F811
) -> None:
    path, db = _ran_study(tmp_path)
    folder = path.parent
    mount("--bind", str(folder), target=folder)
    mount("-o", "remount,ro,bind", target=folder)
    _read_commands_work(path, db, tmp_path, capsys, default_out_fails=True)


def test_read_commands_on_a_folder_that_cannot_be_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The twin without mount(8): the study folders report themselves unwritable, and SQLite cannot open
    the database in the usual way (a folder where its `-wal` file would go)."""
    path, db = _ran_study(tmp_path)
    (db.parent / "study.db-wal").mkdir()
    folder = path.parent
    unwritable = {str(folder), str(db.parent), str(db.parent / "report" / "img")}
    real_access = os.access
    monkeypatch.setattr(
        "tuner.storage._engine.os.access",
        lambda p, mode, **kw: False if str(p) in unwritable else real_access(p, mode, **kw),
    )
    _read_commands_work(path, db, tmp_path, capsys, default_out_fails=True)


def _open_fds(path: Path) -> list[str]:
    """The descriptors of this process open on `path` (Linux's /proc)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                out.append(fd)
        except OSError:
            pass
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_optunas_storage_of_a_read_only_store_that_fails_keeps_no_file_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Optuna's storage of a store in a folder that cannot be written: its constructor ran statements on
    # the engine it had made (here: Optuna's tables were never made in this store) and raised; that
    # engine was never disposed of, and its pooled connection kept the file open for as long as the error
    # was kept (a traceback, a notebook's last error), as the other branch's did before c953b7f.
    from optuna.exceptions import StorageInternalError

    from tuner.storage import engine_of
    from tuner.storage._migrate import optuna_storage
    from tuner.store import ResultStore

    db = tmp_path / "ro" / "s.db"
    db.parent.mkdir()
    url = f"sqlite:///{db}"
    assert ResultStore(url).count() == 0  # tuner's tables only
    eng = engine_of(url)
    assert eng is not None
    eng.dispose()
    assert _open_fds(db) == []
    real_access = os.access
    monkeypatch.setattr(
        "tuner.storage._engine.os.access",
        lambda p, mode, **kw: False if str(p) == str(db.parent) else real_access(p, mode, **kw),
    )
    with pytest.raises(StorageInternalError) as err:  # Optuna's, over the driver's "no such table"
        optuna_storage(url)
    assert err.value is not None and _open_fds(db) == []  # the error still held
