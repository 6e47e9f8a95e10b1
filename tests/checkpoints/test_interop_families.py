"""``probe.wrap`` on a TransformerLens TransformerBridge and on an nnsight model of the same weights gives the tables
``probe.load`` gives, for one model type per adapter family (those TransformerLens's bridge maps; the generic route
through Afmoe), and the bridge keeps working untouched."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import probe
from probe.analyses.sinks import sink_stats
from probe.checkpoints import wrap
from probe.checkpoints.tiny import build_tiny

# one model_type per adapter family (with its TransformerBridge architecture)
FAMILY_TYPES = (
    "gpt2", "gpt_neo", "gptj", "opt", "phi", "phi3", "olmo2", "cohere2", "granite", "stablelm", "glm4",
    "bloom", "mpt", "falcon", "apertus", "mixtral", "afmoe",
)  # fmt: skip
pytestmark = pytest.mark.filterwarnings("ignore:LanguageModel is deprecated")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_interop_families")
    return {mt: build_tiny(mt, root / mt, seed=3) for mt in FAMILY_TYPES}


def fresh(d):
    return AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).eval()


def windows():
    return torch.randint(2, 90, (1, 2, 13), generator=torch.Generator().manual_seed(5))


def same_tables(a, b):
    x, y = (t["heads"].select_dtypes("number").to_numpy(float) for t in (a, b))
    torch.testing.assert_close(torch.tensor(x), torch.tensor(y), atol=1e-6, rtol=0, equal_nan=True)


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
@torch.no_grad()
def test_bridge_and_nnsight_give_the_tables_of_probe_load(dirs, model_type):
    import nnsight
    from transformer_lens.model_bridge import TransformerBridge

    d = dirs[model_type]
    loaded = probe.load(str(d))
    want = sink_stats(loaded, windows())
    bridge = TransformerBridge.boot_transformers(str(d), hf_model=fresh(d), tokenizer=AutoTokenizer.from_pretrained(d))
    x = windows()[0, :, :-1]
    before = bridge(x)
    from_bridge = wrap(bridge)
    assert type(from_bridge) is type(loaded) and from_bridge.probe_info.extra["wrapped"] == "TransformerBridge"
    same_tables(sink_stats(from_bridge, windows()), want)
    torch.testing.assert_close(bridge(x), before, atol=0, rtol=0)  # the bridge is untouched
    from_nnsight = wrap(nnsight.LanguageModel(fresh(d), tokenizer=AutoTokenizer.from_pretrained(d)))
    same_tables(sink_stats(from_nnsight, windows()), want)
