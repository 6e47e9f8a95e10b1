"""Print the tables of docs/results/agreement.md ("Agreement with the authors"): probe against every golden fixture,
max |difference| over all compared outputs (logits, mixing weights, read-site outputs), fp64 and fp32; then the
released checkpoints' formats through probe.load, max |logit difference| from the authors' forward as shipped, with
their RoPE tables (rope="authors") and probe's (rope="exact"), in fp64, fp32 and bf16, and every version of
LR-AttnRes's model.py and every MUDD config their code runs. Runs in the project's venv:

    python scripts/authors/agreement.py
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file

import probe
from probe.checkpoints import lr_attnres

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "models"))
import test_authors_gated_attention as qiu  # noqa: E402
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
    if name.startswith("gated-attention-"):
        form = name.removeprefix("gated-attention-")
        out = []
        for dtype, prefix in ((torch.float64, ""), (torch.float32, "fp32/")):
            model, ids, theirs = qiu.gated_model(form, dtype)
            out.append(max(g.max_differences(qiu.probe_outputs(model, ids), theirs, prefix).values()))
        return out
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


RELEASED = [  # label, fixture, the checkpoint inside it
    ("MUDDFormer", "muddformer-checkpoint", "checkpoint"),
    ("MUDDPythia", "muddpythia-checkpoint", "checkpoint"),
    ("LR-AttnRes P-LR block, mean + prior", "lr-attnres-block-checkpoint", ""),
    ("LR-AttnRes P-LR full", "lr-attnres-full-checkpoint", ""),
    ("LR-AttnRes baseline", "lr-attnres-baseline-checkpoint", ""),
    ("LR-AttnRes P-LR block, mean (no prior field)", "lr-attnres-324995a-block-checkpoint", ""),
]
DTYPES = ((torch.float64, "logits"), (torch.float32, "fp32/logits"), (torch.bfloat16, "bf16/logits"))


def released_row(fixture: str, inner: str) -> list[float]:
    d = g.FIXTURES / fixture
    ids, theirs = load_file(d / "inputs.safetensors")["input_ids"], load_file(d / "outputs.safetensors")
    out = []
    for rope in ("authors", "exact"):
        for dtype, key in DTYPES:
            with torch.no_grad():
                logits = probe.load(d / inner, dtype=dtype, rope=rope)(ids).logits
            out.append((logits.double() - theirs[key].double()).abs().max().item())
    return out + [(theirs["bf16/logits"].double() - theirs["logits"]).abs().max().item()]


def versions_summary() -> tuple[float, float, int]:
    """(max diff over every run but 0f5cf7e's block runs, min diff of those, runs compared) in fp64."""
    d = g.FIXTURES / "lr-attnres-versions"
    meta, weights, outputs = (
        json.loads((d / "meta.json").read_text()),
        load_file(d / "weights.safetensors"),
        load_file(d / "outputs.safetensors"),
    )
    ids = load_file(d / "inputs.safetensors")["input_ids"]
    agree, prior_only, n = 0.0, float("inf"), 0
    for c in meta["commits"]:
        for case, run in meta["runs"].get(c["commit"], {}).items():
            if "model_args" not in run:
                continue
            w = {k.split("/", 1)[1]: v for k, v in weights.items() if k.startswith(run["weights"] + "/")}
            args = {**meta["defaults"][c["defaults"]], **run["model_args"]}
            with torch.no_grad():
                logits = lr_attnres.from_payload({"model": w, "model_args": args}, case, torch.float64)(ids).logits
            diff = (logits - outputs[run["logits"]]).abs().max().item()
            if c["commit"].startswith("0f5cf7e") and "block" in case:
                prior_only = min(prior_only, diff)
            else:
                agree, n = max(agree, diff), n + 1
    return agree, prior_only, n


def configs_summary() -> tuple[float, int]:
    d = g.FIXTURES / "mudd-configs"
    meta, outputs, inputs = (
        json.loads((d / "meta.json").read_text()),
        load_file(d / "outputs.safetensors"),
        load_file(d / "inputs.safetensors"),
    )
    worst, n = 0.0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for key, v in meta["variants"].items():
            if not v["runs"]:
                continue
            ckpt = Path(tmp) / key
            ckpt.mkdir()
            shutil.copy(d / "checkpoints" / key / "config.json", ckpt)
            shutil.copy(d / "checkpoints" / v["weights_from"] / "model.safetensors", ckpt)
            with torch.no_grad():
                logits = probe.load(ckpt, dtype=torch.float64)(inputs[f"T{v['T']}"]).logits
            worst, n = max(worst, (logits - outputs[key]).abs().max().item()), n + 1
    return worst, n


def main() -> int:
    rows = ROWS + [
        ("AttnRes read (second reference)", "attnres-read-fla"),
        ("value residual (λ = 0.5)", "value-residual"),
        ("DenseFormer", "denseformer"),
        ("MUDD", "mudd"),
        ("gpt-oss sink logit", "gpt-oss-sink"),
        ("G1 output gate, element-wise", "gated-attention-elementwise"),
        ("G1 output gate, headwise", "gated-attention-headwise"),
    ]
    print("| mechanism | authors' code | max diff fp64 | max diff fp32 |\n|---|---|---:|---:|")
    for label, name in rows:
        meta = g.load_fixture(name)[0]
        f64, f32 = measured(name)
        print(f"| {label} | {meta['repository']}@{meta['commit'][:7]} `{meta['file']}` | {f64:.1e} | {f32:.1e} |")
    warnings.simplefilter("ignore")
    print(
        "\n| checkpoint | written by | saved | authors' tables fp64 / fp32 / bf16 | probe's fp32 table fp64 / fp32 /"
        " bf16 | their bf16 vs their fp64 |\n|---|---|---|---|---|---:|"
    )
    for label, fixture, inner in RELEASED:
        meta = json.loads((g.FIXTURES / fixture / "meta.json").read_text())
        v = released_row(fixture, inner)
        saved = meta.get("saved_dtype", "float64" if "mudd" in fixture else "float32")
        print(
            f"| {label} | {meta['repository']}@{meta['commit'][:7]} | {saved} | "
            f"{v[0]:.1e} / {v[1]:.1e} / {v[2]:.1e} | {v[3]:.1e} / {v[4]:.1e} / {v[5]:.1e} | {v[6]:.1e} |"
        )
    agree, prior_only, n = versions_summary()
    print(f"\nLR-AttnRes versions: {n} runs agree to {agree:.1e} (fp64); 0f5cf7e's block runs: >= {prior_only:.2f}")
    worst, n = configs_summary()
    print(f"MUDD configs their code runs: {n} variants agree to {worst:.1e} (fp64)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
