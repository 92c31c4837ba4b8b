"""Devices nobody ran tuner on: new or unusual accelerators, emulated through the torch and jax calls tuner
makes (no GPU needed). What each one meets: detection, the search space's limits, the cache key's device,
a file tuned elsewhere, `tuner check --device`, the cost model's device features and a study's "auto"."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tuner.search_spaces import devices as dv

_MATMUL = {"M": 4096, "N": 4096, "K": 4096, "dtype": "float16"}
# 5 stages of a 128x64 A tile and a 64x64 B tile in fp16: 120 KiB of shared memory
_CFG_120_KIB = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1, "num_warps": 4}
_CFG_120_KIB["num_stages"] = 5


def _emulate_gpus(
    monkeypatch: pytest.MonkeyPatch, *gpus: tuple[str, tuple[int, int], dict[str, Any]]
) -> None:
    """torch on NVIDIA GPUs (name, compute capability, the device properties torch reports), numbered as
    CUDA_VISIBLE_DEVICES leaves them: the i-th is torch's cuda:i."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(dv, "on_gpu", lambda: True)
    # the runtime's keys read the tensors' device unless the Triton interpreter is on (TRITON_INTERPRET
    # itself stays on: kernels defined while it is off would not run on the CPU afterwards)
    monkeypatch.setattr("tuner.runtime._env.triton_interpreted", lambda: False)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    props = [SimpleNamespace(name=n, major=cc[0], minor=cc[1], **rep) for n, cc, rep in gpus]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (props[i].major, props[i].minor))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: props[i].name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: props[i])
    dv.cuda_device_label.cache_clear()


@pytest.fixture(autouse=True)
def _fresh_label_cache() -> Any:
    dv.cuda_device_label.cache_clear()
    dv.nvidia_arch.cache_clear()
    yield
    dv.cuda_device_label.cache_clear()
    dv.nvidia_arch.cache_clear()


# ---- NVIDIA GPUs the table names by another product ----------------------------------------------------
@pytest.mark.parametrize(
    ("name", "cc", "arch", "smem_kib"),
    [
        ("NVIDIA B200", (10, 0), "sm100", 227),
        ("NVIDIA GB200", (10, 0), "sm100", 227),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0), "sm120", 99),
        ("NVIDIA GH200 480GB", (9, 0), "sm90", 227),
        ("NVIDIA L40S", (8, 9), "sm89", 99),
        ("NVIDIA A10G", (8, 6), "sm86", 99),
        ("Tesla V100-SXM2-16GB", (7, 0), "sm70", 96),
        ("Tesla T4", (7, 5), "sm75", 64),
    ],
)
def test_a_gpu_gets_its_arch_limits_its_own_name_and_a_label_read_back_to_the_same_arch(
    monkeypatch: pytest.MonkeyPatch, name: str, cc: tuple[int, int], arch: str, smem_kib: int
) -> None:
    from tuner.search_spaces.matmul import matmul_space

    _emulate_gpus(monkeypatch, (name, cc, {"multi_processor_count": 7}))
    dev = dv.detect_device("triton")
    assert (dev.arch, dev.name, dev.smem_per_block_bytes, dev.num_sms) == (arch, name, smem_kib * 1024, 7)
    label = dv.device_label("triton")
    assert label == f"{name} (sm{cc[0]}{cc[1]})"
    # the label (what cache keys and shipped files say) and the bare model name both read back to the arch
    assert dv.device_family(label).arch == arch and dv.device_family(name).arch == arch
    assert dv.device_for_label(label) is dv.get_device(arch)
    space = matmul_space(_MATMUL, dev, "triton")
    assert space.contains(_CFG_120_KIB) is (smem_kib * 1024 >= 120 * 1024)


def test_a_mig_slice_keeps_the_arch_reports_its_own_sms_and_is_not_the_whole_gpus_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tuner.runtime._key import CacheKey

    whole, mig = "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    _emulate_gpus(monkeypatch, (mig, (9, 0), {"multi_processor_count": 16, "L2_cache_size": 5 * 2**20}))
    dev = dv.detect_device("triton")
    assert (dev.arch, dev.name, dev.num_sms, dev.l2_bytes) == ("sm90", mig, 16, 5 * 2**20)
    assert dev.features()["dev_num_sms"] == 16.0  # the slice's SMs, not the table H100's 132
    label = dv.device_label("triton")
    assert dv.device_family(label) == dv.device_family(f"{whole} (sm90)")  # one family: same arch
    key = CacheKey.make("k", "h", {"M": 1}, ["float16"], label, {})
    stored = CacheKey.make("k", "h", {"M": 1}, ["float16"], f"{whole} (sm90)", {})
    assert key.hash != stored.hash  # a slice's tuned config is not the whole GPU's, nor the reverse
    assert key.mismatches(stored) == [f"device differs (stored '{whole} (sm90)', now '{mig} (sm90)')"]


def test_a_name_with_odd_characters_is_a_label_a_key_and_a_file_can_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import json

    from tuner.runtime._key import CacheKey

    name = 'NVIDIA Wéird™ GPU (rev "2")\t[π]'
    _emulate_gpus(monkeypatch, (name, (9, 0), {}))
    assert dv.detect_device("triton").name == name
    label = dv.device_label("triton")
    assert label == f"{name} (sm90)" and dv.device_for_label(label) is dv.SM90
    key = CacheKey.make("k", "h", {"M": 1}, ["float16"], label, {"triton": "3.7.1"})
    back = json.loads(json.dumps(key.to_json()))
    again = CacheKey.make(
        back["kernel"], back["source_hash"], back["key"], back["dtypes"], back["device"], {}
    )
    assert (
        again.device == label and again.hash == CacheKey.make("k", "h", {"M": 1}, ["float16"], label, {}).hash
    )


@pytest.mark.parametrize(("cc", "arch"), [((13, 0), "sm120"), ((10, 7), "sm100"), ((9, 5), "sm90")])
def test_an_unknown_compute_capability_is_the_nearest_lower_arch_everywhere_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, cc: tuple[int, int], arch: str
) -> None:
    from tuner.cost_models.zero_shot import device_features

    _emulate_gpus(monkeypatch, ("NVIDIA Next", cc, {"shared_memory_per_block_optin": 200 * 1024}))
    with caplog.at_level(logging.WARNING, logger=dv.__name__):
        dev = dv.detect_device("triton")
        dv.detect_device("triton")
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and f"{cc[0]}.{cc[1]}" in warned[0] and arch in warned[0], warned
    # the arch's per-thread limits, the shared memory torch reports (it knows the chip, the table does not)
    assert (dev.arch, dev.smem_per_block_bytes, dev.max_threads_per_block) == (arch, 200 * 1024, 1024)
    label = dv.device_label("triton")
    assert dv.device_for_label(label) is dv.get_device(arch)
    feats = device_features(label)  # the cost model: the vendor and the version the label says
    assert feats["dev_vendor_nvidia"] == 1.0 and feats["dev_nvidia_isa"] == pytest.approx(cc[0] + cc[1] / 10)
    assert all(math.isfinite(v) for v in dev.features().values())


# ---- AMD -----------------------------------------------------------------------------------------------
def _emulate_rocm(
    monkeypatch: pytest.MonkeyPatch, name: str, gcn: str, cc: tuple[int, int], **rep: int
) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(dv, "on_gpu", lambda: True)
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    props = SimpleNamespace(name=name, gcnArchName=gcn, major=cc[0], minor=cc[1], **rep)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: cc)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: props)
    dv.cuda_device_label.cache_clear()


def test_an_mi325x_is_gfx942_and_an_rdna3_radeon_gets_the_smallest_amd_limits_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tuner.cost_models.zero_shot import device_features

    _emulate_rocm(monkeypatch, "AMD Instinct MI325X", "gfx942:sramecc+:xnack-", (9, 4))
    dev = dv.detect_device("triton")
    assert (dev.arch, dev.name, dev.smem_per_block_bytes, dev.warp_size) == (
        "gfx942",
        "AMD Instinct MI325X",
        65536,
        64,
    )
    assert dv.device_for_label(dv.device_label("triton")) is dv.GFX942  # "(sm94)" is not read as sm90
    # a Radeon RX 7900 XTX (gfx1100): no descriptor; gfx90a's 64 KiB of LDS, and the wave32 torch reports
    _emulate_rocm(monkeypatch, "AMD Radeon RX 7900 XTX", "gfx1100", (11, 0), warp_size=32)
    with caplog.at_level(logging.WARNING, logger=dv.__name__):
        dev = dv.detect_device("triton")
    assert (dev.arch, dev.smem_per_block_bytes, dev.warp_size) == ("gfx90a", 65536, 32)
    assert any("gfx1100" in r.getMessage() and "gfx90a" in r.getMessage() for r in caplog.records)
    label = dv.device_label("triton")
    assert dv.device_family(label).vendor == "amd" and dv.device_for_label(label) is dv.GFX90A
    assert device_features(label)["dev_vendor_amd"] == 1.0


# ---- jax on an NVIDIA GPU that does not say its compute capability -------------------------------------
@pytest.mark.parametrize("cc", [None, "", "unknown", "9"])
def test_a_jax_gpu_without_a_compute_capability_gets_the_least_shared_memory_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, cc: str | None
) -> None:
    """Not sm80's 163 KiB (what the old default assumed): a chip with less would be offered tiles it
    cannot hold."""
    jax = pytest.importorskip("jax")
    monkeypatch.setenv("TUNER_PALLAS_INTERPRET", "0")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    attrs = {"platform": "gpu", "device_kind": "NVIDIA Future GPU"}
    if cc is not None:
        attrs["compute_capability"] = cc
    monkeypatch.setattr(jax, "devices", lambda *a: [SimpleNamespace(**attrs)])
    with caplog.at_level(logging.WARNING, logger=dv.__name__):
        dev = dv.detect_device("pallas")
    if cc == "9":  # a bare major version is still one: 9.0
        assert dev.arch == "sm90" and not caplog.records
        return
    nvidia = [d for d in dv.DEVICES.values() if d.vendor == "nvidia"]
    least = min(d.smem_per_block_bytes for d in nvidia)
    assert (dev.vendor, dev.name, dev.smem_per_block_bytes) == ("nvidia", "NVIDIA Future GPU", least)
    assert dev.arch == "sm75"
    warned = [r.getMessage() for r in caplog.records]
    assert any("NVIDIA Future GPU" in m and "sm75" in m and "compute capability" in m for m in warned), warned


# ---- TPUs ----------------------------------------------------------------------------------------------
def _emulate_tpu(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    jax = pytest.importorskip("jax")
    monkeypatch.setenv("TUNER_PALLAS_INTERPRET", "0")
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    monkeypatch.setattr(jax, "devices", lambda *a: [SimpleNamespace(platform="tpu", device_kind=kind)])


@pytest.mark.parametrize("kind", ["TPU7x", "TPU v9 super"])
def test_an_unknown_tpu_gets_the_least_vmem_of_the_known_tpus_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """Not v5e's 128 MiB: a newer chip with less VMEM would be offered tiles it cannot hold."""
    from tuner.cost_models.zero_shot import device_features

    _emulate_tpu(monkeypatch, kind)
    with caplog.at_level(logging.WARNING, logger=dv.__name__):
        dev = dv.detect_device("pallas")
    least = min(d.vmem_bytes for d in dv.DEVICES.values() if d.kind == "tpu")
    assert (dev.kind, dev.name, dev.vmem_bytes) == ("tpu", kind, least)
    warned = [r.getMessage() for r in caplog.records]
    assert any(kind in w and dev.arch in w for w in warned), warned
    label = dv.device_label("pallas")
    assert label == f"tpu:{kind}" and dv.device_family(label).vendor == "google"
    assert all(math.isfinite(v) for v in device_features(label).values())


def test_tpu_v5_lite_is_still_v5e(monkeypatch: pytest.MonkeyPatch) -> None:
    _emulate_tpu(monkeypatch, "TPU v5 lite")
    assert dv.detect_device("pallas").vmem_bytes == dv.TPU_V5E.vmem_bytes


# ---- two GPUs of different kinds -----------------------------------------------------------------------
class _CudaTensor:
    """Stands for a torch tensor on cuda:`index` (what the runtime reads of one: its module and device)."""

    __module__ = "torch"

    def __init__(self, index: int) -> None:
        self.device = SimpleNamespace(type="cuda", index=index)
        self.dtype = "float16"


def test_a_kernels_space_obeys_the_gpu_its_tensors_are_on_not_gpu_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """An A100 (163 KiB of shared memory) as cuda:0, an RTX 4090 (99 KiB) as cuda:1."""
    from tuner.kernels import get_kernel

    from tuner.runtime._env import device_of
    from tuner.runtime._kernel import _SpaceOnDevice

    _emulate_gpus(
        monkeypatch,
        ("NVIDIA A100-SXM4-40GB", (8, 0), {"shared_memory_per_block_optin": 163 * 1024}),
        ("NVIDIA GeForce RTX 4090", (8, 9), {"shared_memory_per_block_optin": 99 * 1024}),
    )
    space_of = _SpaceOnDevice(get_kernel("matmul"), "triton", None)
    on1 = {"a": _CudaTensor(1), "b": _CudaTensor(1)}
    assert device_of("triton", list(on1.values())) == "NVIDIA GeForce RTX 4090 (sm89)"  # the key's device
    assert not space_of(_MATMUL, on1).contains(_CFG_120_KIB)  # ... and the space's limits agree with it
    assert space_of(_MATMUL, {"a": _CudaTensor(0)}).contains(_CFG_120_KIB)
    assert dv.detect_device("triton", 1).name == "NVIDIA GeForce RTX 4090"
    assert dv.detect_device("triton").name == "NVIDIA A100-SXM4-40GB"  # index 0 by default


def test_cuda_visible_devices_selecting_the_second_gpu_makes_it_torchs_cuda_0(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With CUDA_VISIBLE_DEVICES=1 torch sees one GPU, the 4090, as cuda:0: detection and keys name it."""
    _emulate_gpus(
        monkeypatch, ("NVIDIA GeForce RTX 4090", (8, 9), {"shared_memory_per_block_optin": 99 * 1024})
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    from tuner.runtime._env import device_of

    assert dv.detect_device("triton").smem_per_block_bytes == 99 * 1024
    assert (
        device_of("triton", [_CudaTensor(0)]) == dv.device_label("triton") == "NVIDIA GeForce RTX 4090 (sm89)"
    )


# ---- a study's device = "auto" -------------------------------------------------------------------------
def test_a_studys_auto_device_is_each_backends_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A Pallas task on a TPU machine is tuned for the TPU, not for the CPU torch sees there."""
    from tuner.studies import load_study, prepare_study

    study = tmp_path / "s.toml"
    study.write_text(
        """
[study]
name = "s"
device = "auto"
backends = ["triton", "pallas"]
budget = { trials = 2 }
output = "out"

[[tasks]]
kernel = "matmul"
grid = { M = [64], N = [64], K = [64] }
""",
        encoding="utf-8",
    )
    tpu = dv.replace(dv.TPU_V6E, name="TPU v6 lite")
    monkeypatch.setattr(dv, "detect_device", lambda backend, index=0: tpu if backend == "pallas" else dv.CPU)
    spec = prepare_study(load_study(study, check_kernels=False))
    assert {(t.backend, t.device) for t in spec.tasks} == {("triton", "cpu"), ("pallas", "tpu_v6e")}


# ---- tuner check --device ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["check", "matmul", "--device", "sm130"],
        ["check", "matmul", "--device", "gfx1100"],
        ["check", "matmul", "--device", "TPU7x"],
        ["check", "matmul", "--device", "NVIDIA B200"],
        ["check", "matmul", "--device", ""],
        ["check", "matmul", "--compile-only", "--device", "gfx942"],
        ["check", "matmul", "--compile-only", "--device", "sm130"],
    ],
)
def test_check_with_a_device_tuner_has_no_descriptor_for_exits_2_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tuner: error: ") and len(err.strip().splitlines()) == 1, err
    assert repr(argv[-1]) in err


@pytest.mark.parametrize(
    ("name", "gcn", "cc", "label", "arch"),
    [
        # ROCm's usual label: kept (stores and shipped files hold it), it reads back as the gfx target
        ("AMD Instinct MI300X", "gfx942:sramecc+:xnack-", (9, 4), "AMD Instinct MI300X (sm94)", "gfx942"),
        # no name at all: " (sm94)" read back as an NVIDIA sm94 (and sm90's 227 KiB of shared memory)
        ("", "gfx942:sramecc+:xnack-", (9, 4), "AMD GPU (gfx942)", "gfx942"),
        ("", "", (9, 4), "AMD GPU (sm94)", ""),
        ("  ", "", (9, 0), "AMD GPU (sm90)", ""),
        # a bare model name without AMD's words: "MI300X (sm94)" read back as an NVIDIA sm94 too
        ("MI300X", "", (9, 4), "AMD MI300X (sm94)", "gfx942"),
        ("MI250X", "gfx90a", (9, 0), "AMD MI250X (gfx90a)", "gfx90a"),
        # a model name of another gfx target than the device's: the device's own wins
        ("AMD Instinct MI300X", "gfx950:sramecc+:xnack-", (9, 5), "AMD Instinct MI300X (gfx950)", "gfx950"),
    ],
)
def test_a_rocm_label_reads_back_as_this_amd_gpu(
    monkeypatch: pytest.MonkeyPatch, name: str, gcn: str, cc: tuple[int, int], label: str, arch: str
) -> None:
    _emulate_rocm(monkeypatch, name, gcn, cc)
    got = dv.device_label("triton")
    fam = dv.device_family(got)
    assert (got, fam.vendor, fam.arch) == (label, "amd", arch)
    dev = dv.device_for_label(got)
    assert dev is not None and dev.vendor == "amd"
    assert dev.arch == dv.detect_device("triton").arch  # the limits the label names are the detected ones


def test_an_nvidia_gpu_without_a_name_is_labelled_nvidia(monkeypatch: pytest.MonkeyPatch) -> None:
    _emulate_gpus(monkeypatch, ("", (9, 0), {}))
    label = dv.device_label("triton")
    assert label == "NVIDIA GPU (sm90)"
    assert dv.device_for_label(label) is dv.SM90
