"""Without CUDA, Triton kernels run under the interpreter; it must be on before triton is imported."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
