"""The papers' released checkpoints, from the authors' own formats: tiny checkpoints written by the authors' code.

tests/fixtures/authors/<format>-checkpoint/ holds a checkpoint in exactly the authors' format (MUDDFormer /
MUDDPythia: save_pretrained's config.json + model.safetensors, with the released config's auto_map; LR-AttnRes:
train.py's build_checkpoint dict saved by torch.save as final_model.pt, at their last commit and, saved in bf16 as
their CUDA runs save, at 324995a, before the log-count prior had a field), the inputs and the authors' outputs of the
same weights as their code ships them (their RoPE tables; fp64, fp32 and bf16), and meta.json (repository, commit,
blob ids, parameter names and shapes, settings): written by scripts/authors/{mudd,lr_attnres}_checkpoints.py. Here
probe.load reads each checkpoint through probe's loaders (no authors' code) and must give the authors' logits (fp64:
1e-10, with the authors' tables by default) and MUDD dense weights; a wrong mapping must not; the options match the
authors' shapes at the released sizes; the names resolve; the analyses run.
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
MUDD = ("muddformer", "muddpythia")
LR = ("block", "full", "baseline", "324995a-block")  # lr-attnres-<kind>-checkpoint; 324995a: before the prior


def fixture(name: str):
    d = FIXTURES / name
    return (
        d,
        json.loads((d / "meta.json").read_text()),
        load_file(d / "inputs.safetensors")["input_ids"],
        load_file(d / "outputs.safetensors"),
    )


def mudd_outputs(model, ids) -> dict:
    names = {f"blocks.{l}.dense.hook_weights": l for l in range(model.config.n_layers)}
    with torch.no_grad():
        out, cache = model.run_with_cache(ids, names_filter=lambda n: n in names)
    return {"logits": out, **{f"dense_weights.{l}": cache[n].permute(2, 0, 1, 3) for n, l in names.items()}}


def max_diffs(ours: dict, theirs: dict, prefix: str = "") -> dict:
    return {k: (v.double() - theirs[prefix + k].double()).abs().max().item() for k, v in ours.items()}


# ---- MUDDFormer / MUDDPythia ----------------------------------------------------------------------------------
@pytest.mark.parametrize("family", MUDD)
def test_a_mudd_checkpoint_loads_to_the_authors_outputs_in_fp64(family):
    d, meta, ids, theirs = fixture(f"{family}-checkpoint")
    assert meta["repository"] == "Caiyun-AI/MUDDFormer" and len(meta["commit"]) == 40
    config = json.loads((d / "checkpoint" / "config.json").read_text())
    assert config["model_type"] == family and "auto_map" in config  # their format, remote code named in it
    model = probe.load(d / "checkpoint", dtype=torch.float64)  # their RoPE table (bf16 / fp16), as their code
    diffs = max_diffs(mudd_outputs(model, ids), theirs)
    assert len(diffs) == 1 + model.config.n_layers and max(diffs.values()) <= FP64_TOL, diffs
    cos, sin = model.blocks[0].attn.rotary.tables(model.config.n_ctx, "cpu", torch.float64)
    half = cos.shape[-1] // 2
    assert torch.equal(cos[:, 0, :half], theirs["tables/rope"][..., 0]), "probe's table is theirs, bit for bit"
    assert torch.equal(sin[:, 0, :half], theirs["tables/rope"][..., 1])


@pytest.mark.parametrize("family", MUDD)
def test_probe_s_exact_rope_table_is_an_option_that_departs_from_theirs(family):
    """rope="exact": probe's fp32 table; the logits then differ from their model as shipped (bf16 / fp16 table)."""
    d, _, ids, theirs = fixture(f"{family}-checkpoint")
    model = probe.load(d / "checkpoint", dtype=torch.float64, rope="exact")
    assert model.config.rope_table == "exact" and model.probe_info.extra["authors_format"]["rope"] == "exact"
    assert 1e-5 < max_diffs(mudd_outputs(model, ids), theirs)["logits"] < 1.0


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
        ({"dynamic_dense": False}, "dynamic_dense=false"),
        ({"rotary_pct": 0.1}, "rotary_pct=0.1"),
        ({"n_local_heads": 4, "n_head": 8}, "n_local_heads=4"),
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


def test_their_default_n_local_heads_means_n_head(tmp_path):
    """n_local_heads=-1 (their config class's default) is n_head: the same model as the explicit value."""
    d, _, ids, theirs = fixture("muddformer-checkpoint")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(d / "checkpoint", ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "n_local_heads": -1}))
    model = probe.load(ckpt, dtype=torch.float64)
    assert model.config.n_kv_heads == config["n_head"]
    assert max_diffs(mudd_outputs(model, ids), theirs)["logits"] <= FP64_TOL


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


@pytest.mark.parametrize(
    "fixture_name", [f"{f}-checkpoint/checkpoint" for f in MUDD] + [f"lr-attnres-{k}-checkpoint" for k in LR]
)
def test_bf16_compute_is_as_near_the_exact_logits_as_their_bf16_forward(fixture_name):
    """In bf16 nothing is exact: probe's bf16 logits are within 2.5 times the distance of the authors' bf16 forward
    from their fp64 one. Each is measured against the fp64 logits, not against each other: their bf16 forward ran on
    the CPU that wrote the fixture, and bf16 rounds by the CPU's kernels. Measured (ours / theirs from the exact
    logits): on an AVX2-only EPYC at most 1.3 over these fixtures; on an AVX-512 Xeon 0.35-1.10, and 2.08 for the
    LR-AttnRes checkpoint saved at 324995a, which ATEN_CPU_CAPABILITY=avx2 on the same Xeon brings to 1.10 (the same
    code; torch's AVX-512 kernels round otherwise). The defect this catches, their eps=None norms given bf16's epsilon
    instead of fp32's, puts the LR-AttnRes checkpoints at 3.05-10.4."""
    d = FIXTURES / fixture_name.split("/")[0]
    theirs = load_file(d / "outputs.safetensors")
    ids = load_file(d / "inputs.safetensors")["input_ids"]
    with torch.no_grad():
        ours = probe.load(FIXTURES / fixture_name, dtype=torch.bfloat16)(ids).logits.double()
    exact = theirs["logits"].double()
    rounding = (theirs["bf16/logits"].double() - exact).abs().max().item()
    assert (ours - exact).abs().max().item() <= 2.5 * rounding


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
    c, record = model.config, model.probe_info.extra["authors_format"]
    if kind == "baseline":  # train.py's default run: no AttnRes, the plain residual stream
        assert c.depth == "residual"
    else:
        assert (c.depth, c.depth_rank, c.plr_key) == ("plr", 4, "normalized")
        assert (c.depth_blocks, c.depth_block_mean, c.depth_block_prior) == {
            "block": (3, 1.0, 1.0),  # their last commit: the block mean and the log-count prior
            "324995a-block": (3, 1.0, 0.0),  # no prior field: their code then had no prior
            "full": (0, 0, 0),
        }[kind]
    if kind == "324995a-block":
        assert record["code"].startswith("jon123boss/LR-AttnRes model.py from 092e6da (2026-06-04), before e086c36")
        assert "0f5cf7e" in record["assumed"]["attnres_block_count_prior"]
    else:
        assert "assumed" not in record and record["code"].endswith("to 14784c7 (2026-06-13)")
    assert c.rope_table == "stored" and record["rope"] == "authors"
    stored = torch.load(d / "final_model.pt", weights_only=True)["model"]["transformer.layers.1.attn.rope.cos"]
    assert torch.equal(model.blocks[1].attn.rotary.cos, stored[0, 0].to(dtype))  # their table, as they saved it
    diffs = max_diffs(lr_outputs(model, ids), theirs, prefix="" if dtype == torch.float64 else "fp32/")
    assert max(diffs.values()) <= (FP64_TOL if dtype == torch.float64 else FP32_TOL), diffs


def test_an_lr_attnres_checkpoint_saved_in_bf16_departs_with_probe_s_exact_table():
    """Saved in bf16, their RoPE buffers are bf16-rounded: rope="exact" (probe's fp32 table) moves the logits."""
    d, _, ids, theirs = fixture("lr-attnres-324995a-block-checkpoint")
    model = probe.load(d, dtype=torch.float64, rope="exact")
    assert model.config.rope_table == "exact" and not any("rotary" in k for k in model.state_dict())
    assert 1e-3 < max_diffs(lr_outputs(model, ids), theirs)["logits"] < 1.0


def test_a_wrong_lr_attnres_mapping_moves_the_logits(monkeypatch):
    """Without the RoPE-pair permutation (their interleaved pairs read as rotate-half) the logits move; so does the
    older checkpoint read with the prior on (as their current code would read its missing field)."""
    d, _, ids, theirs = fixture("lr-attnres-full-checkpoint")
    with monkeypatch.context() as m:
        m.setattr(lr_attnres, "interleaved_to_half", lambda w, n_heads: w)
        model = probe.load(d, dtype=torch.float64)
    assert (lr_outputs(model, ids)["logits"] - theirs["logits"]).abs().max() > 1e-2
    d, _, ids, theirs = fixture("lr-attnres-324995a-block-checkpoint")
    monkeypatch.setitem(lr_attnres.ABSENT, "attnres_block_count_prior", True)
    model = probe.load(d, dtype=torch.float64)
    assert (lr_outputs(model, ids)["logits"] - theirs["logits"]).abs().max() > 1e-1


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
