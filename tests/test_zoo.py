"""Every shipped zoo checkpoint loads by name and reproduces its recorded validation loss on its recorded batches."""
import json

import pytest

import probe
from probe.train.zoo import DEFAULT_MODEL, ZOO_DIR, zoo_eval_batches
from probe.train.trainer import evaluate

SHIPPED = sorted(p.name for p in ZOO_DIR.iterdir() if (p / "zoo.json").is_file()) if ZOO_DIR.is_dir() else []


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
