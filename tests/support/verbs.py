"""Every model verb of the CLI, in process, on a saved tiny folder of one model_type: what "supported" in the
coverage table rests on (docs/reference/architectures.md) and what tests/cli/test_verbs_per_family.py runs for one
type per adapter family.

A verb passes when it exits 0 and writes its tables, or when it refuses in one line for a reason of the model that
applies to every model lacking the mechanism (no value or output gate for ``gates``, no depth routing for
``sources``); any other exit, an internal error or a traceback fails it.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

import torch

WINDOWS = ["--batches", "1", "--batch-size", "2", "--ctx", "16"]
TEXT = "w3 w4 w5 w6 w7 w8"
# (verb, its arguments after --model/--models FOLDER, the files a success writes)
VERBS = (
    ("sinks", ["--massive", "--dormant", *WINDOWS], ["sinks_layers.csv", "sinks_heads.csv"]),
    ("inject", ["--cutoff", "median", "--dose", "0.8", *WINDOWS], ["inject_exposure_layers.csv"]),
    ("ablate", ["--ablate", "knockout", "value", "evict", "--window", "4", "--keep", "1", *WINDOWS],
     ["ablate_results.csv"]),
    ("gates", ["--min-count", "2", *WINDOWS], ["gates_layers.csv"]),
    ("sources", WINDOWS, []),
    ("eval", WINDOWS, ["eval_summary.csv"]),
    ("view", ["--text", TEXT], ["view.html"]),
    ("report", WINDOWS, ["report_layers.csv"]),
)  # fmt: skip
# one-line refusals that say the model lacks what the verb measures: the verb applies to no such model
NOT_APPLICABLE = {
    "gates": "has no value gate or output gate",
    "sources": "has no depth routing",
    "ablate": "attention rows, which take no",  # signed rows (differential attention): no knockout, no eviction
}


def save_tiny(model_type: str, folder: Path, dtype=torch.float32, config=None) -> Path:
    """A tiny random model of ``model_type`` (its tiny config, or ``config``) and the tiny tokenizer, saved."""
    from transformers import AutoModelForCausalLM

    from probe.checkpoints.tiny import tiny_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config or tiny_config(model_type), attn_implementation="eager")
    model.to(dtype).save_pretrained(folder)
    save_tokenizer(folder)
    return folder


def save_tokenizer(folder) -> None:
    """The tiny tokenizer beside a saved tiny model: what the CLI's windows are made with."""
    from probe.checkpoints.tiny import tiny_tokenizer

    tiny_tokenizer().save_pretrained(folder)


def text_files(folder: Path) -> list[Path]:
    """Two small text files in ``folder`` (written once): a verb's ``--data`` and, with it, ``--dormant``'s two input
    domains. Tokenizing a bundled corpus's first documents costs about a second per verb, most of a tiny model's run."""
    files = [folder / "text_a.txt", folder / "text_b.txt"]
    for k, path in enumerate(files):
        if not path.exists():
            path.write_text("\n\n".join(" ".join(f"w{(7 * i + k + d) % 40}" for i in range(120)) for d in range(3)))
    return files


def run_verb(verb: str, folder: Path, out: Path, texts: list[Path] | None = None) -> str:
    """``probe VERB --model FOLDER ... --out OUT --quiet`` in process: "ok", "n/a: <line>" or "failed: <why>".
    ``texts`` (text_files): read them instead of the default corpora (``view`` keeps its --text)."""
    from probe.cli.main import main

    args = dict((v, a) for v, a, _ in VERBS)[verb]
    if texts is not None and verb != "view":
        args = [*args, "--data", str(texts[0])]
        args += ["--dormant-corpora", *map(str, texts)] if verb == "sinks" else []
    model_flag = "--models" if verb == "report" else "--model"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main([verb, model_flag, str(folder), *args, "--out", str(out), "--quiet"])
        except BaseException as e:  # noqa: BLE001 - a verb that raises past the CLI's handler is a failure
            return f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    err = stderr.getvalue().strip()
    if code == 2 and verb in NOT_APPLICABLE and NOT_APPLICABLE[verb] in err and len(err.splitlines()) == 1:
        return f"n/a: {err}"
    if code != 0:
        return f"failed: exit {code}: {err.splitlines()[-1] if err else ''}"
    missing = [f for v, _, files in VERBS if v == verb for f in files if not (out / f).is_file()]
    return f"failed: wrote no {', '.join(missing)}" if missing else "ok"


def run_every_verb(folder: Path, small_texts: bool = False) -> dict[str, str]:
    """Each model verb's outcome on ``folder`` (see ``run_verb``), each writing into its own temporary folder; with
    ``small_texts`` on two small text files instead of the bundled corpora."""
    with tempfile.TemporaryDirectory() as tmp:
        texts = text_files(Path(tmp)) if small_texts else None
        return {verb: run_verb(verb, folder, Path(tmp) / verb, texts) for verb, _, _ in VERBS}


def failures(outcomes: dict[str, str]) -> list[str]:
    """``verb: why`` for each verb that failed."""
    return [f"{verb}: {o.removeprefix('failed: ')}" for verb, o in outcomes.items() if o.startswith("failed")]
