"""Golden outputs of DenseFormer (epfml/DenseFormer ``experiments/models/denseformer.py``).

    git -C <mirror> archive <commit> experiments/models | tar -x -C /tmp/denseformer
    /tmp/authors-venv/bin/python scripts/authors/denseformer.py --src /tmp/denseformer/experiments --commit <commit>

Their ``DenseFormer`` (GPT-2 blocks without biases, their rotary encoder, tied embeddings, depth-weighted averages
after every block: dilation 1, period 1) at a tiny size with seeded random weights (the DWA weights included, so the
averages are not one-hot; LayerNorm gains keep their ones), one batch in fp64 and in fp32: logits and each block's
averaged output. Writes tests/fixtures/authors/denseformer/.
"""

from __future__ import annotations

import contextlib
import sys
import types
from pathlib import Path

import torch
from common import (
    KEEP_FP64_PATCH,
    git_blob_sha1,
    keep_fp64_through_float,
    randomize,
    source_parser,
    versions,
    write_fixture,
)

REPOSITORY = "epfml/DenseFormer"
FILE = "experiments/models/denseformer.py"
SETTINGS = dict(
    vocab_size=32,
    sequence_length=16,
    n_embd=16,
    n_head=2,
    n_layer=3,
    bias=False,
    dropout=0.0,
    increase_T_every=1,
    dilation_factor=1,
    lm_cache="none",
    positional_encoder="rotary",
    attention_window_length=None,
)
SEED, BATCH, T = 0, 2, 8
MAPPING = {
    "lm_head.weight (= transformer.wte.weight, tied)": "embed.weight (probe tie_embeddings=True)",
    "transformer.h.{l}.0.attn.c_attn.weight": "rows [0:d] -> blocks.{l}.attn.q_proj, [d:2d] -> k_proj, [2d:3d] -> "
    "v_proj; q and k rows permuted within each head from their "
    "interleaved rotary pairs (2i, 2i+1) to probe's rotate-half (i, i+dh/2)",
    "transformer.h.{l}.0.attn.c_proj.weight": "blocks.{l}.attn.o_proj.weight",
    "transformer.h.{l}.0.mlp.c_fc / c_proj": "blocks.{l}.mlp.up / down (probe mlp='gelu')",
    "transformer.h.{l}.0.ln_1 / ln_2, transformer.ln_f": "blocks.{l}.ln1 / ln2, ln_f (probe norm='layer', no bias, "
    "eps 1e-5)",
    "weights.{l}.weight (1, l+2)": "blocks.{l}.dense.bias (1, l+2)",
    "rotary": "their angles (positions x 10**(-4*2i/dh)) are recorded in tables/rope_angles; the fp64 test gives "
    "probe's Rotary their cos/sin of them (10**(-4x) and probe's 1/10000**x differ by an ulp)",
}


def import_theirs(src: Path):
    # tiktoken.get_encoding("gpt2") in their constructor downloads a vocabulary; the model never uses it
    sys.modules.setdefault("tiktoken", types.SimpleNamespace(get_encoding=lambda name: None))
    sys.path.insert(0, str(src))
    import models.denseformer as denseformer  # noqa: E402  (their package, from --src)
    import models.positional_encoders.rotary as rotary

    return denseformer, rotary


@contextlib.contextmanager
def recording(denseformer, rotary, record: dict):
    """The averaged stream after each block (their tensordot) and the rotary angles (their apply_rotary_emb)."""
    tensordot, apply_rotary = torch.tensordot, rotary.apply_rotary_emb
    count = [0]

    def recording_tensordot(*args, **kwargs):
        out = tensordot(*args, **kwargs)
        record[f"stream.{count[0]}"] = out
        count[0] += 1
        return out

    def recording_rotary(freqs, t, *args, **kwargs):
        record.setdefault("tables/rope_angles", freqs.reshape(-1, *freqs.shape[-2:])[0])  # T, hs
        return apply_rotary(freqs, t, *args, **kwargs)

    torch.tensordot, rotary.apply_rotary_emb = recording_tensordot, recording_rotary
    try:
        yield
    finally:
        torch.tensordot, rotary.apply_rotary_emb = tensordot, apply_rotary


def build(denseformer, dtype):
    return denseformer.DenseFormer(types.SimpleNamespace(**SETTINGS)).to(dtype).eval()


@contextlib.contextmanager
def default_dtype(dtype):
    """Their InPlaceSetSlice builds ``torch.Tensor()`` (the default dtype) and set_()s it to the accumulator."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def run(denseformer, rotary, weights: dict, ids: torch.Tensor, dtype) -> dict:
    model = build(denseformer, dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, strict=True)
    record: dict = {}
    patch = keep_fp64_through_float() if dtype == torch.float64 else contextlib.nullcontext()
    with torch.no_grad(), patch, default_dtype(dtype), recording(denseformer, rotary, record):
        record["logits"] = model(ids, targets=ids, get_logits=True)["logits"]  # targets: logits at every position
    return {k: v.to(dtype) for k, v in record.items()}


def main(argv=None) -> int:
    ap = source_parser(__doc__, "their experiments folder (holding models/)")
    args = ap.parse_args(argv)
    denseformer, rotary = import_theirs(args.src)
    model = build(denseformer, torch.float64)
    randomize(model, SEED, skip={n for n, _ in model.named_parameters() if ".ln_" in n})  # LayerNorm gains: ones
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, SETTINGS["vocab_size"], (BATCH, T), generator=torch.Generator().manual_seed(SEED + 1))
    outputs = run(denseformer, rotary, weights, ids, torch.float64)
    outputs.update({f"fp32/{k}": v for k, v in run(denseformer, rotary, weights, ids, torch.float32).items()})
    files = [
        "models/denseformer.py",
        "models/positional_encoders/rotary.py",
        "models/positional_encoders/rotary_utils.py",
        "models/positional_encoders/encoder.py",
    ]
    meta = {
        "repository": REPOSITORY,
        "commit": args.commit,
        "file": FILE,
        "file_blob_sha1": git_blob_sha1(args.src / "models/denseformer.py"),
        "also_imported": {f"experiments/{f}": git_blob_sha1(args.src / f) for f in files[1:]},
        "entry": "DenseFormer(SimpleNamespace(**settings)).eval()(input_ids, targets=input_ids, get_logits=True)",
        "settings": SETTINGS,
        "seed": SEED,
        "inputs": {"shape": [BATCH, T]},
        "weights": f"every parameter except the LayerNorm gains (their ones) N(0, 1/fan-in) (1-d: N(0, 1)) in "
        f"fp64 from torch.Generator seed {SEED}, in their parameter order (DWA weights included)",
        "outputs": {
            "logits": "B,T,V",
            "stream.{l}": "B,T,d: the depth-weighted average after block l",
            "tables/rope_angles": "T, d_head: their rotary angles (interleaved pairs)",
            "fp32/": "the same in fp32",
        },
        "patches": [
            KEEP_FP64_PATCH,
            "torch's default dtype is the run's dtype during the forward (their "
            "InPlaceSetSlice set_()s an empty default-dtype tensor to the accumulator)",
            "tiktoken replaced by a stub whose get_encoding returns None (their "
            "constructor loads the GPT-2 vocabulary, which needs a download; the model does not use it)",
        ],
        "versions": versions(),
        "mapping_to_probe": MAPPING,
        "script": "scripts/authors/denseformer.py",
    }
    print(write_fixture("denseformer", weights=weights, inputs={"input_ids": ids}, outputs=outputs, meta=meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
