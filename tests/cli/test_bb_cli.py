"""Bigram-Backcopy on the command line and in the zoo: the shipped probe/bb-<variant> models reproduce their
recorded statistics and the sink-emergence check's relations (docs/definitions.md#sink-emergence-check);
``probe sinks`` defaults to a BB model's own chain and shows its sink; text on a BB model and BB data on a text model
are one-line errors; ``probe train --data synthetic:bb`` and ``probe train --bos`` record what they trained on, and
the loaded model knows it.

Every CLI call runs in this process (``probe.cli.main``: one import for all of them)."""

import json
import subprocess

import pytest
import torch

import probe
from probe.cli import main
from probe.data import WindowSampler
from probe.experiments.bb_zoo import ZOO_DIR, measure
from probe.experiments.sink_emergence import EmergenceConfig
from probe.jobs.inputs import trained_task
from tests.support.cli import assert_one_line_error, files_under

SHIPPED = sorted(p.name for p in ZOO_DIR.glob("bb-*") if (p / "zoo.json").is_file())
CHAIN = "synthetic:bb[vocab=64,triggers=3,seed=0,T=256]"


def record(name: str) -> dict:
    return json.loads((ZOO_DIR / name / "zoo.json").read_text())


def cli(capsys, *args) -> subprocess.CompletedProcess:
    code = main([str(a) for a in args])
    return subprocess.CompletedProcess(list(args), code, *capsys.readouterr())


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_bb_model_reproduces_its_recorded_statistics(name):
    rec = record(name)
    model = probe.load(f"probe/{name}")
    assert model.probe_info.name == f"probe/{name}" and model.config.probe_variant == rec["variant"]
    assert (
        rec["command"].startswith("probe experiment sink-emergence ")
        and f"--variants {rec['variant']}" in rec["command"]
    )
    assert model.probe_info.trained_with_bos and trained_task(model).spec() == rec["run"]["data"] == CHAIN
    cfg = EmergenceConfig.from_record(rec["recipe"])
    assert cfg.n_eval_batches * cfg.eval_batch_size >= 256 and cfg.T <= 256  # the evaluation size
    got, want = measure(model, cfg, losses=False), rec["stats"]
    assert got["summary"]["sink_formed"] == want["summary"]["sink_formed"]
    for k, v in want["summary"].items():
        assert got["summary"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    for mine, theirs in zip(got["layers"], want["layers"], strict=True):
        for k in ("pos0_over_uniform", "r0", "phantom_share"):
            assert mine[k] == pytest.approx(theirs[k], rel=1e-4, abs=1e-6), (mine["layer"], k)


def test_shipped_baseline_forms_a_sink_and_the_sink_logit_takes_its_place():
    """The sink-emergence check, on the recorded statistics the test above reproduces from the shipped weights."""
    base, sink = record("bb-baseline")["stats"]["summary"], record("bb-sinklogit")["stats"]["summary"]
    assert base["sink_formed"] and base["pos0_over_uniform"] >= 3 and base["r0_later"] < 0.8
    assert sink["phantom_share"] > 0.1
    assert sink["pos0_over_uniform"] < base["pos0_over_uniform"]
    assert abs(1 - sink["r0_later"]) < abs(1 - base["r0_later"])


def test_sinks_on_bb_baseline_defaults_to_its_chain_and_shows_the_sink(capsys):
    """No --data: the model's own chain (the default 8 x 8 windows; the 256 of the issue are the recorded statistics
    above, reproduced from the weights)."""
    r = cli(capsys, "sinks", "--model", "probe/bb-baseline", "--threads", "1")
    assert r.returncode == 0, r.stderr
    assert f"corpus: {CHAIN}" in r.stdout and "8 x 8 windows of 256 tokens (synthetic, BOS first)" in r.stdout
    table = r.stdout.split("\nterms:\n")[0]  # the summary table (the terms block after it glosses sink_formed)
    assert [line.split()[-1] for line in table.splitlines() if "sink_formed" in line] == ["True"]
    # the same chain named explicitly, a shorter T by --ctx: same model, other windows
    r = cli(
        capsys,
        "eval",
        "--model",
        "probe/bb-baseline",
        "--data",
        "synthetic:bb[seed=0]",
        "--ctx",
        "64",
        "--batches",
        "1",
        "--batch-size",
        "4",
        "--json",
        "--quiet",
    )
    meta = json.loads(r.stdout)["meta"]
    assert r.returncode == 0 and meta["corpus"] == "synthetic:bb[vocab=64,triggers=3,seed=0,T=64]"


BB_ERRORS = [
    (
        ["sinks", "--model", "probe/bb-baseline", "--data", "wikitext-2-test"],
        ["'wikitext-2-test' is text", "probe/bb-baseline", CHAIN, "synthetic:bb"],
    ),
    (
        ["sinks", "--model", "probe/tiny-baseline", "--data", "synthetic:bb"],
        ["'synthetic:bb' is Bigram-Backcopy data", "probe/tiny-baseline", "trained on text"],
    ),
    (
        ["sinks", "--model", "probe/bb-baseline", "--data", "synthetic:bb[vocab=100]"],
        ["needs 101 token ids", "vocabulary of 65", "vocab <= 64"],
    ),
    (["gates", "--model", "probe/bb-baseline", "--data", "synthetic:bb[size=3]"], ["unknown key 'size'", "vocab"]),
    (["eval", "--model", "probe/bb-baseline", "--data", "synthetic:bigram"], ["'bigram'", "bb"]),
    (["eval", "--model", "probe/bb-baseline", "--no-bos"], ["--no-bos", "always start with BOS"]),
    (
        ["sinks", "--model", "probe/bb-baseline", "--dormant"],  # the default domains are the text corpora
        ["--dormant-corpora 'wikitext-2-test' is text", "--dormant-corpora synthetic:bb synthetic:bb[seed=1]"],
    ),
    (
        ["sinks", "--model", "probe/bb-baseline", "--dormant", "--dormant-corpora", "synthetic:bb[size=3]"],
        ["--dormant-corpora 'synthetic:bb[size=3]': ", "unknown key 'size'"],
    ),
]


@pytest.mark.parametrize("args, needles", BB_ERRORS, ids=[" ".join(a[1:]) for a, _ in BB_ERRORS])
def test_mismatched_data_is_one_line_and_writes_nothing(args, needles, tmp_path, capsys):
    out = tmp_path / "out"
    assert_one_line_error(cli(capsys, *args, "--batches", "1", "--batch-size", "2", "--out", out), *needles)
    assert files_under(out) == []


def test_train_on_synthetic_data_records_the_chain(tmp_path, capsys):
    run = tmp_path / "run"
    r = cli(
        capsys,
        "train",
        "--data",
        "synthetic:bb[vocab=8,triggers=2]",
        "--ctx",
        "16",
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--eval-batches",
        "1",
        "--out",
        run,
        "--quiet",
        "--threads",
        "1",
    )
    assert r.returncode == 0, r.stderr
    ident = json.loads((run / "probe_train.json").read_text())
    assert ident["data"] == "synthetic:bb[vocab=8,triggers=2,seed=0,T=16]" and ident["bos"] and ident["bos_id"] == 8
    assert ident["task"]["fingerprint"] and ident["tokenizer"] is None
    model = probe.load(run)
    assert model.probe_info.trained_with_bos and trained_task(model).spec() == ident["data"]
    r = cli(capsys, "eval", "--model", run, "--batches", "1", "--batch-size", "2", "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["meta"]["corpus"] == ident["data"]  # bare: the run's own chain
    # the same command resumes (the identity matches); another chain is refused, naming both
    again = cli(
        capsys,
        "train",
        "--data",
        "synthetic:bb[vocab=8,triggers=2]",
        "--ctx",
        "16",
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--eval-batches",
        "1",
        "--out",
        run,
        "--quiet",
        "--threads",
        "1",
    )
    assert again.returncode == 0, again.stderr
    other = cli(
        capsys,
        "train",
        "--data",
        "synthetic:bb[vocab=8,triggers=1]",
        "--ctx",
        "16",
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--eval-batches",
        "1",
        "--out",
        run,
        "--quiet",
    )
    assert_one_line_error(other, "triggers=2", "triggers=1")


def test_train_bos_on_text_starts_every_window_with_it(tmp_path, capsys):
    docs = [torch.arange(10, 60), torch.arange(100, 180)]
    windows = WindowSampler(docs, 16, 0, eos_id=0, bos_id=7).sample(6)  # (6, 17)
    assert (windows[:, 0] == 7).all() and not (windows[:, 1:] == 7).any()
    text = tmp_path / "corpus.txt"
    text.write_text(
        "\n\n".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog {i} times." * 3 for i in range(40))
    )
    run = tmp_path / "run"
    r = cli(
        capsys,
        "train",
        "--bos",
        "--data",
        text,
        "--eval-data",
        text,
        "--ctx",
        "16",
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--eval-batches",
        "1",
        "--out",
        run,
        "--quiet",
        "--threads",
        "1",
    )
    assert r.returncode == 0, r.stderr
    ident = json.loads((run / "probe_train.json").read_text())
    assert ident["bos"] is True and ident["bos_id"] == 0  # probe-bpe-8k has no BOS token: its EOS stands in
    model = probe.load(run)
    assert model.probe_info.trained_with_bos
    r = cli(
        capsys,
        "eval",
        "--model",
        run,
        "--data",
        text,
        "--ctx",
        "16",
        "--batches",
        "1",
        "--batch-size",
        "2",
        "--json",
        "--quiet",
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["meta"]["bos"] is True  # the analyses' default windows get the BOS too
