"""Sizes and files of a local checkpoint checked before anything is built or read (probe.checkpoints.sizes): an absurd
size in any config format (HF, probe's, MUDD's config.json, LR-AttnRes's model_args) is one line before the model is
built even on the meta device; a FIFO among the model's files, or a shard index naming a file outside the folder, is
one line before any read."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

import probe
import probe.checkpoints.sizes as sizes
from probe.checkpoints import muddformer
from probe.checkpoints.sizes import CheckpointSizeError, check_config
from probe.data.synthetic import TokenDomain
from tests.support.cli import WINDOWS, assert_one_line_error

AUTHORS = Path(__file__).resolve().parents[1] / "fixtures" / "authors"
MUDD = AUTHORS / "muddformer-checkpoint" / "checkpoint"
LR = AUTHORS / "lr-attnres-block-checkpoint" / "final_model.pt"
ZOO = Path(probe.__file__).parent / "zoo" / "tiny-baseline"


def copy(src: Path, dst: Path, **config) -> Path:
    shutil.copytree(src, dst)
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**cfg, **config}))
    return dst


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("llama") / "m"
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


@pytest.fixture
def never_built(monkeypatch):
    """Fails the test when a model is built from the config (on any device) before the sizes were checked."""

    def built(*args, **kwargs):
        raise AssertionError("a model was built from an absurd config")

    monkeypatch.setattr(sizes, "implied_counts", built)
    monkeypatch.setattr(muddformer, "probe_config_kwargs", built)


@pytest.mark.parametrize(
    "where, config, says",
    [
        ("llama", dict(num_hidden_layers=10**6), "num_hidden_layers=1000000 is not a layers size"),
        ("llama", dict(intermediate_size=2e28), "intermediate_size=2e+28 is not a width size"),
        ("llama", dict(vocab_size=-3), "vocab_size=-3 is not a vocabulary size"),
        ("llama", dict(text_config={"hidden_size": "big"}), "text_config.hidden_size='big' is not a width size"),
        ("probe", dict(n_layers=10**6), "n_layers=1000000 is not a layers size"),
        ("probe", dict(d_mlp_layers=[64, 10**12]), "d_mlp_layers=1000000000000 is not a width size"),
        ("mudd", dict(n_layer=10**9), "n_layer=1000000000 is not a layers size"),
        ("mudd", dict(dim=int(2e28)), "dim=19999999999999999166239473664 is not a width size"),
    ],
)
def test_an_absurd_config_size_is_one_line_before_the_model_is_built(tmp_path, llama, never_built, where, config, says):
    """A llama config of 10^6 layers grew past 8 GB in 4 minutes; MUDD's n_layer 10^9 ran 90 s at 5 GB."""
    src = {"llama": llama, "probe": ZOO, "mudd": MUDD}[where]
    folder = copy(src, tmp_path / "m", **config)
    with pytest.raises(CheckpointSizeError, match=re.escape(f"{says} probe can build; choose an integer 1..")):
        probe.load(folder)


def test_an_lr_attnres_model_args_size_is_one_line_before_anything_is_built(tmp_path, never_built):
    """Its dim 2e30 was refused only after 4.6 GB, with "upper bound and lower bound inconsistent with step"."""
    payload = torch.load(LR, weights_only=True)
    payload["model_args"]["n_embd"] = int(2e30)
    torch.save(payload, tmp_path / "final_model.pt")
    with pytest.raises(CheckpointSizeError, match="model_args n_embd=.* is not a width size"):
        probe.load(tmp_path / "final_model.pt")


def test_every_size_of_a_real_config_is_within_the_bounds():
    for folder in (ZOO, MUDD):
        check_config(json.loads((folder / "config.json").read_text()), "m")
    check_config(torch.load(LR, weights_only=True)["model_args"], "m", "model_args")


@pytest.mark.parametrize("name", ["model.safetensors", "model.safetensors.index.json", "tokenizer.json"])
@pytest.mark.parametrize("where", ["mudd", "llama"])
def test_a_fifo_among_the_model_files_is_named_not_read(tmp_path, llama, where, name):
    """A MUDD folder whose weights file or index was a FIFO hung until it was killed."""
    folder = copy({"mudd": MUDD, "llama": llama}[where], tmp_path / "m")
    (folder / name).unlink(missing_ok=True)
    os.mkfifo(folder / name)
    with pytest.raises(CheckpointSizeError, match=f"model file .*{name} is a FIFO, not a regular file"):
        probe.load(folder)


@pytest.mark.parametrize("named", ["../outside.safetensors", "ABSOLUTE", "sub/../../outside.safetensors", ""])
@pytest.mark.parametrize("where", ["mudd", "llama"])
def test_a_shard_index_naming_a_file_outside_the_folder_is_refused(tmp_path, llama, monkeypatch, where, named):
    folder = copy({"mudd": MUDD, "llama": llama}[where], tmp_path / "m")
    outside = tmp_path / "outside.safetensors"
    (folder / "model.safetensors").rename(outside)
    from safetensors import safe_open

    with safe_open(outside, "pt") as f:
        keys = list(f.keys())
    named = str(outside) if named == "ABSOLUTE" else named
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(keys, named)}))
    real_open = open

    def guarded(file, *args, **kwargs):
        assert Path(os.fspath(file)).resolve() != outside.resolve(), "the file outside the model folder was opened"
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", guarded)
    with pytest.raises(CheckpointSizeError, match="its index names weight file .* not a file inside the model folder"):
        probe.load(folder)


def test_the_cli_says_it_in_one_line(tmp_path, capsys):
    import subprocess

    from probe.cli.main import main

    folder = copy(MUDD, tmp_path / "m", n_layer=10**9)
    data = ["--data", "synthetic:random[T=16,n=2]", "--batches", "1", "--batch-size", "2"]
    r = subprocess.CompletedProcess([], main(["sinks", "--model", str(folder), *data]), *capsys.readouterr())
    assert_one_line_error(r, "--model", "n_layer=1000000000 is not a layers size")


@pytest.mark.parametrize(
    "name, says",
    [
        ("synthetic:random[T=64,n=100000000000]", "a token domain holds at most 33,554,432"),
        ("synthetic:random[T=1000000000000,n=2]", "a token domain holds at most 33,554,432"),
        ("synthetic:repeat[T=256,n=4000000]", "are 1,028,000,000 ids"),
    ],
)
def test_a_token_domain_past_its_bound_is_one_line_before_the_model_loads(capsys, monkeypatch, name, says):
    """synthetic:random with huge n asked the allocator for 5 TB; one that fit passed 8 GB within 21 s."""
    import subprocess

    import probe.cli.prepare as prepare
    from probe.cli.main import main

    with pytest.raises(ValueError, match=says):
        TokenDomain(**{k: int(v) for k, v in (kv.split("=") for kv in name.split("[")[1][:-1].split(","))})

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(prepare, "load_model", no_model)
    r = subprocess.CompletedProcess([], main(["sinks", "--data", name, *WINDOWS[:4]]), *capsys.readouterr())
    assert_one_line_error(r, "--data", says)


def test_windows_must_fit_half_the_memory(monkeypatch):
    import probe.data.limits as limits
    from probe.data.batches import eval_batches

    monkeypatch.setattr(limits, "available_memory", lambda: 1 << 20)
    with pytest.raises(ValueError, match="more than half the 1.0 MB of memory available .*; choose a smaller n or T"):
        TokenDomain(T=255, n=512).generate(97)  # 1 MiB of ids: more than half of 1 MiB
    with pytest.raises(ValueError, match="windows of 65 tokens need .* more than half"):
        eval_batches([torch.arange(100)] * 2, "probe-bpe-8k", n_batches=64, batch_size=64, ctx=64)


def test_a_training_checkpoints_optimizer_state_is_not_read_as_weights(tmp_path):
    """A run's checkpoint/ holds model.safetensors beside state.safetensors (optimizer state, with integer tensors):
    loading the folder was refused as "holds tensor t170 as U32 ... no quantization_config"; the weights are
    model.safetensors alone, as transformers loads them."""
    import torch
    from safetensors.torch import save_file

    import probe
    from probe.checkpoints.sizes import weight_files
    from probe.models import create

    folder = tmp_path / "checkpoint"
    model = create("baseline", "tiny", n_layers=2, d_model=32, n_heads=2, d_mlp=64, vocab_size=64)
    model.save_pretrained(folder)
    save_file({"t0": torch.zeros(3, dtype=torch.int32), "t1": torch.ones(2)}, str(folder / "state.safetensors"))
    assert weight_files(folder) == [folder / "model.safetensors"]
    loaded = probe.load(str(folder))
    ids = torch.randint(0, 64, (1, 5))
    assert torch.equal(loaded(ids).logits, model.eval()(ids).logits)
