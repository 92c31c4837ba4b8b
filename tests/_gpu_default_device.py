"""A pytest plugin for a CUDA machine: `python -m pytest -p tests._gpu_default_device ...` with
TRITON_INTERPRET=0 makes CUDA torch's default device, so tests written with CPU tensors for the Triton
interpreter launch their kernels compiled on the GPU instead (tuner's drop-in then takes its compiled
code paths: JITFunction, Triton's launcher, the GPU device label). Without a CUDA device it does nothing.
Not loaded by the test suite itself."""

from __future__ import annotations

import os

if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    import torch

    if torch.cuda.is_available():
        torch.set_default_device("cuda")
