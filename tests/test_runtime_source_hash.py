"""Cache keys track the code that runs: editing a kernel body, or a helper it calls, in a temporary copy
of a module is a miss whose reason says the source changed; an unchanged copy is a hit. Covers a
@triton.jit kernel (under the interpreter; Triton's own JITFunction.cache_key when compiled), a Pallas
launcher (kernel body and pallas_call site) and the registered kernels (every module they come from)."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

import tuner
from tuner.runtime import ConfigCache
from tuner.runtime._source import code_hash, module_files, module_files_hash

TRITON_MODULE = textwrap.dedent(
    """
    import triton
    import triton.language as tl
    import tuner

    TIMED = []


    def _bench(kernel_call, quantiles):
        kernel_call()
        TIMED.append(1)
        return [float(len(TIMED))] * 3


    @triton.jit
    def _helper(v):
        return v + INC


    @tuner.autotune(
        configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})],
        key=["N"],
        restore_value=["x_ptr"],
        do_bench=_bench,
        name="edited_triton_kernel",
    )
    @triton.jit
    def kern(x_ptr, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < N)
        tl.store(x_ptr + offs, _helper(v) * MUL, mask=offs < N)
    """
)

PALLAS_MODULE = textwrap.dedent(
    """
    import jax
    from jax.experimental import pallas as pl
    import tuner

    TIMED = []


    def _bench(call):
        jax.block_until_ready(call())
        TIMED.append(1)
        return float(len(TIMED))


    def _helper(v):
        return v + INC


    def _body(x_ref, o_ref):
        o_ref[...] = _helper(x_ref[...]) * MUL


    @tuner.autotune(configs=[{"block": 8}, {"block": 16}], key=lambda x: {"n": x.shape[0]}, bench=_bench,
                    name="edited_pallas_kernel")
    def launch(x, *, block):
        return pl.pallas_call(
            _body,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(x.shape[0] // block,),
            in_specs=[pl.BlockSpec((block,), lambda i: (i,))],
            out_specs=pl.BlockSpec((block,), lambda i: (i,)),
            interpret=True,
        )(x)
    """
)


def load_copy(tmp_path: Path, tag: str, source: str, name: str):
    """Write `source` to <tmp>/<tag>/<name>.py and import it as module `name` (replacing an earlier copy)."""
    d = tmp_path / tag
    d.mkdir()
    path = d / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _version(template: str, inc: str = "1.0", mul: str = "1.0") -> str:
    return template.replace("INC", inc).replace("MUL", mul)


def test_triton_kernel_body_and_helper_edits_are_misses(tmp_path):
    torch = pytest.importorskip("torch")
    triton = pytest.importorskip("triton")
    name = "tuner_src_case_triton"
    try:

        def run(tag: str, source: str):
            mod = load_copy(tmp_path, tag, source, name)
            x = torch.zeros(100)
            mod.kern[lambda m: (triton.cdiv(100, m["BLOCK"]),)](x, 100)
            return mod, x

        mod, x = run("v1", _version(TRITON_MODULE))
        assert len(mod.TIMED) == 2 and torch.equal(x, torch.ones(100))
        same, _ = run("v1_again", _version(TRITON_MODULE))  # an unchanged copy: a store hit
        assert same.TIMED == [] and same.kern.tuner.stats["from_store"] == 1
        helper, x = run("helper", _version(TRITON_MODULE, inc="2.0"))
        assert len(helper.TIMED) == 2 and torch.equal(x, torch.full((100,), 2.0))
        assert "kernel source changed" in helper.kern.tuner.last_miss_reason
        body, x = run("body", _version(TRITON_MODULE, mul="3.0"))
        assert len(body.TIMED) == 2 and torch.equal(x, torch.full((100,), 3.0))
        assert "kernel source changed" in body.kern.tuner.last_miss_reason
        assert len({e.key.source_hash for e in ConfigCache().entries()}) == 3
    finally:
        sys.modules.pop(name, None)


def test_pallas_kernel_body_and_helper_edits_are_misses(tmp_path):
    jnp = pytest.importorskip("jax.numpy")
    name = "tuner_src_case_pallas"
    try:

        def run(tag: str, source: str):
            mod = load_copy(tmp_path, tag, source, name)
            return mod, mod.launch(jnp.arange(32, dtype=jnp.float32))

        mod, y = run("v1", _version(PALLAS_MODULE))
        assert len(mod.TIMED) == 2 and float(y[3]) == 4.0
        same, _ = run("v1_again", _version(PALLAS_MODULE))
        assert same.TIMED == [] and same.launch.tuner.stats["from_store"] == 1
        helper, y = run("helper", _version(PALLAS_MODULE, inc="2.0"))
        assert len(helper.TIMED) == 2 and float(y[3]) == 5.0
        assert "kernel source changed" in helper.launch.tuner.last_miss_reason
        body, y = run("body", _version(PALLAS_MODULE, mul="3.0"))
        assert len(body.TIMED) == 2 and float(y[3]) == 12.0
        assert "kernel source changed" in body.launch.tuner.last_miss_reason
        # the pallas_call site (grid, block specs) is part of the launcher's source
        site = _version(PALLAS_MODULE).replace(
            "grid=(x.shape[0] // block,),", "grid=(x.shape[0] // block,),  # edited"
        )
        site_mod = load_copy(tmp_path, "site", site, name)
        assert site_mod.launch.tuner.source_hash != mod.launch.tuner.source_hash
    finally:
        sys.modules.pop(name, None)


def test_compiled_triton_kernels_use_jitfunction_cache_key(tmp_path):
    """Without the interpreter, @triton.jit makes JITFunctions: the key uses Triton's cache_key, which
    covers the @triton.jit helpers the kernel calls (nothing is compiled or launched here)."""
    triton = pytest.importorskip("triton")
    import hashlib

    name = "tuner_src_case_compiled"
    # The knob's scope puts it back unset (following TRITON_INTERPRET) afterwards. monkeypatch.setattr
    # would restore the value it had read, set explicitly, and every later @triton.jit in this worker
    # would then ignore the environment variable (tests/test_torch_compile_triton.py relies on it).
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = False
        try:
            v1 = load_copy(tmp_path, "v1", _version(TRITON_MODULE), name)
            jit_fn = v1.kern.fn
            assert type(jit_fn).__name__ == "JITFunction"
            expect = hashlib.sha256(("triton-cache-key:" + jit_fn.cache_key).encode()).hexdigest()[:32]
            assert code_hash(v1.kern.fn) == expect == v1.kern.tuner.source_hash
            v2 = load_copy(tmp_path, "v2", _version(TRITON_MODULE, inc="2.0"), name)
            assert v2.kern.fn.cache_key != jit_fn.cache_key
            assert v2.kern.tuner.source_hash != v1.kern.tuner.source_hash
        finally:
            sys.modules.pop(name, None)
    assert "interpret" not in vars(triton.knobs.runtime), "the knob is left set explicitly"


def test_heuristics_wrapper_is_unwrapped_to_the_kernel():
    triton = pytest.importorskip("triton")
    tl = pytest.importorskip("triton.language")

    @triton.jit
    def k(x, N, BLOCK: tl.constexpr):
        tl.store(x + tl.arange(0, BLOCK), 1.0)

    wrapped = triton.heuristics({"BLOCK": lambda a: 16})(k)
    assert code_hash(wrapped) == code_hash(k)


def test_registered_kernels_hash_every_module_they_come_from(tmp_path, monkeypatch):
    from tuner.runtime import kernel_source_hash

    files = {p.name for p in module_files("tuner.kernels.matmul", "tuner.kernels")}
    assert {"matmul.py", "_matmul_triton.py", "_matmul_pallas.py", "_common.py"} <= files
    assert kernel_source_hash("matmul") == module_files_hash("tuner.kernels.matmul", "tuner.kernels")
    # a package of our own: editing an imported helper module changes the hash, an unrelated one not
    pkg = tmp_path / "tuner_src_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "launch.py").write_text(
        "from ._body import kern\n\ndef run(x):\n    return kern(x)\n", encoding="utf-8"
    )
    (pkg / "_body.py").write_text(
        "from . import _helper\n\ndef kern(x):\n    return _helper.f(x)\n", encoding="utf-8"
    )
    (pkg / "_helper.py").write_text("def f(x):\n    return x + 1\n", encoding="utf-8")
    (pkg / "other.py").write_text("X = 1\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    h0 = module_files_hash("tuner_src_pkg.launch", "tuner_src_pkg")
    (pkg / "other.py").write_text("X = 2\n", encoding="utf-8")
    assert module_files_hash("tuner_src_pkg.launch", "tuner_src_pkg") == h0
    (pkg / "_helper.py").write_text("def f(x):\n    return x + 2\n", encoding="utf-8")
    h1 = module_files_hash("tuner_src_pkg.launch", "tuner_src_pkg")
    assert h1 != h0
    (pkg / "_body.py").write_text(
        "from . import _helper\n\ndef kern(x):\n    return _helper.f(x) * 2\n", encoding="utf-8"
    )
    assert module_files_hash("tuner_src_pkg.launch", "tuner_src_pkg") not in (h0, h1)


def test_functions_defined_after_the_launcher_are_covered():
    """The hash is taken on the first miss, so a body defined below its launcher is found: two
    launchers with the same text whose later-defined helpers differ have different hashes."""

    def make_a():
        @tuner.autotune(configs=[{"k": 1}, {"k": 2}], key=["n"], storage=False, bench=lambda call: call())
        def launch(n, *, k):
            return later(n, k)

        def later(n, k):
            return float(k)

        return launch

    def make_b():
        @tuner.autotune(configs=[{"k": 1}, {"k": 2}], key=["n"], storage=False, bench=lambda call: call())
        def launch(n, *, k):
            return later(n, k)

        def later(n, k):
            return float(k) + 1.0

        return launch

    a, b = make_a(), make_b()
    assert a(3) == 1.0 and b(3) == 2.0
    assert a.tuner.source_hash != b.tuner.source_hash
