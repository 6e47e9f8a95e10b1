"""Every shipped zoo checkpoint loads by name and reproduces its recorded validation loss on its recorded batches."""

import json

import pytest

import probe
from probe.train.trainer import evaluate
from probe.train.zoo import DEFAULT_MODEL, ZOO_DIR, zoo_eval_batches

# the text zoo (tiny-*); the Bigram-Backcopy entries (bb-*) have their own test in tests/cli/test_bb_cli.py
SHIPPED = sorted(p.name for p in ZOO_DIR.glob("tiny-*") if (p / "zoo.json").is_file()) if ZOO_DIR.is_dir() else []


def test_the_embedded_default_is_shipped():
    assert DEFAULT_MODEL.split("/", 1)[1] in SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_zoo_checkpoint_reproduces_its_recorded_validation_loss(name):
    record = json.loads((ZOO_DIR / name / "zoo.json").read_text())
    model = probe.load(f"probe/{name}")
    assert model.probe_info.name == f"probe/{name}"
    assert model.config.probe_variant == record["variant"]
    loss = evaluate(model, zoo_eval_batches(model.tokenizer, record["eval"]))
    assert loss == pytest.approx(record["val_loss"], abs=1e-4)
    assert loss < 6.0  # trained: far below the untrained ln(8192) = 9.01


def test_zoo_trainer_runs_variants_in_parallel_and_records_what_it_did(tmp_path):
    """`python -m probe.train.zoo --jobs 2` trains two variants in two processes; each shipped directory reloads and
    reproduces the validation loss its zoo.json records, and holds the exact command that rebuilds it. An online
    corpus (here `datasets` is a stand-in that logs its calls) is fetched once, by the parent, for both."""
    import os
    import subprocess
    import sys

    from probe.data.corpus import CORPUS_DIR

    zoo, work, fake, calls = tmp_path / "zoo", tmp_path / "work", tmp_path / "fake", tmp_path / "calls.log"
    fake.mkdir()
    (fake / "sitecustomize.py").write_text(  # every process of the run: datasets.load_dataset logs and serves text
        "import json, os\n"
        "import datasets\n"
        "def load_dataset(*args, **kwargs):\n"
        "    open(os.environ['FAKE_DATASETS_CALLS'], 'a').write(json.dumps([args, kwargs]) + '\\n')\n"
        "    words = open(os.environ['FAKE_DATASETS_TEXT']).read().split()\n"
        "    return iter({'text': ' '.join(words[i:i + 400])} for i in range(0, len(words), 400))\n"
        "datasets.load_dataset = load_dataset\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]),
        "HF_HUB_OFFLINE": "1",
        "FAKE_DATASETS_CALLS": str(calls),
        "FAKE_DATASETS_TEXT": str(CORPUS_DIR / "shakespeare.txt"),
    }
    cmd = [
        sys.executable,
        "-m",
        "probe.train.zoo",
        "--variants",
        "baseline",
        "sink+proj",
        "--steps",
        "2",
        "--data",
        "hf:fineweb-edu:60",
        "--batch-size",
        "2",
        "--warmup",
        "1",
        "--jobs",
        "2",
        "--snapshot-every",
        "1",
        "--work",
        str(work),
        "--zoo-dir",
        str(zoo),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "baseline: done" in r.stdout and "sink+proj: done" in r.stdout
    assert len(calls.read_text().splitlines()) == 1  # the parent fetched it; the children read work/corpus.jsonl.gz
    for v in ("baseline", "sink+proj"):
        record = json.loads((zoo / f"tiny-{v}" / "zoo.json").read_text())
        assert record["command"] == (
            f"python -m probe.train.zoo --variants {v} --steps 2 --data hf:fineweb-edu:60 --batch-size 2 --warmup 1"
        )
        assert record["recipe"]["data"] == "hf:fineweb-edu:60"
        assert record["recipe"]["batch_size"] == 2 and record["train_metrics"]["step"] == 2
        model = probe.load(zoo / f"tiny-{v}")
        assert evaluate(model, zoo_eval_batches(model.tokenizer, record["eval"])) == pytest.approx(
            record["val_loss"], abs=1e-4
        )
        assert sorted(p.name for p in (work / v / "snapshots").iterdir()) == ["step0", "step1", "step2"]
    r = subprocess.run(
        [sys.executable, "-m", "probe.train.zoo", "--variants", "nope", "--zoo-dir", str(zoo)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "'nope'" in r.stderr
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "probe.train.zoo",
            "--data",
            str(tmp_path / "missing.txt"),
            "--jobs",
            "2",
            "--zoo-dir",
            str(zoo),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "--data" in r.stderr and "missing.txt" in r.stderr
    assert not (zoo / "tiny-mudd").exists()


# the checkpoints saved before the gate modules existed (a ``backend`` in config.json); retrained ones are today's
LEGACY = [n for n in SHIPPED if "backend" in json.loads((ZOO_DIR / n / "config.json").read_text())]


def test_some_shipped_checkpoints_still_carry_the_old_names():
    assert len(LEGACY) >= 2 and "tiny-normgate" in LEGACY  # one with gate parameters, which the mapping renames


@pytest.mark.parametrize("name", LEGACY)
def test_zoo_checkpoint_written_under_old_names_loads_them_and_resaves_under_todays(tmp_path, name):
    """The shipped files predate the gate modules (gate parameters ``attn.gate_tau/gate_w/gate_b``, a ``backend`` in
    config.json): they load with today's names and identical outputs, and saving writes today's names only."""
    import torch
    from safetensors import safe_open

    from probe.models.model import LEGACY_NAMES

    with safe_open(str(ZOO_DIR / name / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
    assert json.loads((ZOO_DIR / name / "config.json").read_text())["backend"] == "auto"
    model = probe.load(f"probe/{name}")
    current = set(model.state_dict())
    legacy = stored - current
    assert {n.rsplit(".attn.", 1)[-1] for n in legacy} <= set(LEGACY_NAMES)
    # every zoo model with gate parameters (norm, projection) exercises the mapping; GatedV's SiLU has none
    assert bool(legacy) == any(".attn.gate." in n for n in current)
    assert "backend" not in model.config.to_dict()
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == current
    again = probe.load(tmp_path)
    ids = torch.arange(64)[None] * 37 % model.config.vocab_size
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits, atol=0, rtol=0)
