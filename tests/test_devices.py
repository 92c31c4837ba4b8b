"""One home for device detection: tuner.search_spaces.devices (what kernels, measure, runtime and studies use)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tuner.search_spaces import devices as dv


def test_cpu_under_the_interpreters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("TUNER_PALLAS_INTERPRET", "1")
    assert dv.triton_interpreted() and not dv.on_gpu() and dv.pallas_interpret()
    assert dv.detect_device("triton") is dv.CPU
    assert dv.detect_device("pallas") is dv.CPU
    assert dv.device_label("triton") == "cpu"
    with pytest.raises(ValueError, match="'cuda'"):
        dv.detect_device("cuda")
    with pytest.raises(ValueError, match="'cuda'"):
        dv.device_label("cuda")


def test_pallas_interpret_follows_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_PALLAS_INTERPRET", "0")
    assert dv.pallas_interpret() is False
    monkeypatch.setenv("TUNER_PALLAS_INTERPRET", "")
    assert dv.pallas_interpret() is False  # set but empty: compile, as before
    monkeypatch.delenv("TUNER_PALLAS_INTERPRET")
    jax = pytest.importorskip("jax")
    assert dv.pallas_interpret() is (jax.default_backend() == "cpu")


@pytest.mark.parametrize(
    ("kind", "arch"),
    [("TPU v4", "tpu_v4"), ("TPU v5 lite", "tpu_v5e"), ("TPU v5p", "tpu_v5p"), ("TPU v6e", "tpu_v6e")],
)
def test_tpu_generation_from_jax_device_kind(monkeypatch: pytest.MonkeyPatch, kind: str, arch: str) -> None:
    jax = pytest.importorskip("jax")
    monkeypatch.setenv("TUNER_PALLAS_INTERPRET", "0")
    fake = SimpleNamespace(platform="tpu", device_kind=kind)
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    monkeypatch.setattr(jax, "devices", lambda *a: [fake])
    assert dv.detect_device("pallas").arch == arch
    assert dv.device_label("pallas") == f"tpu:{kind}"


def test_jax_gpu_compute_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    jax = pytest.importorskip("jax")
    monkeypatch.setenv("TUNER_PALLAS_INTERPRET", "0")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    for cc, arch in (("8.0", "sm80"), ("9.0", "sm90"), ("10.0", "sm90")):
        monkeypatch.setattr(jax, "devices", lambda *a, cc=cc: [SimpleNamespace(compute_capability=cc)])
        assert dv.detect_device("pallas").arch == arch


def test_labels_are_the_runtime_key_names() -> None:
    assert dv.jax_device_label(SimpleNamespace(platform="cpu", device_kind="cpu")) == "cpu"
    assert (
        dv.jax_device_label(SimpleNamespace(platform="gpu", device_kind="NVIDIA H100")) == "gpu:NVIDIA H100"
    )
    from tuner.runtime._env import device_of

    assert device_of("python", [1, 2.0]) == "cpu"


@pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs a CUDA device")
def test_cuda_label_names_the_gpu_and_its_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    major, minor = torch.cuda.get_device_capability(0)
    assert dv.device_label("triton") == f"{torch.cuda.get_device_name(0)} (sm{major}{minor})"
    assert dv.detect_device("triton").kind == "cuda"


@pytest.mark.parametrize(
    ("label", "vendor", "arch", "version"),
    [
        ("NVIDIA A100-SXM4-40GB (sm80)", "nvidia", "sm80", 8.0),  # the runtime's Triton label
        ("NVIDIA H100 80GB HBM3 (sm90)", "nvidia", "sm90", 9.0),
        ("gpu:NVIDIA H100 80GB HBM3", "nvidia", "sm90", 9.0),  # jax's label: the model name
        ("NVIDIA GeForce RTX 3090", "nvidia", "sm86", 8.6),
        ("RTX_2080_Ti", "nvidia", "sm75", 7.5),
        ("NVIDIA TITAN RTX", "nvidia", "sm75", 7.5),
        ("Tesla V100-SXM2-16GB", "nvidia", "sm70", 7.0),
        ("NVIDIA L4", "nvidia", "sm89", 8.9),
        ("AMD Instinct MI250X", "amd", "gfx90a", 9.0),
        ("MI300X", "amd", "gfx942", 9.4),
        ("AMD Radeon PRO W6600", "amd", "gfx1030", 10.3),
        ("AMD Radeon RX 7900 XTX", "amd", "gfx1100", 11.0),
        ("gfx90a:sramecc+:xnack-", "amd", "gfx90a", 9.0),  # a gfx target in the label wins
        ("tpu:TPU v5 lite", "google", "tpu_v5e", 5.0),
        ("cpu", "cpu", "cpu", 0.0),
    ],
)
def test_device_family_from_labels(label: str, vendor: str, arch: str, version: float) -> None:
    fam = dv.device_family(label)
    assert (fam.vendor, fam.arch, fam.version) == (vendor, arch, version)


def test_device_family_distance_and_unknown_labels() -> None:
    a4000, a6000, a100 = (dv.device_family(x) for x in ("NVIDIA RTX A4000", "NVIDIA RTX A6000", "A100"))
    assert a4000.distance(a6000) == 0.0 and a4000.distance(a100) == pytest.approx(0.6)
    assert a4000.distance(dv.device_family("AMD Radeon PRO W7800")) == float("inf")
    for label in ("", "some accelerator", "xyz-9000"):
        fam = dv.device_family(label)
        assert not fam.known and fam.distance(fam) == float("inf")
    # a vendor without a model the table knows: the vendor, no arch
    amd = dv.device_family("AMD Radeon Graphics")
    assert amd.vendor == "amd" and amd.arch == "" and amd.distance(dv.device_family("MI250X")) == float("inf")
