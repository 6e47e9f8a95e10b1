"""Print the table of docs/results/agreement.md ("Agreement with the authors"): probe against every golden fixture,
max |difference| over all compared outputs (logits, mixing weights, read-site outputs), fp64 and fp32. Runs in the
project's venv:

    python scripts/authors/agreement.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "models"))
import test_authors_golden as g  # noqa: E402  (the test's mappings: one definition of how weights are mapped)

ROWS = [
    ("AttnRes full", "attnres-full"),
    ("AttnRes block (N=2)", "attnres-block"),
    ("S-LR full (r=4)", "slr-full"),
    ("S-LR block", "slr-block"),
    ("P-LR full (r=4)", "plr-full"),
    ("P-LR block", "plr-block"),
    ("P-LR block + block mean + log-count prior", "plr-block-mean-prior"),
]


def measured(name: str):
    if name in g.LR_ATTNRES:
        out = []
        for dtype, prefix in ((torch.float64, ""), (torch.float32, "fp32/")):
            model, ids, theirs, _ = g.lr_model(name, dtype)
            out.append(max(g.max_differences(g.probe_lr_outputs(model, ids), theirs, prefix).values()))
        return out
    if name == "attnres-read-fla":
        meta, _, inputs, theirs = g.load_fixture(name)
        return [
            max(g.max_differences(g.probe_attnres_read(inputs, dt, meta["settings"]["rms_eps"]), theirs, p).values())
            for dt, p in ((torch.float64, ""), (torch.float32, "fp32/"))
        ]
    if name == "gpt-oss-sink":
        return [
            max(v for k, v in g.gpt_oss_differences(dt).items() if k != "sdpa/out/torch")
            for dt in (torch.float64, torch.float32)
        ]
    build, outputs = {
        "value-residual": (g.value_residual_model, g.probe_value_residual_outputs),
        "mudd": (g.mudd_model, g.probe_mudd_outputs),
        "denseformer": (g.denseformer_model, g.probe_denseformer_outputs),
    }[name]
    out = []
    for dtype, prefix in ((torch.float64, ""), (torch.float32, "fp32/")):
        model, ids, theirs = (
            build(dtype)
            if name == "value-residual"
            else build(dtype, **{"their_rope_table" if name == "mudd" else "their_rope_angles": dtype == torch.float64})
        )
        out.append(max(g.max_differences(outputs(model, ids), theirs, prefix).values()))
    return out


def main() -> int:
    rows = ROWS + [
        ("AttnRes read (second reference)", "attnres-read-fla"),
        ("value residual (λ = 0.5)", "value-residual"),
        ("DenseFormer", "denseformer"),
        ("MUDD", "mudd"),
        ("gpt-oss sink logit", "gpt-oss-sink"),
    ]
    print("| mechanism | authors' code | max diff fp64 | max diff fp32 |\n|---|---|---:|---:|")
    for label, name in rows:
        meta = g.load_fixture(name)[0]
        f64, f32 = measured(name)
        print(f"| {label} | {meta['repository']}@{meta['commit'][:7]} `{meta['file']}` | {f64:.1e} | {f32:.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
