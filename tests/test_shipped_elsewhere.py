"""A cache file tuned on one machine, used on another that nobody tuned on: another GPU (the process's device
faked the way the runtime names it, "<GPU name> (sm<cc>)"), other versions, a renamed parameter. The call never
fails, the config is in the current space, and the one warning per key says what was used and how to tune
this machine (docs/production.md, "A cache file from another machine")."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import tuner
from tuner import PowerOfTwo, SearchSpace
from tuner.runtime import CacheEntry, CacheKey, load_cache, write_cache_file

SPACE = SearchSpace([PowerOfTwo("block", 16, 256)])
A100 = "NVIDIA A100-SXM4-80GB (sm80)"
H100 = "NVIDIA H100 80GB HBM3 (sm90)"
H200 = "NVIDIA H200 (sm90)"
LOGGER = "tuner.runtime._decorator"


def _make(cache, name="shipped_scale"):
    @tuner.autotune(SPACE, key=["n"], mode="offline", storage=False, cache=cache, name=name)
    def scale(x, n, *, block):
        return x * 2.0

    return scale


def _entry(f, n, config, **changes) -> CacheEntry:
    ck = f.tuner.full_key((np.ones(2, np.float32), n), {})
    parts = {"device": ck.device, "versions": ck.versions_dict, **changes}
    key = CacheKey.make(ck.kernel, ck.source_hash, {"n": n}, ck.dtypes, parts["device"], parts["versions"])
    return CacheEntry(key, config, 1e-5, 0.0)


def _ship(tmp_path, f, entries):
    path = tmp_path / "tuned.json"
    write_cache_file(path, entries)
    f.tuner.cache = load_cache(path)
    return path


@pytest.fixture
def on_h200(monkeypatch):
    monkeypatch.setattr("tuner.runtime._argkeys.device_of", lambda kind, values: H200)


def test_another_gpu_warns_once_naming_the_nearest_device_and_how_to_tune(
    tmp_path, on_h200, monkeypatch, caplog
):
    monkeypatch.setenv("TUNER_PREDICT", "0")
    f = _make(None)
    _ship(
        tmp_path, f, [_entry(f, 100, {"block": 32}, device=A100), _entry(f, 100, {"block": 64}, device=H100)]
    )
    caplog.set_level(logging.WARNING, logger=LOGGER)
    x = np.ones(2, np.float32)
    assert f(x, 100).tolist() == [2.0, 2.0] and f(x, 100).tolist() == [2.0, 2.0]
    assert f.tuner.last_choice["config"] == SPACE.default()  # the predictor is off: the space default
    [rec] = [r for r in caplog.records if r.name == LOGGER]  # one warning for the key
    msg = rec.getMessage()
    # the H100 entry (same architecture as the H200) explains the miss, not the first entry found
    assert f"device differs (stored '{H100}', now '{H200}')" in msg
    assert "TUNER_MODE=record" in msg and "tuner study from-misses" in msg


def test_another_gpu_and_an_unseen_shape_still_says_the_file_is_for_other_machines(
    tmp_path, on_h200, monkeypatch, caplog
):
    monkeypatch.setenv("TUNER_PREDICT", "0")
    f = _make(None)
    _ship(tmp_path, f, [_entry(f, 4096, {"block": 64}, device=H100)])
    caplog.set_level(logging.WARNING, logger=LOGGER)
    f(np.ones(2, np.float32), 100)
    [rec] = [r for r in caplog.records if r.name == LOGGER]
    msg = rec.getMessage()
    assert "the shipped files hold 1 entries of kernel 'shipped_scale', none for this device" in msg
    assert f"device differs (stored '{H100}', now '{H200}')" in msg and "TUNER_MODE=record" in msg


def test_other_versions_name_them_and_how_to_tune(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TUNER_PREDICT", "0")
    f = _make(None)
    ck = f.tuner.full_key((np.ones(2, np.float32), 100), {})
    _ship(tmp_path, f, [_entry(f, 100, {"block": 64}, versions={**ck.versions_dict, "numpy": "0.1"})])
    caplog.set_level(logging.WARNING, logger=LOGGER)
    f(np.ones(2, np.float32), 100)
    msg = " ".join(r.getMessage() for r in caplog.records if r.name == LOGGER)
    assert "numpy stored '0.1'" in msg and "TUNER_MODE=record" in msg


def test_the_predictor_ignores_entries_of_a_renamed_parameter(tmp_path, caplog):
    """Entries tuned before `block` was called `blk`: neither the nearest key nor the predictor may learn
    from them (their configs lack every current parameter); the space default is used, and said so."""
    f = _make(None)
    _ship(tmp_path, f, [_entry(f, n, {"blk": 64}) for n in (64, 1024, 4096)])
    f(np.ones(2, np.float32), 100)
    assert f.tuner.last_choice["config"] == SPACE.default()
    assert f.tuner.last_choice["why"].startswith("offline: space default")


def test_a_real_kernel_on_an_untuned_gpu_of_a_tuned_architecture(tmp_path, monkeypatch, caplog):
    """rmsnorm under the Triton interpreter, its file tuned on an A100 and an H100, run as on an H200: the
    zero-shot predictor takes the H100's winner (same architecture), the output is right, and the log says
    what differs and how to tune the H200."""
    from tuner.kernels import get_kernel

    from tuner.runtime import backend_versions, kernel_cache_key

    problem = {"M": 16, "N": 128, "dtype": "float32"}
    h100_cfg = {"BLOCK_N": 128, "ROWS_PER_PROGRAM": 2, "num_warps": 4}

    def entry(device, config):
        ck = kernel_cache_key(
            "rmsnorm", problem, backend="triton", device=device, versions=backend_versions("triton")
        )
        return CacheEntry(ck, config, 1e-5, 0.0)

    path = tmp_path / "tuned.json"
    write_cache_file(
        path, [entry(A100, {"BLOCK_N": 128, "ROWS_PER_PROGRAM": 16, "num_warps": 1}), entry(H100, h100_cfg)]
    )
    monkeypatch.setattr("tuner.runtime._kernel.device_of", lambda kind, values: H200)
    f = tuner.kernel(
        "rmsnorm", backend="triton", mode="offline", storage=False, cache=load_cache(path), device="sm90"
    )
    spec = get_kernel("rmsnorm")
    inputs = spec.make_inputs(problem, "triton", 0)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    out = f(problem, inputs)
    assert f.tuner.last_choice["config"] == h100_cfg
    assert "zero-shot prediction" in f.tuner.last_choice["why"]
    ref = spec.reference(problem, inputs)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-4, atol=1e-4)
    msg = " ".join(r.getMessage() for r in caplog.records if r.name == LOGGER)
    assert f"stored '{H100}', now '{H200}'" in msg and "TUNER_MODE=record" in msg
