"""``protocol='gu2025'`` on Gemma 3 270M equals Gu et al.'s own evaluation (sail-sg/Attention-Sink
eval_sink_open_source.py, run by scripts/authors/gu2025_sink_eps.py on the same converted weights with HF eager
attention) to 1e-6: the mean α0 of every (layer, head) and Sink^eps at every ε, on natural text (WikiText-2 test),
random tokens and a repeated token. The windows are probe's own (text_windows, synthetic:random / synthetic:repeat)
and must be the fixture's inputs exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import probe
from probe.analyses.sink_pass import sink_analyses
from probe.checkpoints import gguf
from probe.data.synthetic import parse_token_domain
from probe.data.windows import text_windows

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "authors" / "gu2025" / "gemma-3-270m.json"
GOLDEN = json.loads(FIXTURE.read_text())
N, SEED = GOLDEN["settings"]["n"], GOLDEN["settings"]["seed"]
EPS = tuple(GOLDEN["settings"]["eps"])


@pytest.fixture(scope="module")
def gemma():
    if not gguf.gemma_installed():
        pytest.skip(f"Gemma 3 270M weights not installed ({gguf.EXTRA_HINT}; probe-attn[dev] includes it)")
    return probe.load(gguf.GEMMA_NAME)


def domain_windows(model, domain: str):
    if domain == "natural":
        w = text_windows(GOLDEN["corpus"], model.tokenizer, n=N, ctx=64, batch_size=8)
        assert w.corpus_fingerprint == GOLDEN["corpus_fingerprint"]
        assert w.doc_ids.flatten().tolist() == GOLDEN["natural_documents"]
        assert w.bos and (w.tokens[..., 0] == model.tokenizer.bos_token_id).all()
        return w
    w = parse_token_domain(f"synthetic:{domain}[T=64,n={N},seed={SEED}]").windows(model.probe_info.vocab_size)
    assert w.inputs.reshape(N, 64).tolist() == GOLDEN["domains"][domain]["input_ids"]
    return w


@pytest.mark.parametrize("domain", ["natural", "random", "repeat"])
def test_gu2025_preset_equals_the_authors_evaluation(gemma, domain):
    got = sink_analyses(gemma, domain_windows(gemma, domain), eps=EPS, protocol="gu2025")
    heads = got["sink_eps"]["heads"]
    want = GOLDEN["domains"][domain]
    alpha = heads.pivot(index="layer", columns="head", values="key0_mass").to_numpy()
    np.testing.assert_allclose(alpha, np.array(want["alpha0_mean"]), rtol=0, atol=1e-6)
    summary = got["sink_eps"]["summary"].set_index("epsilon")
    for e in EPS:  # theirs is a float32 percentage
        assert summary.loc[e, "sink_share"] == pytest.approx(want["percent"][f"{e:g}"] / 100, abs=1e-6)
    for table in ("sinks", "sink_eps"):
        assert got[table]["meta"]["protocol"].iloc[0] == "gu2025"
    assert got["sink_eps"]["meta"]["rows"].iloc[0] == "t>=0"
