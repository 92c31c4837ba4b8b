"""`tuner.kernel(...)(problem, inputs)` checks the problem against the kernel's schema and the inputs'
framework against the backend on a miss, before a key is stored or a kernel runs: a wrong problem used to
run (and key an entry) under a field the kernel has no such name for, a string or float shape, a negative
eps; inputs of the other backend crashed deep inside the launcher."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from tuner.kernels import get_kernel, prepare_triton  # noqa: E402

import tuner  # noqa: E402

P = {"M": 16, "N": 128, "dtype": "float32"}


@pytest.fixture(scope="module")
def inputs():
    prepare_triton()
    return get_kernel("rmsnorm").make_inputs(P, "triton", 0)


def _offline():
    return tuner.kernel("rmsnorm", backend="triton", mode="offline", storage=False)


@pytest.mark.parametrize(
    ("problem", "says"),
    [
        ({**P, "Q": 3}, "no problem field 'Q'"),
        ({**P, "M": "16"}, "M='16' must be an integer"),
        ({**P, "M": 16.0}, "M=16.0 must be an integer"),
        ({**P, "eps": -1.0}, "eps=-1.0"),
        ({**P, "dtype": "float99"}, "dtype='float99'"),
        ({"M": 16, "N": 128}, "names no 'dtype'"),
    ],
)
def test_bad_problem_is_refused_before_the_kernel_runs(inputs, problem, says):
    f = _offline()
    with pytest.raises(ValueError, match="kernel 'rmsnorm'") as err:
        f(problem, inputs)
    assert says in str(err.value)
    assert not f.tuner.last_choice  # nothing chosen, nothing run
    with pytest.raises(ValueError, match="kernel 'rmsnorm'"):
        f.explain(problem, inputs)


def test_numpy_integer_shape_is_refused_by_name(inputs):
    # it used to reach the stored key and fail there as "Object of type int64 is not JSON serializable"
    import numpy as np

    with pytest.raises(ValueError, match="M=np.int64.16.|M=16 must be an integer"):
        _offline()({**P, "M": np.int64(16)}, inputs)


def test_inputs_of_the_other_backend_are_refused(inputs):
    pytest.importorskip("jax")
    jax_inputs = get_kernel("rmsnorm").make_inputs(P, "pallas", 0)
    with pytest.raises(ValueError, match="takes torch arrays, got jax arrays"):
        _offline()(P, jax_inputs)
    pallas = tuner.kernel("rmsnorm", backend="pallas", mode="offline", storage=False)
    with pytest.raises(ValueError, match="takes jax arrays, got torch arrays"):
        pallas(P, inputs)


def test_inputs_must_be_a_table(inputs):
    with pytest.raises(ValueError, match="inputs must be a dict"):
        _offline().explain(P, list(inputs.values()))


def test_the_other_backends_entry_is_not_called_stale(inputs, tmp_path):
    # a Pallas call used to explain the Triton entry of the same problem as "stale or foreign: versions
    # differ (jax stored None now '0.10.2', ..., triton stored '3.7.1' now None)"
    pytest.importorskip("jax")
    url = f"sqlite:///{tmp_path}/t.db"
    tri = tuner.kernel(
        "rmsnorm", backend="triton", budget=2, storage=url, bench=lambda call: (call(), 1e-3)[1]
    )
    tri(P, inputs)
    pallas = tuner.kernel("rmsnorm", backend="pallas", mode="offline", storage=url)
    why = pallas.explain(P, get_kernel("rmsnorm").make_inputs(P, "pallas", 0))
    assert why.startswith("miss:"), why
    assert "another backend or framework (stored for torch+triton, now jax+jaxlib)" in why, why
    assert "versions differ" not in why, why
