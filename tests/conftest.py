"""Session set-up shared by all tests.

Triton runs kernels on CPU tensors only under its interpreter, and TRITON_INTERPRET must be set before triton is
first imported (importing torch._dynamo imports it), so it is set here, before any test module loads.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# tests use tiny tensors: one thread avoids oversubscription overhead (and makes timings steadier)
torch.set_num_threads(1)
