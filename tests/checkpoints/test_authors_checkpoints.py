"""The papers' released checkpoints, from the authors' own formats: tiny checkpoints written by the authors' code.

tests/fixtures/authors/<format>-checkpoint/ holds a checkpoint in exactly the authors' format (MUDDFormer /
MUDDPythia: save_pretrained's config.json + model.safetensors, with the released config's auto_map; LR-AttnRes:
train.py's build_checkpoint dict saved by torch.save as final_model.pt), the inputs and the authors' outputs of the
same weights (fp64 and fp32), and meta.json (repository, commit, blob ids, parameter names and shapes, settings):
written by scripts/authors/{mudd,lr_attnres}_checkpoints.py. Here probe.load reads each checkpoint through probe's
loaders (no authors' code) and must give the authors' logits (fp64: 1e-10) and MUDD dense weights; a wrong mapping
must not; the options match the authors' shapes at the released sizes; the names resolve; the analyses run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

import probe
from probe.checkpoints import lr_attnres, muddformer
from probe.checkpoints.load import ModelNotFoundError, list_models, resolve
from probe.checkpoints.muddformer import AuthorsFormatError
from probe.models.config import ProbeConfig
from probe.models.model import ProbeForCausalLM

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "authors"
FP64_TOL, FP32_TOL = 1e-10, 1e-4
FP64_TOL_FP32_PRIOR = 1e-6  # their block log-count prior is an fp32 tensor even in an fp64 model (log(count) rounded)
MUDD = ("muddformer", "muddpythia")
LR = ("block", "full", "baseline")


def fixture(name: str):
    d = FIXTURES / name
    return (
        d,
        json.loads((d / "meta.json").read_text()),
        load_file(d / "inputs.safetensors")["input_ids"],
        load_file(d / "outputs.safetensors"),
    )


def use_their_rope_table(model, table: torch.Tensor, T: int, dtype) -> None:
    """probe's RoPE reads their cos/sin table (torch.polar's, an ulp from torch.cos of the same fp32 angles), so the
    fp64 comparison checks the mapping rather than a libm difference (as tests/models/test_authors_golden.py)."""
    cos, sin = (torch.cat([table[:T, :, i].to(dtype)] * 2, dim=-1)[:, None, :] for i in (0, 1))  # T,1,d_rot
    for blk in model.blocks:
        blk.attn.rotary._cache[(T, "cpu", dtype)] = (cos, sin)


def mudd_outputs(model, ids) -> dict:
    names = {f"blocks.{l}.dense.hook_weights": l for l in range(model.config.n_layers)}
    with torch.no_grad():
        out, cache = model.run_with_cache(ids, names_filter=lambda n: n in names)
    return {"logits": out.logits, **{f"dense_weights.{l}": cache[n].permute(2, 0, 1, 3) for n, l in names.items()}}


def max_diffs(ours: dict, theirs: dict, prefix: str = "") -> dict:
    return {k: (v.double() - theirs[prefix + k].double()).abs().max().item() for k, v in ours.items()}


# ---- MUDDFormer / MUDDPythia ----------------------------------------------------------------------------------
@pytest.mark.parametrize("family", MUDD)
def test_a_mudd_checkpoint_loads_to_the_authors_outputs_in_fp64(family):
    d, meta, ids, theirs = fixture(f"{family}-checkpoint")
    assert meta["repository"] == "Caiyun-AI/MUDDFormer" and len(meta["commit"]) == 40
    config = json.loads((d / "checkpoint" / "config.json").read_text())
    assert config["model_type"] == family and "auto_map" in config  # their format, remote code named in it
    model = probe.load(d / "checkpoint", dtype=torch.float64)
    use_their_rope_table(model, theirs["tables/rope"], ids.shape[1], torch.float64)
    diffs = max_diffs(mudd_outputs(model, ids), theirs)
    assert len(diffs) == 1 + model.config.n_layers and max(diffs.values()) <= FP64_TOL, diffs


@pytest.mark.parametrize("family", MUDD)
def test_a_mudd_checkpoint_loads_to_the_authors_outputs_in_fp32(family):
    d, _, ids, theirs = fixture(f"{family}-checkpoint")
    model = probe.load(str(d / "checkpoint"))  # fp32 on CPU, probe's own RoPE table
    assert next(model.parameters()).dtype == torch.float32
    diffs = max_diffs(mudd_outputs(model, ids), theirs, prefix="fp32/")
    assert max(diffs.values()) <= FP32_TOL, diffs


@pytest.mark.parametrize("family", MUDD)
def test_every_option_matters_on_the_mudd_checkpoints(family):
    """Swapping the key and value stream norms (sepln), or dropping MUDDPythia's parallel residual, moves the
    logits: the options and the mapping are checked, not just the shapes."""
    d, _, ids, theirs = fixture(f"{family}-checkpoint")
    model = probe.load(d / "checkpoint", dtype=torch.float64)
    with torch.no_grad():
        k, v = model.blocks[1].ln1_k, model.blocks[1].ln1_v
        k.weight[:], v.weight[:] = v.weight.clone(), k.weight.clone()
    assert (mudd_outputs(model, ids)["logits"] - theirs["logits"]).abs().max() > 1e-2
    if family == "muddpythia":
        model = probe.load(d / "checkpoint", dtype=torch.float64)
        for blk in model.blocks:
            blk.parallel_residual = False
        assert (mudd_outputs(model, ids)["logits"] - theirs["logits"]).abs().max() > 1e-2


@pytest.mark.parametrize("family", MUDD)
def test_mudd_options_give_the_authors_shapes_at_the_released_sizes(family):
    """Their released config.json files (recorded in meta.json) through probe's mapping: every layer's dense-network
    w1 / w2 and FFN width equal what their code builds (recorded by the script on the meta device)."""
    _, meta, _, _ = fixture(f"{family}-checkpoint")
    assert meta["tiny_shapes"]["dense_w1"][0][0] == 64  # round64 is on in the tiny checkpoint too
    for file, shapes in meta["released_shapes"].items():
        config = ProbeConfig(**muddformer.probe_config_kwargs(meta["released_config_contents"][file], file))
        with torch.device("meta"):
            model = ProbeForCausalLM(config)
        assert [list(b.dense.w1.weight.shape) for b in model.blocks] == shapes["dense_w1"], file
        assert [list(b.dense.w2.weight.shape) for b in model.blocks] == shapes["dense_w2"], file
        assert [b.mlp.up.out_features for b in model.blocks] == shapes["ffn_widths"], file
        assert config.mudd_expand_last and config.mudd_round64 and config.dense_stream_norms and config.qk_norm


def test_their_code_never_runs(tmp_path):
    """A copy of the checkpoint whose auto_map modules raise on import, with a tokenizer beside it: it loads, and the
    tokenizer is read without consulting config.json (AutoTokenizer would ask to run the auto_map code)."""
    d, _, ids, theirs = fixture("muddpythia-checkpoint")
    ckpt = tmp_path / "MUDDPythia-tiny"
    shutil.copytree(d / "checkpoint", ckpt)
    for f in ("modeling_muddpythia.py", "configuration_muddpythia.py"):
        (ckpt / f).write_text("raise RuntimeError('the authors\\' code ran')\n")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(probe.__file__).parent / "zoo" / "tiny-mudd" / f, ckpt)
    model = probe.load(ckpt, dtype=torch.float64)
    assert model.tokenizer is not None and model.tokenizer("a b").input_ids
    assert resolve(ckpt)[2] == "local"


@pytest.mark.parametrize(
    "edit, says",
    [
        ({"dense_type": "l"}, "dense_type='l'"),
        ({"dynamic_dense": False}, "dynamic_dense=False"),
        ({"use_linear_bias": False}, "use_linear_bias=False"),
        ({"rotary_pct": 0.1}, "rotary_pct=0.1"),
        ({"mystery_option": 1}, "'mystery_option'"),
    ],
)
def test_unmappable_mudd_configs_are_one_line(tmp_path, edit, says):
    d, *_ = fixture("muddpythia-checkpoint")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(d / "checkpoint", ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, **edit}))
    with pytest.raises(AuthorsFormatError) as e:
        probe.load(ckpt)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_mudd_state_dict_with_a_stray_or_missing_weight_is_one_line():
    d, *_ = fixture("muddformer-checkpoint")
    config = json.loads((d / "checkpoint" / "config.json").read_text())
    pc = ProbeConfig(**muddformer.probe_config_kwargs(config))
    theirs = load_file(d / "checkpoint" / "model.safetensors")
    with pytest.raises(AuthorsFormatError, match="'layers.9.extra' has no place"):
        muddformer.map_state_dict({**theirs, "layers.9.extra": torch.zeros(1)}, pc, "muddformer")
    theirs.pop("dense_bs.1")
    with pytest.raises(AuthorsFormatError, match="'dense_bs.1' is missing"):
        muddformer.map_state_dict(theirs, pc, "muddformer")


# ---- LR-AttnRes -----------------------------------------------------------------------------------------------
def lr_outputs(model, ids):
    with torch.no_grad():
        return {"logits": model(ids).logits}


@pytest.mark.parametrize("kind", LR)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_an_lr_attnres_checkpoint_loads_to_the_authors_outputs(kind, dtype):
    d, meta, ids, theirs = fixture(f"lr-attnres-{kind}-checkpoint")
    assert meta["repository"] == "jon123boss/LR-AttnRes" and len(meta["commit"]) == 40
    assert meta["payload_keys"] == [
        "adamw_optimizer",
        "adamw_scheduler",
        "config",
        "model",
        "model_args",
        "muon_optimizer",
        "muon_scheduler",
        "step",
        "tokens_processed",
    ]
    model = probe.load(d, dtype=dtype)  # the directory holding final_model.pt, as downloaded
    c = model.config
    if kind == "baseline":  # train.py's default run: no AttnRes, the plain residual stream
        assert c.depth == "residual"
    else:
        assert (c.depth, c.depth_rank, c.plr_key) == ("plr", 4, "normalized")
        assert (c.depth_blocks, c.depth_block_mean, c.depth_block_prior) == (
            (3, 1.0, 1.0) if kind == "block" else (0, 0, 0)
        )
    diffs = max_diffs(lr_outputs(model, ids), theirs, prefix="" if dtype == torch.float64 else "fp32/")
    tol = (FP64_TOL_FP32_PRIOR if kind == "block" else FP64_TOL) if dtype == torch.float64 else FP32_TOL
    assert max(diffs.values()) <= tol, diffs


def test_a_wrong_lr_attnres_mapping_moves_the_logits(monkeypatch):
    """Without the RoPE-pair permutation (their interleaved pairs read as rotate-half) the logits move."""
    d, _, ids, theirs = fixture("lr-attnres-full-checkpoint")
    monkeypatch.setattr(lr_attnres, "interleaved_to_half", lambda w, n_heads: w)
    model = probe.load(d, dtype=torch.float64)
    assert (lr_outputs(model, ids)["logits"] - theirs["logits"]).abs().max() > 1e-2


@pytest.mark.parametrize(
    "edit, says",
    [
        ({"norm_pos": "after"}, "norm_pos='after'"),
        ({"lrid_num_heads": 2}, "lrid_num_heads=2"),
        ({"attnres_block_alpha": [1.0, 0.5, 1.0], "attnres_block_alpha_scope": "shared"}, "differs between blocks"),
        ({"attnres_num_blocks": 4}, "attnres_num_blocks=4"),
        ({"new_field": True}, "'new_field'"),
    ],
)
def test_unmappable_lr_attnres_model_args_are_one_line(edit, says):
    _, meta, _, _ = fixture("lr-attnres-block-checkpoint")
    with pytest.raises(AuthorsFormatError) as e:
        lr_attnres.probe_config_kwargs({**meta["model_args"], **edit}, 1e-7, "ckpt")
    assert says in str(e.value) and "\n" not in str(e.value)


class NotWeights:  # an object only a full pickle load could rebuild
    pass


def test_a_checkpoint_that_needs_a_full_pickle_load_is_refused(tmp_path):
    torch.save({"model": {}, "model_args": {}, "config": NotWeights()}, tmp_path / "final_model.pt")
    with pytest.raises(AuthorsFormatError, match="cannot be read as weights only") as e:
        probe.load(tmp_path)
    assert "\n" not in str(e.value)
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(AuthorsFormatError, match="not an LR-AttnRes training checkpoint"):
        probe.load(tmp_path / "other.pt")


# ---- names ----------------------------------------------------------------------------------------------------
def test_released_names_resolve_like_every_hub_name(monkeypatch, tmp_path):
    assert resolve("Caiyun-AI/MUDDPythia-1.4B") == ("Caiyun-AI/MUDDPythia-1.4B", None, "hub")
    assert resolve("muddformer-2.8b") == ("Caiyun-AI/MUDDFormer-2.8B", None, "hub")
    assert resolve("jonnester/lr-attnres-n8-avg") == ("Jonnester/LR-AttnRes-n8-Avg", None, "hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # nothing cached
    for name in ("Caiyun-AI/MUDDPythia-1.4B", "lr-attnres-n16"):
        with pytest.raises(ModelNotFoundError, match="not in the local Hugging Face cache") as e:
            probe.load(name)
        assert "\n" not in str(e.value)
    names = {r["name"]: r for r in list_models()}
    assert names["muddpythia-1.4b"]["source"] == "Caiyun-AI/MUDDPythia-1.4B"
    assert names["lr-attnres-full"]["source"] == "Jonnester/LR-AttnRes-Full"


# ---- the analyses on them, through the CLI ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_text(tmp_path_factory):
    """A 48-token BPE tokenizer (the tiny checkpoints' vocabulary) and a text corpus it covers."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("text")
    g = torch.Generator().manual_seed(0)
    words = [
        "".join("abcdefgh"[i] for i in torch.randint(0, 8, (int(n),), generator=g))
        for n in torch.randint(2, 6, (40,), generator=g)
    ]
    text = " ".join(words[i] for i in torch.randint(0, 40, (3000,), generator=g))
    (root / "corpus.txt").write_text("\n".join(text[i : i + 200] for i in range(0, len(text), 200)))
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=48, special_tokens=["[UNK]", "[EOS]"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]").save_pretrained(root / "tok")
    return root


def cli(*args) -> int:
    from probe.cli.main import main

    return main([str(a) for a in args])


def test_sources_and_sinks_run_on_an_lr_attnres_checkpoint(small_text, tmp_path, capsys):
    d, *_ = fixture("lr-attnres-block-checkpoint")
    windows = [
        "--tokenizer",
        small_text / "tok",
        "--data",
        small_text / "corpus.txt",
        "--ctx",
        16,
        "--batches",
        1,
        "--batch-size",
        2,
        "--quiet",
    ]
    assert cli("sources", "--model", d, *windows, "--out", tmp_path / "sources") == 0
    summary = json.loads((tmp_path / "sources" / "sources.json").read_text())
    sites = summary["sites"] if "sites" in summary else summary["tables"]["sites"]
    assert len(sites) == 6  # 2L read sites: block routing over 3 blocks of 2 sub-layers
    assert cli("sinks", "--model", d, *windows, "--out", tmp_path / "sinks") == 0
    assert (tmp_path / "sinks" / "sinks.json").is_file()


def test_sinks_and_sources_run_on_a_mudd_checkpoint(small_text, tmp_path, capsys):
    """sources on a MUDD checkpoint: its dense-connection weights (docs/definitions.md#dense-weights), CSV and page."""
    d, *_ = fixture("muddpythia-checkpoint")
    windows = [
        "--tokenizer",
        small_text / "tok",
        "--data",
        small_text / "corpus.txt",
        "--ctx",
        16,
        "--batches",
        1,
        "--batch-size",
        2,
        "--quiet",
    ]
    assert cli("sinks", "--model", d / "checkpoint", *windows, "--out", tmp_path / "sinks") == 0
    assert (tmp_path / "sinks" / "sinks.json").is_file()
    assert cli("sources", "--model", d / "checkpoint", *windows, "--out", tmp_path / "sources") == 0
    weights = pd.read_csv(tmp_path / "sources" / "sources_dense_weights.csv")
    n_layers = json.loads((d / "checkpoint" / "config.json").read_text())["n_layer"]  # their key
    # C = 4 streams after every block but the last (one), S = l + 2 block states: sum over l of C_l (l + 2)
    assert len(weights) == sum(4 * (l + 2) for l in range(n_layers - 1)) + (n_layers + 1)
    assert set(weights["stream"]) == {"q", "k", "v", "r"} and weights["weight_std"].ge(0).all()
    page = (tmp_path / "sources" / "sources.html").read_text()
    assert all(f"Dense-connection weights, stream {c}" in page for c in "qkvr")
    assert "dense mixes put mean weight" in page


@pytest.mark.parametrize("path", ["muddformer-checkpoint/checkpoint", "lr-attnres-full-checkpoint"])
def test_a_checkpoint_larger_than_memory_is_one_line_before_it_is_read(monkeypatch, path):
    import probe.data.limits

    monkeypatch.setattr(probe.data.limits, "available_memory", lambda: 1000)
    with pytest.raises(AuthorsFormatError, match="more than the .* of memory available") as e:
        probe.load(FIXTURES / path)
    assert "\n" not in str(e.value)
