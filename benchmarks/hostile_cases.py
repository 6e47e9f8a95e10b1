"""The hostile inputs of docs/reliability.md, each run as a user would (``probe ...`` in a fresh process), with its exit
code, first and last stderr line, wall time and peak resident memory: the table the reliability work is judged by.

Every case is built in a temporary folder from what the repository ships (the zoo's tiny models, the authors'
fixtures, synthetic corpora), so this runs offline in a few minutes:

    python benchmarks/hostile_cases.py                # prints the table
    python benchmarks/hostile_cases.py --csv out.csv  # and writes it

Exit 2 is bad input, 1 an environment or disk fault, 0 a run that went through (where the case is only bad-looking);
a traceback or a case past --timeout is reported as such.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # benchmarks/kernels.py shadows `kernels`
ROOT = HERE.parent
ZOO = ROOT / "probe" / "zoo"
MUDD = ROOT / "tests" / "fixtures" / "authors" / "muddformer-checkpoint" / "checkpoint"
LR = ROOT / "tests" / "fixtures" / "authors" / "lr-attnres-block-checkpoint" / "final_model.pt"
SMALL = ["--batches", "1", "--batch-size", "2", "--ctx", "16"]
RANDOM = ["--data", "synthetic:random[T=16,n=2]"]


def copy_with(src: Path, dst: Path, **config) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, **config}))
    return dst


def llama_folder(dst: Path, **config) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(dst)
    if config:
        data = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**data, **config}))
    return dst


def lr_with(dst: Path, **model_args) -> Path:
    import torch

    payload = torch.load(LR, weights_only=True)
    payload["model_args"].update(model_args)
    dst.mkdir()
    torch.save(payload, dst / "final_model.pt")
    return dst / "final_model.pt"


def fake_broken_triton(dst: Path) -> Path:
    """A triton package that imports but raises on use, as a half-installed wheel does."""
    pkg = dst / "triton"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "__version__ = '3.9.0'\n"
        "def __getattr__(name):\n"
        "    raise RuntimeError('triton: libcuda.so cannot be loaded (a broken install)')\n"
    )
    return dst


def cases(tmp: Path) -> list[tuple[str, list[str], dict]]:
    """(what, argv after `probe`, extra environment) for each case."""
    surrogates = tmp / "surrogates.jsonl"
    surrogates.write_text("\n".join(json.dumps({"text": "a lone \udcff here " * 20}) for _ in range(8)) + "\n")
    deep = tmp / "deep.jsonl"
    deep.write_text('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    undecodable = Path(os.fsdecode(os.fsencode(tmp) + b"/out\xff"))
    fifo_weights = copy_with(MUDD, tmp / "mudd-fifo")
    (fifo_weights / "model.safetensors").unlink()
    os.mkfifo(fifo_weights / "model.safetensors")
    outside = llama_folder(tmp / "llama-index")
    (outside / "model.safetensors").rename(tmp / "outside.safetensors")
    (outside / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.embed_tokens.weight": "../outside.safetensors"}})
    )
    bad_lock = tmp / "locked"
    bad_lock.mkdir()
    (bad_lock / ".probe.lock").write_text(json.dumps({"pid": "not a number", "host": "x"}))
    planted = tmp / "planted"
    planted.mkdir()
    (planted / "javascript:alert(1)").write_text("x")
    broken = fake_broken_triton(tmp / "broken-triton")
    mudd = ["--model", str(MUDD)]
    return [
        ("ablate --depth drop on a MUDD model", ["ablate", *mudd, *RANDOM, "--ablate", "depth", "--depth", "drop"], {}),
        ("ablate --keep past int64", ["ablate", "--ablate", "evict", "--keep", "9" * 20, "--window", "4"], {}),
        ("ablate --window past int64", ["ablate", "--ablate", "evict", "--keep", "1", "--window", "9" * 20], {}),
        ("ablate --sink-logit 1e39", ["ablate", "--ablate", "phantom", "--sink-logit", "1e39"], {}),
        (
            "llama config of 10^6 layers",
            ["sinks", "--model", str(llama_folder(tmp / "l6", num_hidden_layers=10**6))],
            {},
        ),
        ("MUDD config of 10^9 layers", ["sinks", "--model", str(copy_with(MUDD, tmp / "m9", n_layer=10**9))], {}),
        ("MUDD config of dim 2e28", ["sinks", "--model", str(copy_with(MUDD, tmp / "md", dim=int(2e28)))], {}),
        ("LR-AttnRes model_args dim 2e30", ["sinks", "--model", str(lr_with(tmp / "lr", n_embd=int(2e30)))], {}),
        ("synthetic:random huge n", ["sinks", "--data", "synthetic:random[T=64,n=100000000000]"], {}),
        ("synthetic:random huge T", ["sinks", "--data", "synthetic:random[T=1000000000000,n=2]"], {}),
        ("MUDD weights file is a FIFO", ["sinks", "--model", str(fifo_weights)], {}),
        ("shard index names ../outside", ["sinks", "--model", str(outside)], {}),
        ("jsonl with lone surrogates", ["sinks", "--data", str(surrogates)], {}),
        ("view --text with a lone surrogate", ["view", "--text", "a \udcff b", "--out", str(tmp / "view")], {}),
        ("--out with an undecodable byte", ["sinks", *RANDOM, "--out", str(undecodable)], {}),
        ("deeply nested JSON record", ["sinks", "--data", str(deep)], {}),
        ("broken triton: doctor", ["doctor", "--no-interpreter"], {"PYTHONPATH": str(broken)}),
        ("broken triton: sinks", ["sinks", *RANDOM], {"PYTHONPATH": str(broken)}),
        ("lock file PID not a number", ["sinks", *RANDOM, "--out", str(bad_lock)], {}),
        ("--quiet after a stale lock", ["sinks", *RANDOM, "--out", str(bad_lock), "--quiet"], {}),
        ("results folder with a javascript: file", ["sinks", *RANDOM, "--out", str(planted)], {}),
        (
            "doctor --arch sm_90 without triton",
            ["doctor", "--no-interpreter", "--arch", "sm_90"],
            {"PYTHONPATH": str(broken)},
        ),
        ("--device meta", ["sinks", *RANDOM, "--device", "meta"], {}),
        ("--threads 2^31-1", ["sinks", *RANDOM, "--threads", "2147483647"], {}),
    ]


def run_case(argv: list[str], env: dict, timeout: float) -> dict:
    full = {**os.environ, **env}
    if "PYTHONPATH" in env:  # the fake package first, the repository still importable
        full["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(ROOT)])
    cmd = [sys.executable, "-c", "import sys; from probe.cli import main; sys.exit(main())", *argv]  # `probe ...`
    if argv[0] not in ("doctor", "view"):
        cmd += SMALL
    with tempfile.TemporaryFile() as errf:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf, env=full)
        code: int | str = "timeout"
        while time.perf_counter() - start < timeout:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:  # this child's own rusage: its peak resident memory, not the largest child's so far
                code, peak = os.waitstatus_to_exitcode(status), usage.ru_maxrss
                break
            time.sleep(0.05)
        else:
            proc.kill()
            _, _, usage = os.wait4(proc.pid, 0)
            peak = usage.ru_maxrss
        wall = time.perf_counter() - start
        errf.seek(0)
        err = errf.read().decode("utf-8", "backslashreplace")
    lines = [line for line in err.splitlines() if line.strip()]
    return {
        "exit": code,
        "stderr_lines": len(lines),
        "traceback": "Traceback" in err,
        "first_stderr_line": lines[0][:200] if lines else "",
        "last_stderr_line": lines[-1][:200] if len(lines) > 1 else "",  # the error, after a plan line
        "wall_s": round(wall, 2),
        "peak_mb": round(peak / 1024),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", type=Path, help="also write the table here")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case (default 120)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for what, argv, env in cases(Path(tmp)):
            row = {"case": what, **run_case(argv, env, args.timeout)}
            rows.append(row)
            said = row["last_stderr_line"] or row["first_stderr_line"]
            print(f"{row['exit']!s:>7} {row['wall_s']:6.1f} s {row['peak_mb']:>6} MB  {what}: {said}")
    print(f"load average {os.getloadavg()[0]:.1f} (1 min) at the end")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
