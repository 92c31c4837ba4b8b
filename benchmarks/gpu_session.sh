#!/usr/bin/env bash
# The device checks of one lent GPU session, in one command (docs/benchmarks.md, "GPU validation"):
#   bash benchmarks/gpu_session.sh OUTDIR
# Expects the missing Python packages as wheels in .whl/ (docs/benchmarks.md says which), installs them
# into a temporary folder (no pip install into the image), then runs, each under its own time limit and
# with its log in OUTDIR: third-party kernels through the drop-ins (foreign_gpu_check.py,
# thirdparty_gpu_check.py), the jax-version-dependent CPU tests under the image's jax, the kernel
# checks of gpu_validate.py, the runtime's device check, the suite's GPU-only tests, and the drop-in's
# test files with CUDA as torch's default device (tests/_gpu_default_device.py).
set -u
out=${1:?usage: gpu_session.sh OUTDIR}
mkdir -p "$out"
site=$(mktemp -d)
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl || exit 1
fi
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
set -o pipefail
step() {  # step NAME SECONDS CMD...: run with a time limit, log to OUTDIR/NAME.log, print its status
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0)) s"
  if [ "$name" = study ]; then tail -n 45 "$out/$name.log"; return; fi
  if [ "$name" = thirdparty ]; then tail -n 6 "$out/$name.log"; return; fi
  grep -E "^(PASS|FAIL|summary|versions|  check|device in key|first call|CPU-side|  [a-z.]+ hit|  plain|offline|result|kernel checks|elapsed)|passed|failed|error" "$out/$name.log" | tail -40
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# Most informative first: a run cut short by the caller's limit still leaves these logs.
step foreign 120 python3 benchmarks/foreign_gpu_check.py
step thirdparty 60 python3 benchmarks/thirdparty_gpu_check.py
# The jax-version-dependent paths of the runtime (tracing, config layers, real Pallas programs) under this
# image's jax: the suite's CPU tests, run here because CI has one jax version only.
JAX_PLATFORMS=cpu step jax_version 100 python3 -m pytest -q -p no:cacheprovider --timeout 60 -rf \
  tests/test_thirdparty_pallas.py tests/test_runtime_jax_tracing.py tests/test_jax_helper_thread_settings.py \
  tests/test_jax_real_programs.py tests/test_source_hash_values.py tests/test_jax_contexts.py
TRITON_INTERPRET=0 JAX_PLATFORMS=cuda,cpu step dropin_on_gpu 150 python3 -m pytest -q -p no:cacheprovider \
  -p tests._gpu_default_device --timeout 60 -rf tests/test_foreign_kernels.py tests/test_triton_conformance.py \
  tests/test_thirdparty_triton.py tests/test_thirdparty_triton_more.py
# A study on this GPU (device "auto", bf16, the study worker and its measurement processes), its cache
# file exported, then used offline by studies/quickstart_use.py (exact hits, outputs checked).
export TUNER_HOME="$site/home"
cat > "$site/gpu_study.toml" <<'TOML'
[study]
name = "gpu_session"
device = "auto"
backends = ["triton"]
dtypes = ["bfloat16"]
strategy = "auto"
seed = 0
budget = { trials = 10, seconds = 30 }
finalists = 2
[[tasks]]
kernel = "matmul"
problems = [{ M = 512, N = 4096, K = 4096, bias = false, activation = "none" }]
[[tasks]]
kernel = "rmsnorm"
problems = [{ M = 4096, N = 4096 }]
[[tasks]]
kernel = "flash_attention"
problems = [{ B = 1, H = 8, S = 2048, D = 128, causal = true }]
TOML
step study 150 bash -c "python3 -m tuner study run '$site/gpu_study.toml' --quiet && python3 studies/quickstart_use.py '$site/gpu_study.toml' && sed -n 1,12p '$TUNER_HOME/studies/gpu_session/report/report.md'"
step validate 90 python3 benchmarks/gpu_validate.py --out "$site/validate" --max-minutes 1.2 --skip graph_probe --skip matmul --skip attention
TRITON_INTERPRET=0 JAX_PLATFORMS=cuda,cpu TUNER_PALLAS_INTERPRET=0 step gputests 120 python3 -m pytest -q -p no:cacheprovider \
  --timeout 90 tests/test_kernels_gemm_gpu.py tests/test_devices.py::test_cuda_label_names_the_gpu_and_its_capability \
  tests/test_triton_conformance.py::test_gpu_timing_paths tests/test_torch_compile_triton.py tests/test_kernels_wide_offsets.py
step runtime 60 python3 benchmarks/runtime_device_check.py
