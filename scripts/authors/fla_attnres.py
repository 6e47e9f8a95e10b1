"""Golden outputs of flash-linear-attention's reference AttnRes read (fla-org/flash-linear-attention
``fla/ops/attnres/naive.py``, ``naive_attnres``): a second reference for probe's depth read.

    git -C <mirror> archive <commit> fla/ops/attnres/naive.py | tar -x -C /tmp/fla
    /tmp/authors-venv/bin/python scripts/authors/fla_attnres.py --src /tmp/fla/fla/ops/attnres/naive.py --commit <c>

One read over S = 5 random sources (B, T, d) with a random pseudo-query and an RMSNorm gain of ones, in fp64 and fp32:
the mixed residual and the depth softmax. Writes tests/fixtures/authors/attnres-read-fla/.
"""

from __future__ import annotations

import contextlib

import torch
from common import (
    KEEP_FP64_PATCH,
    git_blob_sha1,
    keep_fp64_through_float,
    load_module,
    source_parser,
    versions,
    write_fixture,
)

REPOSITORY = "fla-org/flash-linear-attention"
FILE = "fla/ops/attnres/naive.py"
SEED, S, B, T, D, EPS = 0, 5, 2, 8, 16, 1e-6


def main(argv=None) -> int:
    ap = source_parser(__doc__, "their naive.py")
    args = ap.parse_args(argv)
    mod = load_module(args.src, "fla_attnres_naive")
    g = torch.Generator().manual_seed(SEED)
    inputs = {
        "query": torch.randn(D, generator=g, dtype=torch.float64),
        "residuals": torch.randn(S, B, T, D, generator=g, dtype=torch.float64) * 3.0,
    }
    outputs = {}
    for dtype, prefix in ((torch.float64, ""), (torch.float32, "fp32/")):
        patch = keep_fp64_through_float() if dtype == torch.float64 else contextlib.nullcontext()
        with torch.no_grad(), patch:
            o, p = mod.naive_attnres(
                inputs["query"].to(dtype),
                list(inputs["residuals"].to(dtype).unbind(0)),
                torch.ones(D, dtype=dtype),
                rms_eps=EPS,
                scale=1.0,
                return_weights=True,
            )
        outputs.update({prefix + "out": o.to(dtype), prefix + "weights": p.to(dtype)})  # B,T,D and S,B,T
    meta = {
        "repository": REPOSITORY,
        "commit": args.commit,
        "file": FILE,
        "file_blob_sha1": git_blob_sha1(args.src),
        "entry": f"naive_attnres(query, list(residuals), rms_weight=ones(D), rms_eps={EPS}, scale=1.0, "
        "return_weights=True)",
        "settings": {"S": S, "B": B, "T": T, "D": D, "rms_eps": EPS},
        "seed": SEED,
        "inputs": {"query": "D, N(0, 1)", "residuals": "S,B,T,D, 3 * N(0, 1)"},
        "outputs": {"out": "B,T,D", "weights": "S,B,T", "fp32/": "the same in fp32"},
        "patches": [KEEP_FP64_PATCH + " (their naive read computes in .float())"],
        "versions": versions("einops"),
        "mapping_to_probe": {
            "query": "the read's query",
            "residuals": "the values, and (AttnRes) the keys",
            "rms_eps": "probe's norm_eps",
        },
        "script": "scripts/authors/fla_attnres.py",
    }
    print(write_fixture("attnres-read-fla", weights={}, inputs=inputs, outputs=outputs, meta=meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
