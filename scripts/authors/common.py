"""Shared pieces of the golden-fixture scripts: seeded random weights, byte-stable files, the provenance record.

Not part of the probe package and never imported by it. The scripts run the authors' own code, imported from a path
given on the command line (their code is not copied here), in a throwaway venv: see scripts/authors/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import platform
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "authors"


def source_parser(doc: str, src_help: str) -> argparse.ArgumentParser:
    """The command line every script takes: --src (where the authors' files were exported) and --commit (recorded)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--src", type=Path, required=True, help=src_help)
    ap.add_argument("--commit", required=True, help="the commit the files were taken from (recorded in meta.json)")
    return ap


def load_module(path: Path, name: str, extra_sys_path: Path | None = None):
    """Import the authors' file at ``path`` as module ``name`` (its folder on sys.path for its sibling imports)."""
    path = Path(path).resolve()
    sys.path.insert(0, str(extra_sys_path or path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def git_blob_sha1(path: Path) -> str:
    """The file's git blob id: ties the file that ran to the pinned commit (``git ls-tree <commit> <file>``)."""
    data = Path(path).read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int, skip=()) -> None:
    """Every parameter (except names in ``skip``) drawn N(0, 1/fan-in) (1-d: N(0, 1)) from one seeded generator, in
    the module's parameter order, in fp64: weights large enough that a wrong mapping moves the logits by O(1)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name in skip:
            continue
        std = 1.0 if p.dim() == 1 else 1.0 / math.sqrt(p.shape[-1])
        p.copy_((torch.randn(p.shape, generator=g, dtype=torch.float64) * std).to(p.dtype))


@contextlib.contextmanager
def keep_fp64_through_float():
    """``Tensor.float()`` returns fp64 tensors unchanged while active. The authors' reads upcast with ``.float()``
    (their models run in bf16, so that means "at least fp32"); in an fp64 run it would truncate to fp32."""
    original = torch.Tensor.float

    def float_keeping_fp64(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else original(self, *args, **kwargs)

    torch.Tensor.float = float_keeping_fp64
    try:
        yield
    finally:
        torch.Tensor.float = original


@contextlib.contextmanager
def keep_fp64_through_fp32_casts():
    """While active, ``Tensor.to(torch.float32)`` of an fp64 tensor and ``F.softmax(x, dtype=torch.float32)`` of an
    fp64 x stay fp64 (HF-style code upcasts bf16 to fp32 that way; in an fp64 run it would truncate)."""
    to, softmax = torch.Tensor.to, torch.nn.functional.softmax

    def to_keeping_fp64(self, *args, **kwargs):
        target = kwargs.get("dtype", args[0] if args and isinstance(args[0], torch.dtype) else None)
        if self.dtype == torch.float64 and target == torch.float32 and len(args) <= 1 and set(kwargs) <= {"dtype"}:
            return self
        return to(self, *args, **kwargs)

    def softmax_keeping_fp64(x, *args, dtype=None, **kwargs):
        return softmax(x, *args, dtype=None if x.dtype == torch.float64 else dtype, **kwargs)

    torch.Tensor.to, torch.nn.functional.softmax = to_keeping_fp64, softmax_keeping_fp64
    try:
        yield
    finally:
        torch.Tensor.to, torch.nn.functional.softmax = to, softmax


KEEP_FP64_CASTS_PATCH = (
    "Tensor.to(torch.float32) of an fp64 tensor and F.softmax(x, dtype=torch.float32) of an "
    "fp64 x stay fp64 during the fp64 run (their upcasts for bf16 would truncate fp64 to fp32); "
    "the fp32 run is unpatched"
)
KEEP_FP64_PATCH = (
    "torch.Tensor.float returns fp64 tensors unchanged during the fp64 run (the authors upcast with "
    ".float(), which would truncate fp64 to fp32); the fp32 run is unpatched"
)


FP64_CONSTANTS_PATCH = (
    "torch.tensor / torch.as_tensor with dtype=torch.float32, and Tensor.to(..., dtype=torch.float32) of an fp64 "
    "tensor, give fp64 during the fp64 run (their block log-count prior and powers are built as fp32 tensors, which "
    "would round log(count) to fp32 in an fp64 model)"
)


@contextlib.contextmanager
def fp64_constants():
    """While active, fp32 tensors their forward builds from Python numbers (or casts fp64 ones to) are fp64."""
    tensor, as_tensor, to = torch.tensor, torch.as_tensor, torch.Tensor.to

    def widen(kwargs):
        return {**kwargs, "dtype": torch.float64} if kwargs.get("dtype") == torch.float32 else kwargs

    def to_keeping_fp64(self, *args, **kwargs):
        if self.dtype == torch.float64 and kwargs.get("dtype") == torch.float32:
            kwargs = {**kwargs, "dtype": torch.float64}
        return to(self, *args, **kwargs)

    torch.tensor = lambda *a, **k: tensor(*a, **widen(k))
    torch.as_tensor = lambda *a, **k: as_tensor(*a, **widen(k))
    torch.Tensor.to = to_keeping_fp64
    try:
        yield
    finally:
        torch.tensor, torch.as_tensor, torch.Tensor.to = tensor, as_tensor, to


def versions(*packages: str) -> dict:
    out = {"python": platform.python_version()}
    for p in ("torch", "safetensors", "numpy", *packages):
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = None
    return out


def contiguous(tensors: dict) -> dict:
    return {k: v.detach().contiguous().cpu() for k, v in tensors.items()}


def write_fixture(name: str, *, weights: dict, inputs: dict, outputs: dict, meta: dict) -> Path:
    """tests/fixtures/authors/<name>/{weights,inputs,outputs}.safetensors and meta.json, byte-stable across runs."""
    out = FIXTURES / name
    out.mkdir(parents=True, exist_ok=True)
    save_file(contiguous(weights), out / "weights.safetensors")
    save_file(contiguous(inputs), out / "inputs.safetensors")
    save_file(contiguous(outputs), out / "outputs.safetensors")
    (out / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return out


# The tiny random Llama the diagnostic references (massive.py, dormant.py) run on: the authors' analysis code targets
# HF Llama models, and probe reads the same weights through its llama adapter.
TINY_LLAMA = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=1,
)


def tiny_llama(seed: int, dtype=torch.float64):
    """A transformers LlamaForCausalLM of TINY_LLAMA with eager attention, every parameter drawn by ``randomize``
    in fp64 (then cast to ``dtype``): the same weights for the same seed in every script."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA, attn_implementation="eager")).to(torch.float64)
    randomize(model, seed)
    return model.to(dtype).eval()


def token_windows(seed: int, n: int, T: int, vocab: int) -> torch.Tensor:
    """(n, T) seeded uniform token ids, no BOS (both diagnostics' scripts tokenize with add_special_tokens=False)."""
    return torch.randint(0, vocab, (n, T), generator=torch.Generator().manual_seed(seed))
