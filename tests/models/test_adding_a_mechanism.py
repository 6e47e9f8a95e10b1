"""docs/how-to/adding-a-mechanism.md followed for real: its code blocks, taken from the page, are applied to a clean
copy of the tree (tests/docs/guides.py): the toy value gates appended to probe/models/gates.py, the toy depth read and
dense mix as new modules of probe/models/depth_mechanisms/, their variants in probe/catalogue.py, and nothing else.

In the copy, one interpreter runs `probe models` and `probe train` on the gate and the depth read; a second one,
which never saw them registered by hand, reloads the trained gate model and runs `probe sources` on the trained depth
model. Every number is recomputed by hand with plain torch: the gate from the captured values and its parameters, the
routing gate's attention pattern from the captured queries, keys and values, the depth read's weights and effective
sources from the sources it sees, the dense mix's streams from the block states; so a guide whose formula is wrong
fails here, not just one whose names are."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests.docs.guides import ROOT, Guide, apply, clean_copy, in_copy, snapshot, touched

PAGE = "how-to/adding-a-mechanism.md"
GATE_FILES = ["probe/catalogue.py", "probe/models/gates.py"]
DEPTH_FILES = ["probe/catalogue.py", "probe/models/depth_mechanisms/uniform.py"]
DENSE_FILES = ["probe/catalogue.py", "probe/models/depth_mechanisms/uniform_mix.py"]

# The page's blocks as this test expects them (tests/docs/test_code_blocks.py: a snippet's names and strings occur in
# the test that runs it); the test runs the page's own blocks and checks they are these.
GATES = '''@register_gate("mean")
class MeanGate(ValueGate):
    """g_j = σ(s_h · mean(v_j) + c_h) per key and KV head; s = c = 0 at init, so every gate starts at ½ (a toy)."""

    param_roles = {"s": "gate", "c": "gate"}  # no weight decay, kept at their initial value by the model's init

    def __init__(self, config):
        super().__init__()
        self.s = nn.Parameter(torch.zeros(config.n_kv_heads))
        self.c = nn.Parameter(torch.zeros(config.n_kv_heads))

    def forward(self, v, x):  # v: B,T,Hkv,dv -> g: B,T,Hkv, fp32
        return torch.sigmoid(v.float().mean(-1) * self.s.float() + self.c.float())


@register_gate("mean-routing")
class MeanRoutingGate(MeanGate):
    """The same gate in the routing slot: log g_j joins key j's logits, the values pass unchanged (a toy)."""

    routing = True  # declares what it does: the analyses read hook_v_gate as a logit bias

    def log_gate(self, v, x):  # B,T,Hkv fp32, exact where g underflows
        return F.logsigmoid(v.float().mean(-1) * self.s.float() + self.c.float())
'''
UNIFORM = '''"""A uniform read: every site averages the sources it sees (a toy depth mechanism, no parameters)."""

from probe.models.depth import DepthRead, register_depth


@register_depth("uniform")
class UniformRead(DepthRead):
    """α_i = 1/S over the S sources a site reads."""

    def forward(self, sources):
        values, _ = sources.current()  # S tensors B,T,d: the embedding, the sub-layer outputs or blocks so far
        B, T, _ = values[0].shape
        weights = values[0].new_full((B, T, len(values)), 1 / len(values))  # B,T,S
        return self.read(weights, values)  # fires hook_depth_weights (a hook may edit α), then Σ_i α_i o_i
'''
UNIFORM_MIX = '''"""A uniform dense mix: after block l, the mean of X_0 .. X_{l+1} (a toy, no parameters)."""

from probe.models.dense import DenseMix, register_dense


@register_dense("uniform-mix")
class UniformMix(DenseMix):
    """A = 1/S over the S block states, one stream."""

    def weights(self, x):  # x: B,T,d -> A: B,T,C,S
        B, T, _ = x.shape
        return x.new_full((B, T, self.streams, self.n_src), 1 / self.n_src)
'''
ENTRIES = [
    '"meangate": Variant("value gate on the mean of each read (a toy)", dict(value_gate="mean")),',
    '"meanrouting": Variant("routing-slot gate on the mean of each read (a toy)", dict(value_gate="mean-routing")),',
    '"uniform-block{N}": Variant("uniform average over the sources of N blocks (a toy)", dict(depth="uniform")),',
    '"uniformmix": Variant("mean of all earlier block states after each block (a toy)", dict(dense="uniform-mix")),',
]
SHIPPED = "# ... the shipped variants, and:"

TRAIN = ["--steps", "3", "--batch-size", "4", "--ctx", "32", "--warmup", "1", "--lr", "1e-2", "--eval-every", "0"]
TRAIN += ["--ckpt-every", "0", "--eval-batches", "1", "--data", "wikitext-2-valid", "--quiet"]

# process 1: `probe models`, `probe train` on the gate and on the depth read, the trained gate model's logits
FIRST = """
import contextlib, io, json, sys
import torch
from transformers import AutoModelForCausalLM
from probe.cli import main

tmp, train = sys.argv[1], sys.argv[2:]
listing = io.StringIO()
with contextlib.redirect_stdout(listing):
    assert main(["models"]) == 0
assert main(["train", "--variant", "meangate", *train, "--out", f"{tmp}/gate"]) == 0
assert main(["train", "--variant", "uniform-block3", *train, "--out", f"{tmp}/depth"]) == 0
model = AutoModelForCausalLM.from_pretrained(f"{tmp}/gate/model").eval()
ids = torch.randint(0, 8192, (2, 24), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    torch.save({"ids": ids, "logits": model(ids).logits}, f"{tmp}/gate_logits.pt")
print(json.dumps({"models": listing.getvalue()}))
"""

# process 2, a fresh interpreter: reload, `probe sources`, and every gate, pattern and stream recomputed by hand
SECOND = """
import json, math, sys
import torch
from transformers import AutoModelForCausalLM
from probe.cli import main
from probe.models import create

tmp = sys.argv[1]
out = {}
saved = torch.load(f"{tmp}/gate_logits.pt")
ids = saved["ids"]
gated = AutoModelForCausalLM.from_pretrained(f"{tmp}/gate/model").eval()
out["gate_class"] = type(gated.blocks[0].attn.gate).__name__
out["gate_variant"] = gated.config.probe_variant
out["trained_s"] = max(blk.attn.gate.s.abs().max().item() for blk in gated.blocks)
with torch.no_grad():
    out["reload_logits"] = (gated(ids).logits - saved["logits"]).abs().max().item()


def by_hand_gate(v, s, c):  # v: B,T,Hkv,dv -> g = sigmoid(s_h * mean_i v_i + c_h), B,T,Hkv, float64
    z = v.double().sum(-1) / v.shape[-1] * s.double() + c.double()
    return 1 / (1 + torch.exp(-z))


def gate_errors(model):
    _, cache = model.run_with_cache(ids)
    err_g = err_out = 0.0
    for l, blk in enumerate(model.blocks):
        v, g = cache[f"blocks.{l}.attn.hook_v"], cache[f"blocks.{l}.attn.hook_v_gate"]
        hand = by_hand_gate(v, blk.attn.gate.s, blk.attn.gate.c)
        err_g = max(err_g, (g.double() - hand).abs().max().item())
        v_out = cache[f"blocks.{l}.attn.hook_v_out"].double()
        err_out = max(err_out, (v_out - hand[..., None] * v.double()).abs().max().item())
    return err_g, err_out


with torch.no_grad():
    out["trained_gate"] = gate_errors(gated)  # as trained
    for blk in gated.blocks:  # far from 1/2 and different per KV head, so a wrong formula shows
        blk.attn.gate.s.copy_(torch.linspace(-3.0, 3.0, blk.attn.gate.s.numel()))
        blk.attn.gate.c.copy_(torch.linspace(-1.0, 1.0, blk.attn.gate.c.numel()))
    out["set_gate"] = gate_errors(gated)

    routing = create("meanrouting", seed=0).eval()  # its catalogue entry, in a process that never registered it
    out["routing_info"] = [routing.probe_info.has_value_gate, routing.probe_info.gate_on_logits]
    for blk in routing.blocks:
        blk.attn.gate.s.copy_(torch.linspace(-30.0, 30.0, blk.attn.gate.s.numel()))
        blk.attn.gate.c.copy_(torch.linspace(-2.0, 1.0, blk.attn.gate.c.numel()))
    _, cache = routing.run_with_cache(ids)
    err_p = err_v = 0.0
    for l, blk in enumerate(routing.blocks):
        q, k = cache[f"blocks.{l}.attn.hook_rot_q"].double(), cache[f"blocks.{l}.attn.hook_rot_k"].double()
        v = cache[f"blocks.{l}.attn.hook_v"]
        log_g = torch.log(by_hand_gate(v, blk.attn.gate.s, blk.attn.gate.c))  # B,T,Hkv
        H, Hkv, T = q.shape[2], k.shape[2], q.shape[1]
        k, log_g = k.repeat_interleave(H // Hkv, 2), log_g.repeat_interleave(H // Hkv, 2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1]) + log_g.permute(0, 2, 1)[:, :, None]
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
        pattern = cache[f"blocks.{l}.attn.hook_pattern"].double()
        err_p = max(err_p, (pattern - scores.softmax(-1)).abs().max().item())
        err_v = max(err_v, (cache[f"blocks.{l}.attn.hook_v_out"] - v).abs().max().item())
    out["routing"] = [err_p, err_v]

    mix = create("uniformmix", seed=0).eval()
    _, cache = mix.run_with_cache(ids)
    states = [cache["hook_embed"].double()]
    err_s = err_w = 0.0
    for l in range(mix.config.n_layers - 1):
        states.append(cache[f"blocks.{l}.hook_resid_post"].double())
        hand = sum(states) / len(states)  # the mean of X_0 .. X_{l+1}
        err_s = max(err_s, (cache[f"blocks.{l + 1}.hook_resid_pre"].double() - hand).abs().max().item())
        w = cache[f"blocks.{l}.dense.hook_weights"]
        err_w = max(err_w, (w.double() - 1 / len(states)).abs().max().item() if w.shape[-1] == len(states) else 1.0)
    out["mix"] = [err_s, err_w]

sources = ["sources", "--model", f"{tmp}/depth", "--batches", "1", "--batch-size", "2", "--ctx", "32", "--quiet"]
assert main([*sources, "--out", f"{tmp}/sources"]) == 0
gates = ["gates", "--model", f"{tmp}/gate", "--batches", "1", "--batch-size", "2", "--ctx", "32", "--min-count", "1"]
assert main([*gates, "--quiet", "--out", f"{tmp}/gates"]) == 0
print(json.dumps(out))
"""


def expected_blocks() -> tuple[dict[str, str], list[str]]:
    return {
        "probe/models/gates.py": GATES,
        "probe/models/depth_mechanisms/uniform.py": UNIFORM,
        "probe/models/depth_mechanisms/uniform_mix.py": UNIFORM_MIX,
    }, ["    " + e + "\n" for e in ENTRIES]


@pytest.fixture(scope="module")
def followed(tmp_path_factory):
    """The guide applied to a clean copy, run there in two interpreters: (files touched, guide, first, second, tmp)."""
    guide = Guide(PAGE)
    root = clean_copy(tmp_path_factory.mktemp("tree"), guide)
    before = snapshot(root)
    apply(root, guide)
    files = touched(before, snapshot(root))
    tmp = tmp_path_factory.mktemp("runs")
    r = in_copy(root, "-c", FIRST, tmp, *TRAIN)
    assert r.returncode == 0, r.stderr[-3000:]
    first = json.loads(r.stdout.strip().splitlines()[-1])
    r = in_copy(root, "-c", SECOND, tmp)
    assert r.returncode == 0, r.stderr[-3000:]
    second = json.loads(r.stdout.strip().splitlines()[-1])
    return files, guide, first, second, tmp


def test_the_page_shows_the_blocks_this_test_expects():
    guide = Guide(PAGE)
    assert (guide.files, guide.entries) == expected_blocks()
    assert (ROOT / "docs" / PAGE).read_text(encoding="utf-8").count(SHIPPED) == 2  # the catalogue blocks add


def test_each_mechanism_is_its_module_and_a_catalogue_entry(followed):
    files, guide, *_ = followed
    assert files == guide.touches() == sorted({*GATE_FILES, *DEPTH_FILES, *DENSE_FILES})
    # per kind: the gates' class in gates.py, each depth toy its own module, and one catalogue line each
    assert {len(GATE_FILES), len(DEPTH_FILES), len(DENSE_FILES)} == {2}


def test_probe_models_lists_the_catalogue_entries(followed):
    listing = followed[2]["models"]
    for name, description in [
        ("meangate", "value gate on the mean of each read (a toy)"),
        ("meanrouting", "routing-slot gate on the mean of each read (a toy)"),
        ("uniform-block{N}", "uniform average over the sources of N blocks (a toy)"),
        ("uniformmix", "mean of all earlier block states after each block (a toy)"),
    ]:
        assert name in listing and description in listing


def test_the_gate_trains_reloads_elsewhere_and_computes_its_formula(followed):
    _, _, _, second, tmp = followed
    assert (second["gate_class"], second["gate_variant"]) == ("MeanGate", "meangate")
    assert second["trained_s"] > 0  # probe train moved the gate's parameters
    assert second["reload_logits"] == 0  # the other process builds the very model probe train saved
    losses = [
        r["loss"] for r in map(json.loads, (tmp / "gate" / "metrics.jsonl").read_text().splitlines()) if "loss" in r
    ]
    assert losses and np.isfinite(losses).all()
    for errors in (second["trained_gate"], second["set_gate"]):  # hook_v_gate, and hook_v_out = g ⊙ v
        assert max(errors) < 1e-5, errors
    summary = pd.read_csv(tmp / "gates" / "gates_summary.csv").iloc[0]  # `probe gates --model RUN` reads it
    assert 0.4 < summary["mean_gate"] < 0.6  # three steps from s = c = 0: every gate still near 1/2


def test_the_routing_gate_biases_the_logits_by_log_g(followed):
    second = followed[3]
    assert second["routing_info"] == [True, True]  # declared by the class (routing = True), not by its name
    pattern_error, value_error = second["routing"]
    assert pattern_error < 1e-5  # softmax(q·k/√d + log g_j) over the causal keys, by hand
    assert value_error == 0  # the values pass unchanged


def test_the_dense_mix_averages_the_block_states(followed):
    streams, weights = followed[3]["mix"]
    assert streams < 1e-5 and weights < 1e-7


def test_probe_train_and_probe_sources_run_on_the_depth_read(followed):
    tmp = followed[4]
    config = json.loads((tmp / "depth" / "model" / "config.json").read_text())
    assert (config["depth"], config["depth_blocks"], config["probe_variant"]) == ("uniform", 3, "uniform-block3")
    # tiny tier: 6 layers, 12 sub-layers in 3 blocks of 4; site t reads the embedding, the completed blocks and the
    # partial block of the t-1 sub-layers written before it
    n_sources = [1 + w // 4 + (w % 4 > 0) for w in range(1, 13)]
    out = tmp / "sources"
    sites = pd.read_csv(out / "sources_sites.csv")
    assert sites["n_sources"].tolist() == n_sources and sites["site"].iloc[-1] == "final_read"
    np.testing.assert_allclose(sites["neff_mean"], n_sources, rtol=1e-6)  # uniform: N_eff = S, every token alike
    np.testing.assert_allclose(sites["top1_mass"], 1 / np.array(n_sources), rtol=1e-6)
    np.testing.assert_allclose(sites["input_dependence"], 0, atol=1e-9)
    np.testing.assert_allclose(sites["mass_embedding"] + sites["mass_blocks"] + sites["mass_partial"], 1, rtol=1e-6)
    heat = pd.read_csv(out / "sources_heatmap.csv").set_index("site")
    cells = heat[["embed", "block1", "block2", "block3", "partial"]].to_numpy()
    for row, n in zip(cells, n_sources):
        read = row[~np.isnan(row)]
        assert len(read) == n
        np.testing.assert_allclose(read, 1 / n, rtol=1e-6)  # each cell the site reads is 1/S, the rest empty
    page = (out / "sources.html").read_text()
    assert "Mean depth weights" in page and "Effective number of sources" in page
