"""The `probe` command end to end, in subprocesses, on tiny models and two 32-token windows."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pandas as pd
import pytest

from tests.support.cli import ENV, WINDOWS, assert_one_line_error, files_under, kill_at_batch, probe

# ------------------------------------------------------------------------------------------------- parser, help


def test_parser_choices_are_the_analyses_own():
    """One source (probe.catalogue, torch-free) for the choices the flags offer and the analyses accept."""
    from probe.analyses import inject, sink_heads
    from probe.cli import flags as cli
    from probe.cli import inject as inject_verb
    from probe.data import windows

    assert cli.JUNK_TYPES is inject.JUNK_TYPES and cli.CUTOFFS is inject.CUTOFFS
    assert inject_verb.DEFAULT_DOSES is inject.DEFAULT_DOSES
    assert cli.PROTOCOLS is sink_heads.PROTOCOLS and cli.WINDOW_MODES is windows.WINDOW_MODES


def test_cli_module_imports_no_heavy_library():
    code = (
        "import sys, probe.cli as c; c.build_parser(); "
        "print(sorted(m for m in ('torch', 'transformers', 'pandas', 'plotly', 'transformer_lens') "
        "if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_help():
    r = probe("--help")
    assert r.returncode == 0
    for verb in ("models", "inject", "sinks", "sources", "gates", "costs", "report", "train", "eval"):
        assert verb in r.stdout
    r = probe("inject", "--help")
    assert r.returncode == 0
    for word in ("--junk", "structured", "own-direction", "--dose", "--cutoff", "--model", "--out", "--json"):
        assert word in r.stdout


# ------------------------------------------------------------------------------------------------- verbs


def test_models(tmp_path):
    r = probe("models", "--json", "--out", tmp_path / "m")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    variants = {row["name"] for row in doc["tables"]["variants"]}
    assert {"baseline", "sink+proj", "attnres-block{N}"} <= variants
    assert "tiny" in {row["name"] for row in doc["tables"]["tiers"]}
    hub = {row["name"]: row["source"] for row in doc["tables"]["checkpoints"] if row["kind"] == "hub"}
    assert hub["pythia-410m"] == "EleutherAI/pythia-410m" and hub["gpt-oss-20b"] == "openai/gpt-oss-20b"
    assert {p.name for p in files_under(tmp_path / "m")} >= {
        "models_variants.csv",
        "models_checkpoints.csv",
        "models.json",
    }
    reads = {row["format"]: row["reads"] for row in doc["tables"]["formats"]}  # the code versions assumed
    assert "attnres_block_count_prior" in reads["lr-attnres"] and "0f5cf7e" in reads["lr-attnres"]
    assert "bf16" in reads["muddformer, muddpythia"] and "fc067b2" in reads["muddformer, muddpythia"]
    for table in ("variants", "checkpoints", "formats"):  # the CSVs hold the same rows as the JSON document
        assert pd.read_csv(tmp_path / "m" / f"models_{table}.csv").to_dict("records") == doc["tables"][table]


def test_models_imports_no_heavy_library_and_lists_each_zoo_models_val_loss():
    """`probe models` answers within a second: no torch, transformers, pandas or plotly on its path."""
    from probe.checkpoints.load import zoo_names

    code = (
        "import contextlib, io, sys\nfrom probe.cli import main\ntext = io.StringIO()\n"
        "with contextlib.redirect_stdout(text):\n    rc = main(['models'])\n"
        "print(rc, sorted(m for m in ('torch', 'transformers', 'pandas', 'plotly') if m in sys.modules))\n"
        "print(text.getvalue())"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    status, text = r.stdout.split("\n", 1)
    assert status == "0 []"
    zoo = dict(line.split(None, 1) for line in text.split("zoo (")[1].split("\n\n")[0].splitlines()[1:])
    assert set(zoo) == {f"probe/{name}" for name in zoo_names()} and len(zoo) >= 6
    assert all(summary.startswith("val loss ") and " on " in summary for summary in zoo.values()), zoo


def test_sinks_default_model_and_text():
    """No --model, no --data: the embedded default model and the bundled WikiText-2 test split."""
    r = probe("sinks", *WINDOWS, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    meta = doc["meta"]
    assert meta["corpus"] == "wikitext-2-test" and meta["tokenizer"] == "probe-bpe-8k" and meta["ctx"] == 32
    assert "sink+proj" in meta["model"]
    if "fresh init" in meta["model"]:
        assert "is not installed; using a freshly initialised tiny sink+proj" in r.stderr
    s = doc["tables"]["summary"][0]
    assert s["uniform_ref"] == pytest.approx(sum(1 / (t + 1) for t in range(1, 32)) / 31)
    assert 0 < s["pos0_share"] < 1 and 0 < s["phantom_share"] < 1 and s["r0"] > 0
    assert len(doc["tables"]["layers"]) == 6  # the tiny tier
    assert [row["epsilon"] for row in doc["tables"]["sink_eps_summary"]] == [0.3]  # Sink^eps by default


def test_sinks_with_eps_list_massive_and_dormant():
    r = probe(
        "sinks",
        "--model",
        "probe/tiny-baseline",
        *WINDOWS,
        "--eps",
        "0.01",
        "0.3",
        "--massive",
        "--dormant",
        "--dormant-corpora",
        "wikitext-2-test",
        "kjv",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    t = json.loads(r.stdout)["tables"]
    assert [row["epsilon"] for row in t["sink_eps_summary"]] == [0.01, 0.3]
    low, high = t["sink_eps_summary"]
    assert low["sink_share"] >= high["sink_share"]  # a lower threshold counts at least as many sink heads
    assert len(t["massive_layers"]) == 7  # six block inputs and the final output
    assert {row["domain"] for row in t["dormant_summary"]} == {"wikitext-2-test", "kjv", "all"}


def test_inject_headline_default(tmp_path):
    """`probe inject --junk structured --dose 0.4` on the embedded default: plan, table, CSV/JSON/HTML."""
    out = tmp_path / "inj"
    r = probe("inject", "--junk", "structured", "--dose", "0.4", *WINDOWS, "--out", out)
    assert r.returncode == 0, r.stderr
    assert "plan: inject" in r.stderr and "1 clean + 1 corrupted" in r.stderr
    assert "structured" in r.stdout and "0.4" in r.stdout and "loss increase" in r.stdout
    names = {p.name for p in files_under(out)}
    assert {"inject_results.csv", "inject_exposure.csv", "inject.json", "inject.html"} <= names
    assert not [n for n in names if n.startswith(".")]  # no staged leftovers
    doc = json.loads((out / "inject.json").read_text())
    (row,) = doc["tables"]["results"]
    assert row["junk"] == "structured" and row["dose"] == 0.4 and row["cutoff"] == "q25"
    assert row["delta"] == pytest.approx(row["loss_corrupted"] - row["loss_clean"], abs=1e-9)
    page = (out / "inject.html").read_text()
    assert "src='plotly.min.js'" in page and "Plotly.newPlot" in page and len(page) < 1_000_000  # shared plotly.js
    figure_at = page.index('class="plotly-graph-div"')
    assert "Loss increase per condition" in page[figure_at:]  # the picture first, then the table
    assert "inject.html" in (out / "index.html").read_text()


def test_inject_every_junk_type(fx):
    r = probe(
        "inject",
        "--model",
        fx["sp"],
        "--data",
        fx["data"],
        *WINDOWS,
        "--junk",
        "all",
        "--dose",
        "0",
        "0.8",
        "--cutoff",
        "q25",
        "median",
        "--json",
        "--quiet",
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    doc = json.loads(r.stdout)
    rows = doc["tables"]["results"]
    assert {x["junk"] for x in rows} == {"structured", "same-context", "gaussian", "random-direction", "own-direction"}
    assert len(rows) == 5 * 2 * 2
    assert all(x["delta"] == 0 for x in rows if x["dose"] == 0)
    assert all(x["delta"] != 0 for x in rows if x["dose"] == 0.8)
    exposure = {x["cutoff"]: x for x in doc["tables"]["exposure"]}
    assert exposure["median"]["quiet_share"] > exposure["q25"]["quiet_share"] > 0


def test_inject_all_skips_own_direction_without_a_projection_gate(fx):
    r = probe(
        "inject",
        "--model",
        fx["base"],
        "--data",
        fx["data"],
        *WINDOWS,
        "--junk",
        "all",
        "--dose",
        "0.4",
        "--no-exposure",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    assert "skipping junk own-direction" in r.stderr
    doc = json.loads(r.stdout)
    assert {x["junk"] for x in doc["tables"]["results"]} == {
        "structured",
        "same-context",
        "gaussian",
        "random-direction",
    }
    assert "exposure" not in doc["tables"]


def test_sinks_hf_checkpoint_quiet_with_out(fx, tmp_path):
    out = tmp_path / "s"
    r = probe("sinks", "--model", fx["llama"], "--data", fx["data"], *WINDOWS, "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert "per layer:" in r.stdout
    import pandas as pd

    summary = pd.read_csv(out / "sinks_summary.csv")
    assert summary["phantom_share"].iloc[0] == 0  # llama has no phantom key
    assert summary["corpus"].iloc[0] == str(fx["data"].resolve())
    assert len(pd.read_csv(out / "sinks_layers.csv")) == 2
    assert len(pd.read_csv(out / "sinks_heads.csv")) == 2 * 4


def test_bos_flags_decide_the_first_token(fx, tmp_path):
    """--bos / --no-bos override docs/definitions.md#bos-rule (no BOS for a tokenizer that does not prepend one), in the
    meta."""
    import json

    from probe.checkpoints.tiny import build_tiny

    llama = build_tiny("llama", tmp_path / "llama")  # its tokenizer has a BOS token but does not add it to text
    words = tmp_path / "words.txt"  # text in the tiny vocabulary (w2 ... w95), one document
    words.write_text(" ".join(f"w{2 + (7 * i) % 94}" for i in range(200)) + "\n")
    runs = {
        flag: probe(
            "sinks", "--model", llama, "--data", words, *WINDOWS, "--json", "--quiet", *([flag] if flag else [])
        )
        for flag in ("", "--bos", "--no-bos")
    }
    for flag, r in runs.items():
        assert r.returncode == 0, (flag, r.stderr)
    meta = {flag: json.loads(r.stdout)["meta"] for flag, r in runs.items()}
    assert [meta[f]["bos"] for f in ("", "--bos", "--no-bos")] == [False, True, False]
    assert meta["--bos"]["ctx"] == meta[""]["ctx"] == 32
    pos0 = {f: json.loads(r.stdout)["tables"]["summary"][0]["pos0_share"] for f, r in runs.items()}
    assert pos0["--bos"] != pos0[""] and pos0["--no-bos"] == pos0[""]  # another token at position 0
    r = probe("sinks", *WINDOWS, "--bos", "--quiet")  # probe-bpe-8k has no BOS token
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "probe sinks: error: --bos: tokenizer 'probe-bpe-8k' has no BOS token; drop --bos"
    ]


def test_sources(fx):
    from probe.analyses.costs import s_src

    r = probe("sources", "--model", fx["ar"], "--data", fx["data"], *WINDOWS, "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    s = doc["tables"]["summary"][0]
    assert s["mode"] == "block" and s["n_sites"] == 4  # 2L+1 read sites; the first has no query
    assert s["S_src"] == s_src(2, 2)  # the model's sources agree with the cost model's count
    sites = doc["tables"]["sites"]
    assert all(1 <= x["neff_mean"] <= x["n_sources"] + 1e-9 for x in sites)


def test_gates(fx):
    r = probe("gates", "--model", fx["sp"], "--data", fx["data"], *WINDOWS, "--min-count", "2", "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    s = doc["tables"]["summary"][0]
    assert s["value_gate"] == "proj" and 0 < s["mean_gate"] < 1 and s["selectivity"] > 0
    gates = [x["mean_gate"] for x in doc["tables"]["tokens"]]
    assert gates and gates == sorted(gates) and all(x["count"] >= 2 for x in doc["tables"]["tokens"])


def test_costs():
    r = probe("costs", "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["tables"]["costs"]
    assert len(rows) == 20
    for x in rows:  # LR-AttnRes 2026 Table 1, four decimals
        assert round(x["added_flops_pct"], 4) == pytest.approx(x["table1_pct"], abs=1e-9), x["label"]
    r = probe("costs", "--d", "128", "--layers", "6", "--mlp", "384")
    assert r.returncode == 0, r.stderr
    assert "d=128, L=6, m=384" in r.stdout and "Block N=8" not in r.stdout  # 8 does not divide 2L = 12
    assert "skipped rows" in r.stderr


def test_eval_matches_the_trainer_evaluate(fx):
    r = probe("eval", "--model", fx["sp"], "--data", fx["data"], *WINDOWS, "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)["tables"]["summary"][0]
    assert json.loads(r.stdout)["meta"]["dtype"] == "float32"  # a --dtype bfloat16 loss says it is one
    import probe as probe_package
    from probe.data import eval_batches, load_corpus
    from probe.train import evaluate

    model = probe_package.load(str(fx["sp"]))
    windows = eval_batches(load_corpus(str(fx["data"])), "probe-bpe-8k", n_batches=1, batch_size=2, ctx=32, seed=0)
    assert s["n_tokens"] == 64 and s["n_windows"] == 2
    assert s["loss"] == pytest.approx(evaluate(model, windows), rel=1e-5)
    assert s["perplexity"] == pytest.approx(math.exp(s["loss"]))


def test_train_killed_and_resumed_equals_uninterrupted(fx, tmp_path):
    """The same command resumes a killed run; it ends with the same weights and metrics as an uninterrupted run."""
    from safetensors.torch import load_file

    def train(out, env=None, steps="6"):
        return probe(
            "train",
            "--variant",
            "sink+proj",
            "--tier",
            "tiny",
            "--seed",
            "1",
            "--data",
            fx["data"],
            "--eval-data",
            fx["data"],
            "--eval-batches",
            "1",
            "--steps",
            steps,
            "--batch-size",
            "2",
            "--ctx",
            "32",
            "--ckpt-every",
            "2",
            "--eval-every",
            "2",
            "--snapshot-every",
            "3",
            "--out",
            out,
            env=env,
        )

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    r = train(whole)
    assert r.returncode == 0
    assert (
        "warning: --warmup 100 >= --steps 6, so the lr would never reach its peak; warming up for 0 steps" in r.stderr
    )
    r = train(cut, kill_at_batch(tmp_path, 5))  # killed while step 5 draws its batch: last checkpoint at step 4
    assert r.returncode != 0 and not (cut / "model").exists() and not (cut / "training.html").exists()
    r = train(cut)
    assert r.returncode == 0, r.stderr
    assert "resuming from step 4" in r.stderr
    page = (cut / "training.html").read_text()
    assert "validation loss" in page and "gradient norm" in page and "plotly" in page.lower()
    # the page loads the run folder's one plotly.min.js (not 4.8 MB inline), and the folder's index links it
    assert len(page) < 1_000_000 and (cut / "plotly.min.js").is_file()
    assert "href='./training.html'" in (cut / "index.html").read_text()
    a, b = load_file(whole / "model" / "model.safetensors"), load_file(cut / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)

    def metrics(path):
        rows = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in row.items() if k != "tokens_per_s"} for row in rows]

    # step 0 (validation only), then every step: a 6-step run logs every max(1, 6 // 50) steps
    assert metrics(whole) == metrics(cut) and [m["step"] for m in metrics(cut)] == list(range(7))
    # a finished run asked for fewer steps kept its 6-step model and printed "step": 6 beside "steps": 4
    # every evaluation takes all the --eval-batches windows (the loop's own cap of 16 mixed two window sets)
    assert json.loads((cut / "train_config.json").read_text())["eval_batches"] == 1
    r = train(cut, steps="4")  # (after the warmup warning its default --warmup gives)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--steps 4: the run in" in r.stderr and "has trained 6 steps already" in r.stderr.strip().splitlines()[-1]
    r = probe("eval", "--model", cut, "--data", fx["data"], *WINDOWS, "--json", "--quiet")  # DIR -> DIR/model
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["meta"]["tokenizer"].endswith("model")  # the tokenizer saved beside the weights
    r = probe(
        "train",
        "--variant",
        "baseline",
        "--tier",
        "tiny",
        "--seed",
        "1",
        "--data",
        fx["data"],
        "--steps",
        "6",
        "--out",
        cut,
    )
    assert_one_line_error(r, "different settings", "--variant 'sink+proj' (now 'baseline')")


def test_train_optimizer_flags_reach_the_trainer(fx, tmp_path):
    """--schedule/--min-lr-ratio/--optimizer/--muon-lr/--weight-decay/--grad-clip/--z-loss/--grad-accum train exactly
    what TrainConfig with those values trains in Python; they are part of the run's identity for resuming."""
    import torch
    from safetensors.torch import load_file

    from probe.data import WindowSampler, load_corpus, load_tokenizer, tokenize_documents
    from probe.models import create
    from probe.train import TrainConfig, train

    flags = dict(
        schedule="linear-warmdown",
        min_lr_ratio=0.0,
        optimizer="muon",
        muon_lr=2e-3,
        weight_decay=0.5,
        grad_clip=0.5,
        z_loss=1e-4,
        grad_accum=2,
    )
    common = [
        "--variant",
        "sink+proj",
        "--tier",
        "tiny",
        "--seed",
        "1",
        "--data",
        fx["data"],
        "--eval-data",
        fx["data"],
        "--eval-batches",
        "1",
        "--steps",
        "3",
        "--batch-size",
        "4",
        "--ctx",
        "32",
        "--lr",
        "1e-3",
        "--warmup",
        "1",
        "--eval-every",
        "0",
        "--ckpt-every",
        "0",
        "--quiet",
    ]
    cli = tmp_path / "cli"
    args = [x for k, v in flags.items() for x in (f"--{k.replace('_', '-')}", v)]
    r = probe("train", *common, *args, "--out", cli)
    assert r.returncode == 0, r.stderr

    torch.manual_seed(0)
    tok = load_tokenizer("probe-bpe-8k")
    sampler = WindowSampler(tokenize_documents(load_corpus(str(fx["data"])), tok), 32, 1, eos_id=tok.eos_token_id)
    model = create("sink+proj", "tiny", seed=1)
    cfg = TrainConfig(
        steps=3, batch_size=4, lr=1e-3, warmup=1, eval_every=0, ckpt_every=0, seed=1, device="cpu", **flags
    )
    train(model, sampler, cfg, tmp_path / "py", progress=False)
    got = load_file(cli / "model" / "model.safetensors")
    assert got.keys() == model.state_dict().keys()
    assert all(torch.allclose(got[k], v, atol=1e-5) for k, v in model.state_dict().items())
    lrs = [json.loads(x)["lr"] for x in (cli / "metrics.jsonl").read_text().splitlines() if '"lr"' in x]
    assert lrs[-1] == pytest.approx(0.0)  # linear warmdown to min_lr_ratio 0

    r = probe("train", *common, *args[:-2], "--grad-accum", "1", "--out", cli)
    assert_one_line_error(r, "different settings", "--grad-accum 2 (now 1)")
    r = probe("train", *common, "--grad-accum", "3", "--out", tmp_path / "bad")
    assert_one_line_error(r, "--grad-accum 3", "--batch-size 4")
    assert not (tmp_path / "bad").exists()
    r = probe("train", *common, "--optimizer", "sgd", "--out", tmp_path / "bad")
    assert_one_line_error(r, "'sgd'", "adamw", "muon")


def test_train_resumes_a_run_recorded_before_the_optimizer_flags(fx, tmp_path):
    """A run directory written before --weight-decay & co. existed resumes with the defaults it was trained with."""
    from probe.cli.train import LATER_KEYS

    out = tmp_path / "run"
    common = [
        "--variant",
        "baseline",
        "--tier",
        "tiny",
        "--data",
        fx["data"],
        "--eval-data",
        fx["data"],
        "--eval-batches",
        "1",
        "--batch-size",
        "2",
        "--ctx",
        "32",
        "--ckpt-every",
        "1",
        "--quiet",
        "--out",
        out,
    ]
    assert probe("train", *common, "--steps", "1").returncode == 0
    run = json.loads((out / "probe_train.json").read_text())
    old = {k: v for k, v in run.items() if k not in LATER_KEYS}
    (out / "probe_train.json").write_text(json.dumps(old))
    r = probe("train", *common, "--steps", "2")
    assert r.returncode == 0, r.stderr
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()][-1] == 2
    assert_one_line_error(
        probe("train", *common, "--steps", "3", "--weight-decay", "0.5"), "--weight-decay 0.1 (now 0.5)"
    )


def test_report_over_the_snapshots_of_a_training_run(fx, tmp_path):
    """`probe train --snapshot-every` keeps the model along training; `probe report --checkpoints RUN` reads them all
    and `--model RUN@stepN` any one of them."""
    run = tmp_path / "run"
    r = probe(
        "train",
        "--variant",
        "sink+proj",
        "--tier",
        "tiny",
        "--seed",
        "1",
        "--data",
        fx["data"],
        "--eval-data",
        fx["data"],
        "--eval-batches",
        "1",
        "--steps",
        "4",
        "--batch-size",
        "2",
        "--ctx",
        "32",
        "--snapshot-every",
        "2",
        "--quiet",
        "--out",
        run,
    )
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (run / "snapshots").iterdir()) == ["step0", "step2", "step4"]
    r = probe("report", "--checkpoints", run, "--data", fx["data"], *WINDOWS, "--quiet", "--out", tmp_path / "rep")
    assert r.returncode == 0, r.stderr
    summary = pd.read_csv(tmp_path / "rep" / "report_summary.csv")
    assert sorted(summary["step"]) == [0, 2, 4] and summary["pos0_share"].nunique() == 3  # three different models
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "training step of" in html
    assert "gradient norm" in html  # the run's training curves beside its sink trend
    one = probe("sinks", "--model", f"{run}@step2", "--data", fx["data"], *WINDOWS, "--json", "--quiet")
    assert one.returncode == 0, one.stderr
    s2 = summary[summary["step"] == 2].iloc[0]
    assert json.loads(one.stdout)["tables"]["summary"][0]["pos0_share"] == pytest.approx(s2["pos0_share"], rel=1e-6)
    assert_one_line_error(
        probe("sinks", "--model", f"{run}@step3", "--data", fx["data"], *WINDOWS), "step3", "step0, step2, step4"
    )
    assert_one_line_error(
        probe("report", "--checkpoints", tmp_path / "rep", "--out", tmp_path / "x"),
        "no training snapshots",
        "--snapshot-every",
    )


# ------------------------------------------------------------------------------------------------- errors

LIGHT_ERRORS = [  # rejected by the parser or before any model is loaded
    (["frobnicate"], ["'frobnicate'", "models", "inject", "report"]),
    (["inject", "--frob", "1"], ["'--frob'", "--dose", "--junk"]),
    (["inject", "--dos", "0.4"], ["'--dos'", "did you mean --dose?"]),
    (["inject", "--junk", "bogus"], ["'bogus'", "structured", "own-direction", "all"]),
    (["inject", "--cutoff", "q10"], ["'q10'", "q25", "median"]),
    (["inject", "--dose", "-0.4"], ["--dose", "'-0.4'", ">= 0"]),
    (["inject", "--dose", "0.4", "nan"], ["--dose", "'nan'"]),
    (["inject", "--dose", "lots"], ["--dose", "'lots'"]),
    (["sinks", "--eps", "1.5"], ["--eps", "'1.5'", "0 <= eps < 1"]),
    (["sinks", "--eps", "0.3", "-0.1"], ["--eps", "'-0.1'", "0 <= eps < 1"]),
    (["sinks", "--batches", "0"], ["--batches", "'0'", "positive integer"]),
    (["sinks", "--batch-size", "0"], ["--batch-size", "'0'", "positive integer"]),
    (["sinks", "--data", "no/such/file.txt"], ["'no/such/file.txt'", "wikitext-2-test", "shakespeare"]),
    (["inject", "--model", "no-such-model-xyz"], ["'no-such-model-xyz'", "offline", "pythia-14m", "local model"]),
    (["sinks", "--model", "pythia-41m"], ["'pythia-41m'", "did you mean pythia-410m?"]),
    (["sinks", "--model", "bb-stickbreakng"], ["no zoo checkpoint", "did you mean bb-stickbreaking?", "probe/bb-"]),
    (["sinks", "--model", "probe/bb-softpik"], ["no zoo checkpoint", "did you mean probe/bb-softpick?"]),
    (["sinks", "--model", "pythia-70m@step1500"], ["'pythia-70m@step1500'", "no checkpoint at step 1500"]),
    (["report", "--checkpoints", "pythia-160m@step1000,step2000"], ["pythia-160m@step1000", "offline"]),
    (["report", "--checkpoints", "step1000,step2000"], ["needs a model and a revision"]),
    (["report"], ["--models", "--checkpoints"]),
]


@pytest.mark.parametrize("args, needles", LIGHT_ERRORS, ids=[" ".join(a) for a, _ in LIGHT_ERRORS])
def test_errors_before_loading(args, needles, tmp_path):
    out = tmp_path / "out"
    extra = ["--out", out] if args[0] not in ("frobnicate",) else []
    assert_one_line_error(probe(*args, *extra), *needles)
    assert files_under(out) == []


MODEL_ERRORS = [  # need the model (or its config) to find the error
    (lambda fx: ["sinks", "--model", fx["sp"], "--data", fx["data"], "--ctx", "100"], ["--ctx 100", "64"]),
    (
        lambda fx: ["sinks", "--model", fx["sp"], "--data", fx["data"], "--ctx", "1"],
        ["--ctx 1 is too short", "choose --ctx 2..64"],
    ),
    (lambda fx: ["sinks", "--model", fx["bad_config"], "--data", fx["data"]], ["cannot read", "bad_config"]),
    (lambda fx: ["inject", "--model", fx["bad_weights"], "--data", fx["data"]], ["cannot read", "bad_weights"]),
    (
        lambda fx: ["inject", "--model", fx["base"], "--data", fx["data"], "--junk", "own-direction"],
        ["own-direction", "projection gate"],
    ),
    (
        lambda fx: ["inject", "--model", fx["sp"], "--data", fx["data"], "--batch-size", "1"],
        ["structured", "--batch-size >= 2"],
    ),
    (lambda fx: ["gates", "--model", fx["base"], "--data", fx["data"], *WINDOWS], ["no value gate"]),
    (lambda fx: ["sources", "--model", fx["sp"], "--data", fx["data"], *WINDOWS], ["no depth routing"]),
    (
        lambda fx: ["sinks", "--model", fx["sp"], "--data", fx["data"], "--batches", "99", "--ctx", "32"],
        ["--batches x --batch-size=792"],
    ),
    (lambda fx: ["train", "--variant", "nope", "--data", fx["data"]], ["'nope'", "baseline", "sink+proj"]),
    (lambda fx: ["train", "--tier", "tiny", "--ctx", "1000", "--data", fx["data"]], ["--ctx 1000", "256"]),
]


@pytest.mark.parametrize("make, needles", MODEL_ERRORS[:3], ids=[n[0] for _, n in MODEL_ERRORS[:3]])
def test_errors_after_loading(make, needles, fx, tmp_path):
    out = tmp_path / "out"
    assert_one_line_error(probe(*make(fx), "--out", out), *needles)
    assert files_under(out) == []


@pytest.mark.parametrize("make, needles", MODEL_ERRORS, ids=[n[0] for _, n in MODEL_ERRORS])
def test_errors_after_loading_in_process(make, needles, fx, tmp_path, capsys, monkeypatch):
    """The same and more cases through ``probe.cli.main`` in this process (one import instead of one per case)."""
    import torch

    from probe.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path / "out"
    try:
        code = main([str(a) for a in make(fx)] + ["--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    r = subprocess.CompletedProcess([], code, *capsys.readouterr())
    assert_one_line_error(r, *needles)
    assert files_under(out) == []


def test_experiment_verb_lists_recipes_and_rejects_unknown_names(tmp_path):
    r = probe("experiment", "--list")
    assert r.returncode == 0 and "superposition" in r.stdout and "decomposition" in r.stdout
    bad = probe("experiment", "no-such-recipe", "--out", tmp_path / "x")
    assert_one_line_error(bad, "no-such-recipe", "superposition")
    assert not (tmp_path / "x").exists()


def test_a_model_trained_at_a_shorter_context_is_a_model_of_that_context(fx, tmp_path):
    """--ctx 32 under a tier of 256: the saved config's n_ctx is 32, so sigmoid's b is -log 32 (Ramapuram et al.: the
    training sequence length) and the folder's default evaluation windows are 32 tokens (the training context)."""
    import math

    import probe as probe_package

    out = tmp_path / "run"
    common = ("--variant", "sigmoid", "--tier", "tiny", "--data", fx["data"], "--eval-data", fx["data"])
    r = probe(
        "train",
        *common,
        "--eval-batches",
        "1",
        "--steps",
        "1",
        "--batch-size",
        "2",
        "--ctx",
        "32",
        "--quiet",
        "--out",
        out,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "model" / "config.json").read_text())["n_ctx"] == 32
    model = probe_package.load(str(out))
    assert model.blocks[0].attn.rule_bias == pytest.approx(-math.log(32))
    r = probe("eval", "--model", out, "--data", fx["data"], "--batches", "1", "--batch-size", "1", "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["meta"]["ctx"] == 32
