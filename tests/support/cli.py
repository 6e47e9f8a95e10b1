"""Helpers for the tests of the command line: the `probe` command in a process of its own (forked from a zygote that
has imported the libraries, tests/support/forked_cli.py, or started cold where a test sets its environment), tiny
saved models, and faults injected into a cold process.

These processes run with one torch thread (tiny tensors on a busy 2-core machine are many times faster single-threaded)
and with the hub marked offline (offline errors come at once instead of after a connection timeout).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support import SMALL, forked_cli  # SMALL: the tiny tier shrunk; vocabulary stays 8192

REPO = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONWARNINGS": "ignore",
}
WINDOWS = ["--batches", "1", "--batch-size", "2", "--ctx", "32"]  # two windows of 32 tokens


def probe(*args, env=None, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    """Run ``python -m probe.cli ARGS`` in a new process; stdout / stderr decoded as they were written (carriage
    returns kept). Without ``env`` the process is forked from a zygote that has imported the libraries already
    (tests/support/forked_cli.py), with ``env`` it starts cold."""
    if env is None and not forked_cli.cold():
        r = forked_cli.run_forked([str(a) for a in args], ENV, None if cwd is None else str(cwd), timeout)
    else:
        r = subprocess.run(
            [sys.executable, "-m", "probe.cli", *map(str, args)],
            capture_output=True,
            env={**ENV, **(env or {})},
            cwd=cwd,
            timeout=timeout,
        )
    r.stdout, r.stderr = r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
    return r


def patched(tmp_path: Path, code: str) -> dict[str, str]:
    """Environment for a subprocess that runs ``code`` at start-up: a ``sitecustomize`` module in a folder put first
    on PYTHONPATH. This is how a test injects a fault (a kill at a chosen point) into the `probe` command: production
    code has no test hooks."""
    folder = tmp_path / f"site-{len(list(tmp_path.glob('site-*')))}"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(textwrap.dedent(code))
    return {"PYTHONPATH": os.pathsep.join([str(folder), str(REPO), *filter(None, [ENV.get("PYTHONPATH")])])}


def kill_at_batch(tmp_path: Path, n: int) -> dict[str, str]:
    """SIGKILL the process when its training sampler draws its n-th batch (that is, at step n)."""
    return patched(
        tmp_path,
        f"""
        import os, signal
        from probe.data.batches import WindowSampler

        _sample, _calls = WindowSampler.sample, [0]

        def sample(self, batch_size):
            _calls[0] += 1
            if _calls[0] == {n}:
                os.kill(os.getpid(), signal.SIGKILL)
            return _sample(self, batch_size)

        WindowSampler.sample = sample
    """,
    )


def kill_at_model_result(tmp_path: Path, n: int, *, staged: bool) -> dict[str, str]:
    """SIGKILL a `probe report` process at the n-th model result it writes (a rename into DIR/models/): after the
    rename, or with ``staged`` just before it (the result is written under its temporary name, never renamed)."""
    return patched(
        tmp_path,
        f"""
        import os, signal
        from pathlib import Path

        _replace, _results = os.replace, [0]

        def replace(src, dst, *args, **kwargs):
            if Path(dst).parent.name != "models" or Path(dst).suffix != ".json":
                return _replace(src, dst, *args, **kwargs)
            _results[0] += 1
            if _results[0] == {n} and {staged}:
                os.kill(os.getpid(), signal.SIGKILL)
            _replace(src, dst, *args, **kwargs)
            if _results[0] == {n}:
                os.kill(os.getpid(), signal.SIGKILL)

        os.replace = replace
    """,
    )


def terminal_lines(text: str) -> list[str]:
    """The non-empty lines a terminal shows for ``text``: after each carriage return only what follows it stays
    (progress bars redraw and erase themselves with \r)."""
    return [seg.split("\r")[-1] for seg in text.split("\n") if seg.split("\r")[-1].strip()]


def assert_one_line_error(r, *needles):
    """Exit code 2, exactly one line left on the terminal's stderr, no traceback, every needle in that line."""
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    lines = terminal_lines(r.stderr)
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in Path(path).rglob("*")) if Path(path).exists() else []


def build_fixtures(root: Path) -> dict[str, Path]:
    """Saved tiny models (custom sink+proj, baseline, attnres-block2; a random llama with the shipped tokenizer),
    a small text file cut from the bundled WikiText-2 test split, and two unreadable checkpoints."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from probe.data import load_tokenizer
    from probe.data.corpus import CORPUS_DIR
    from probe.models import create

    out = {}
    for variant, name in (("sink+proj", "sp"), ("baseline", "base"), ("attnres-block2", "ar")):
        model = create(variant, seed=0, **SMALL)
        with torch.no_grad():  # untrained gates, sinks and routing queries are constants: give them values
            g = torch.Generator().manual_seed(1)
            for n, p in model.named_parameters():
                if n.endswith(("gate.w", "read.query", "attn.sink")):
                    p.copy_(torch.randn(p.shape, generator=g))
        model.save_pretrained(root / name)
        out[name] = root / name
    tok = load_tokenizer("probe-bpe-8k")
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    AutoModelForCausalLM.from_config(cfg).save_pretrained(root / "llama")
    tok.save_pretrained(root / "llama")
    out["llama"] = root / "llama"
    text = (CORPUS_DIR / "wikitext-2-test.txt").read_text(encoding="utf-8")[:40000]
    (root / "small.txt").write_text(text, encoding="utf-8")
    out["data"] = root / "small.txt"
    (root / "bad_config").mkdir()
    (root / "bad_config" / "config.json").write_text("{not json")
    out["bad_config"] = root / "bad_config"
    (root / "bad_weights").mkdir()
    (root / "bad_weights" / "config.json").write_text((root / "sp" / "config.json").read_text())
    (root / "bad_weights" / "model.safetensors").write_bytes(b"garbage")
    out["bad_weights"] = root / "bad_weights"
    return out
