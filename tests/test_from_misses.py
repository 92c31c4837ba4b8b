"""`tuner misses` and `tuner study from-misses` on hand-made miss logs (no tuning): filtering, call
weights, the study's device, decorated functions listed and not dropped, bad input exits 2."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tuner.cli import main as cli
from tuner.runtime import CacheKey
from tuner.runtime._kernel import kernel_cache_key
from tuner.runtime._misses import MissRecorder
from tuner.studies._from_misses import device_arch


def _log(folder: Path, calls: dict[tuple[str, int, int], int], device: str = "cpu") -> None:
    rec = MissRecorder(folder=folder)
    for (kernel, m, n), c in calls.items():
        if kernel == "rmsnorm":
            ck = kernel_cache_key(
                "rmsnorm", {"M": m, "N": n, "dtype": "float32"}, backend="triton", device=device
            )
            cfg = rec.note(ck, {"BLOCK": 64}, "offline: space default", backend="triton", registered=True)
        else:
            ck = CacheKey.make(kernel, "0" * 32, {"n": m}, ["float32"], device, {"python": "3.11"})
            cfg = rec.note(ck, {"block": 16}, "offline: space default")
        for _ in range(c):
            dict(**cfg)
    rec.flush()


@pytest.fixture
def misses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "home"))
    folder = tmp_path / "misses"
    monkeypatch.setenv("TUNER_MISSES_DIR", str(folder))
    _log(
        folder,
        {("rmsnorm", 8, 64): 90, ("rmsnorm", 16, 128): 10, ("rmsnorm", 4, 32): 1, ("mine.launch", 7, 0): 50},
    )
    return folder


def test_misses_lists_merged_rows(misses: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _log(misses, {("rmsnorm", 8, 64): 10})  # a second process saw the same key
    assert cli(["misses", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["kernel"], r["key"].get("M"), r["calls"]) for r in rows][:2] == [
        ("rmsnorm", 8, 100),
        ("mine.launch", None, 50),
    ]
    assert rows[0]["processes"] == 2 and rows[0]["device"] == "cpu" and rows[0]["dtypes"] == ["float32"]
    assert cli(["misses", "--kernel", "rmsnorm", "--min-calls", "10"]) == 0
    out = capsys.readouterr().out
    assert "2 keys, 110 calls" in out and "mine.launch" not in out


def test_from_misses_weights_tasks_by_calls(misses: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "s.toml"
    assert cli(["study", "from-misses", "--min-calls", "5", "--trials", "8", "--out", str(out)]) == 0
    msg = capsys.readouterr().out
    assert "2 tasks of rmsnorm" in msg and "1 calls under --min-calls 5 left out" in msg
    doc = tomllib.loads(out.read_text())
    assert doc["study"]["device"] == "cpu"
    tasks = [(t["problems"][0]["M"], t["budget"]["trials"], t["dtypes"], t["backends"]) for t in doc["tasks"]]
    # 90 and 10 calls against an even split of 50: 8 * 1.8 -> 14, 8 * 0.2 -> 2 (the floor, 8 // 4)
    assert tasks == [(8, 14, ["float32"], ["triton"]), (16, 2, ["float32"], ["triton"])]
    assert "mine.launch key {'n': 7}" in out.read_text()  # listed, not dropped


def test_from_misses_bad_input_exits_2(misses: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "s.toml"
    assert cli(["study", "from-misses", "--min-calls", "1000", "--out", str(out)]) == 2
    assert "no recorded miss of a registered kernel with at least 1000 calls" in capsys.readouterr().err
    assert cli(["study", "from-misses", "--min-calls", "0", "--out", str(out)]) == 2
    assert not out.exists()


def test_device_arch():
    assert device_arch("cpu") == "cpu"
    assert device_arch("NVIDIA H100 80GB HBM3 (sm90)") == "sm90"
    assert device_arch("NVIDIA A100-SXM4-40GB (sm80)") == "sm80"
    assert device_arch("tpu:TPU v5 lite") is None


def test_mixed_devices_give_an_auto_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    folder = tmp_path / "m"
    monkeypatch.setenv("TUNER_MISSES_DIR", str(folder))
    _log(folder, {("rmsnorm", 8, 64): 3})
    _log(folder, {("rmsnorm", 8, 64): 3}, device="NVIDIA H100 (sm90)")
    out = tmp_path / "s.toml"
    assert cli(["study", "from-misses", "--out", str(out)]) == 0
    doc = tomllib.loads(out.read_text())
    assert doc["study"]["device"] == "auto" and len(doc["tasks"]) == 1  # one problem, tuned once
