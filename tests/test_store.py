"""The results store: the same conformance tests on SQLite and on the real PostgreSQL server (through\npsycopg2 and through psycopg 3)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tuner.store import ResultStore, StoreError, TaskContext, default_storage_url

from .pg import DRIVERS, fresh_database


@pytest.fixture(params=["sqlite", *DRIVERS])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
    else:  # PostgreSQL through either driver (a driverless URL gets psycopg 3 where it is installed)
        yield from fresh_database(request.param)


def test_record_and_query(url: str) -> None:
    store = ResultStore(url)
    t1 = TaskContext(
        kernel="matmul",
        problem={"M": 64, "N": 64},
        device="sm90",
        versions={"triton": "3.7.1"},
        dtype="float16",
    )
    t2 = TaskContext(kernel="matmul", problem={"M": 128, "N": 64}, device="sm90", dtype="float16")
    store.record(t1, "fp", {"BLOCK_M": 64}, 1.5, "ok", stats={"median": 1.5, "n": 10})
    store.record(t1, "fp", {"BLOCK_M": 128}, None, "compile_error", error="too much smem")
    store.record(t2, "fp", {"BLOCK_M": 64}, 2.0, "ok")
    rows = store.measurements(kernel="matmul")
    assert [r.value for r in rows] == [1.5, None, 2.0]
    assert rows[0].stats == {"median": 1.5, "n": 10} and rows[1].error == "too much smem"
    assert rows[0].versions == {"triton": "3.7.1"} and rows[0].dtype == "float16"
    assert len(store.measurements(task_id=t1.task_id)) == 2
    prior = store.prior_for("matmul", exclude_task=t2.task_id)
    assert prior == [[({"BLOCK_M": 64}, 1.5), ({"BLOCK_M": 128}, None)]]
    assert store.count() == 3
    # a second handle on the same database sees the same rows
    assert ResultStore(url).count() == 3


def test_failed_write_leaves_store_unchanged(url: str) -> None:
    store = ResultStore(url)
    store.record(None, "fp", {"a": 1}, 1.0, "ok")
    from tuner.store import MeasurementRow

    with pytest.raises(RuntimeError), store.session() as s:
        s.add(
            MeasurementRow(
                task_id="x",
                kernel="k",
                space_fingerprint="f",
                problem={},
                dtype="",
                device="d",
                versions={},
                config={},
                config_key="{}",
                value=1.0,
                status="ok",
                stats={},
                created_at=__import__("datetime").datetime.now(),
            )
        )
        s.flush()
        raise RuntimeError("crash mid-transaction")
    assert store.count() == 1


def test_optuna_shares_the_database(url: str) -> None:
    import optuna

    store = ResultStore(url)
    study = optuna.create_study(storage=store.optuna_storage(), study_name="shared")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert len(optuna.load_study(study_name="shared", storage=url).trials) == 2
    assert store.count() == 0


def test_task_id_stable() -> None:
    a = TaskContext(kernel="k", problem={"M": 1, "N": 2}, device="d")
    b = TaskContext(kernel="k", problem={"N": 2, "M": 1}, device="d")
    assert a.task_id == b.task_id
    assert a.task_id != TaskContext(kernel="k", problem={"M": 1, "N": 3}, device="d").task_id


def test_default_location(_tuner_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_storage_url() == f"sqlite:///{_tuner_home / 'tuner.db'}"
    monkeypatch.setenv("TUNER_STORAGE", "sqlite:////tmp/elsewhere.db")
    assert default_storage_url() == "sqlite:////tmp/elsewhere.db"


def test_bad_url_is_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        ResultStore(f"sqlite:///{tmp_path}/no/such/dir/x.db")


@pytest.mark.parametrize("name", ["josé", "run #1", "what?"])
def test_a_store_in_a_folder_whose_name_a_url_escapes_takes_its_schema_lock(
    tmp_path: Path, name: str
) -> None:
    # SQLAlchemy's rendered URL percent-encodes a path's non-ASCII letters, '#' and '?'; the schema lock
    # was taken beside that path, in a folder that is not there, so it was skipped (at debug level) and
    # two processes opening a new store made its schema at once.
    import threading

    fcntl = pytest.importorskip("fcntl")
    folder = tmp_path / "stores" / name
    folder.mkdir(parents=True)
    db = folder / "t.db"
    url = f"sqlite:///{db}".replace("?", "%3F")  # a '?' in the path is written escaped in a URL
    done = threading.Event()
    errors: list[BaseException] = []

    def open_store() -> None:
        try:
            ResultStore(url).count()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)
        finally:
            done.set()

    with open(f"{db}.lock", "w", encoding="utf-8") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process creating the schema
        threading.Thread(target=open_store, daemon=True).start()
        assert not done.wait(1.0), errors  # it waits for that process
    assert done.wait(60) and not errors, errors
    assert [p.name for p in folder.parent.iterdir()] == [name]  # nothing made beside the folder
