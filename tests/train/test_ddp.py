"""DDP under torchrun (gloo, CPU): 2 processes train exactly the data 1 process trains, and match its losses.

Run as a script by torchrun (the worker), or by pytest (spawns torchrun in a subprocess and compares).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from probe.train import TrainConfig, train
from tests.train.test_train import TinySampler, eval_windows, tiny_model

REPO = Path(__file__).resolve().parents[2]
TOL = 1e-5  # losses and weights: 2 ranks × 2 micro-batches vs 1 full batch differ only in float summation order


def config(grad_accum: int) -> TrainConfig:
    return TrainConfig(
        steps=4,
        batch_size=8,
        grad_accum=grad_accum,
        lr=3e-3,
        warmup=1,
        log_every=1,
        ckpt_every=2,
        eval_every=2,
        device="cpu",
    )


def test_two_processes_match_one(tmp_path):
    single, batches = tiny_model(), []
    train(
        single,
        TinySampler(record=batches),
        config(grad_accum=1),
        tmp_path / "single",
        eval_batches=eval_windows(1),
        progress=False,
    )
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        __file__,
        str(tmp_path / "ddp"),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    rows = {
        name: [json.loads(l) for l in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        for name in ("single", "ddp")
    }
    assert [r["step"] for r in rows["ddp"]] == [0, 1, 2, 3, 4]  # one writer: no line per rank (0: validation only)
    for key in ("loss", "grad_norm", "val_loss"):
        a = [r[key] for r in rows["single"] if key in r]
        b = [r[key] for r in rows["ddp"] if key in r]
        assert len(a) == len(b) > 0
        diff = float(np.max(np.abs(np.subtract(a, b))))
        print(f"max |single - ddp| {key}: {diff:.3g}")
        assert diff < TOL, (key, a, b)
    assert rows["single"][-1]["tokens"] == rows["ddp"][-1]["tokens"]
    rows0, rows1 = (load_file(tmp_path / "ddp" / f"rows{r}.safetensors") for r in (0, 1))
    assert len(rows0) == len(rows1) == len(batches) == 4
    for i, batch in enumerate(batches):  # rank r trained rows 4r..4r+3 of the single process's global batch
        assert torch.equal(rows0[str(i)], batch[:4]) and torch.equal(rows1[str(i)], batch[4:])
    weights = load_file(tmp_path / "ddp" / "checkpoint" / "model.safetensors")
    shared = [n for n in single.state_dict() if n in weights]
    assert len(shared) >= len(list(single.parameters()))
    wdiff = max((weights[n] - single.state_dict()[n]).abs().max().item() for n in shared)
    print(f"max |single - ddp| final weights: {wdiff:.3g}")
    assert wdiff < TOL


def test_probe_train_under_torchrun_matches_one_process(tmp_path):
    """`torchrun --nproc_per_node 2 -m probe.cli train ...` trains what the same command trains in one process; only
    rank 0 writes the run's files and reports."""
    data = str(REPO / "probe" / "data" / "corpora" / "wikitext-2-valid.txt")
    flags = [
        "train",
        "--variant",
        "sink+proj",
        "--tier",
        "tiny",
        "--data",
        data,
        "--eval-data",
        data,
        "--eval-batches",
        "1",
        "--steps",
        "3",
        "--batch-size",
        "4",
        "--ctx",
        "32",
        "--warmup",
        "1",
        "--quiet",
    ]
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}
    one = subprocess.run(
        [sys.executable, "-m", "probe.cli", *flags, "--out", str(tmp_path / "one")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "probe.cli",
            *flags,
            "--out",
            str(tmp_path / "two"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    assert two.stdout.count("model saved to") == 1 and (tmp_path / "two" / "training.html").is_file()
    a, b = (load_file(tmp_path / run / "model" / "model.safetensors") for run in ("one", "two"))
    assert a.keys() == b.keys()
    wdiff = max((a[n].float() - b[n].float()).abs().max().item() for n in a)
    print(f"max |one process - torchrun| final weights: {wdiff:.3g}")
    assert wdiff < TOL


if __name__ == "__main__":  # the torchrun worker: each rank trains 4 of the 8 windows, in 2 micro-batches of 2
    from safetensors.torch import save_file

    import probe.train.distributed as D

    out, seen, shard = Path(sys.argv[1]), [], D.shard
    D.shard = lambda batch, info: seen.append(shard(batch, info)) or seen[-1]  # record this rank's rows
    train(tiny_model(), TinySampler(), config(grad_accum=2), out, eval_batches=eval_windows(1), progress=False)
    save_file({str(i): t.contiguous() for i, t in enumerate(seen)}, str(out / f"rows{os.environ['RANK']}.safetensors"))
    D.cleanup()
