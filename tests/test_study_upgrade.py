"""A study run by one tuner and exported by another (an upgrade between `tuner study run` and
`tuner study export`, or an old study database exported after the upgrade): the exported entries carry the
hash of the kernel source the tasks were tuned on, so the new kernel code misses them with a reason
instead of getting configs measured on other code as exact hits."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

import tuner.runtime._kernel as rk
from tests.test_studies import FAKE, write_study
from tuner.studies import export_study, load_study, run_study

OLD, NEW = "a" * 32, "b" * 32  # the kernel's source hash before and after the upgrade


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN202
    monkeypatch.chdir(tmp_path)
    spec = load_study(write_study(tmp_path, n_m=2, budget=3), check_kernels=False)
    monkeypatch.setattr(rk, "kernel_source_hash", lambda kernel: OLD)
    run_study(spec, executor=FAKE)
    monkeypatch.setattr(rk, "kernel_source_hash", lambda kernel: NEW)  # the kernels changed since
    return spec


def test_export_after_the_kernel_changed_keeps_the_hash_it_was_tuned_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spec = _run(tmp_path, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="tuner.studies._export"):
        export_study(spec, tmp_path / "c.json")
    entries = json.loads((tmp_path / "c.json").read_text(encoding="utf-8"))["entries"]
    assert len(entries) == 2
    assert {e["source_hash"] for e in entries} == {OLD}  # not NEW: a silent exact hit for other code
    assert "tuned on another version of kernel 'fakemm'" in caplog.text


def test_a_result_an_older_tuner_recorded_without_the_hash_is_exported_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spec = _run(tmp_path, monkeypatch)
    eng = create_engine(spec.storage)
    with eng.begin() as conn:  # what a tuner before the hash was recorded left in the board
        for key, result in conn.execute(text("SELECT key, result FROM tuner_study_tasks")).all():
            res = json.loads(result) if isinstance(result, str) else result
            assert res.pop("source_hash") == OLD
            conn.execute(
                text("UPDATE tuner_study_tasks SET result = :r WHERE key = :k"),
                {"r": json.dumps(res), "k": key},
            )
    eng.dispose()
    with caplog.at_level(logging.WARNING, logger="tuner.studies._export"):
        export_study(spec, tmp_path / "c.json")
    entries = json.loads((tmp_path / "c.json").read_text(encoding="utf-8"))["entries"]
    assert {e["source_hash"] for e in entries} == {NEW}
    assert caplog.text.count("records no kernel source hash (it finished under an older tuner)") == 2
