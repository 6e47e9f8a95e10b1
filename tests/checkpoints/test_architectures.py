"""The coverage table (probe/checkpoints/architectures.json, docs/reference/architectures.md): every entry re-checked
against HF eager on its tiny config (tests/support/parity.py), half of them here and half in
test_architectures_more.py (two files: pytest-xdist runs one file per worker); ``-m slow`` regenerates the table and
its page from the same checks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers

from probe.checkpoints import architectures
from tests.support import parity

ROOT = Path(__file__).resolve().parents[2]
DOCS_PAGE = ROOT / "docs" / "reference" / "architectures.md"
TABLE = architectures.table()
same_transformers = pytest.mark.skipif(
    TABLE["transformers"] != transformers.__version__,
    reason=f"the table was generated with transformers {TABLE['transformers']}: regenerate it with -m slow",
)
# the families people study most (GPT-2 to Qwen3-Next, ALiBi, latent attention): each must be supported
NAMED = (
    "gpt2", "gpt_neo", "gptj", "opt", "phi", "phi3", "olmo", "olmo2", "olmo3", "mixtral", "qwen2_moe", "qwen3_moe",
    "olmoe", "smollm3", "granite", "stablelm", "starcoder2", "cohere2", "gemma4_text", "llama4_text", "qwen3_next",
    "qwen3_5_text", "deepseek_v3", "bloom", "mpt", "falcon",
)  # fmt: skip


def shard(index: int) -> list[str]:
    return sorted(TABLE["types"])[index::2]


@same_transformers
@pytest.mark.parametrize("model_type", shard(0))
def test_entry_still_holds(model_type):
    parity.check_entry(model_type, TABLE)


@same_transformers
def test_the_table_lists_every_causal_lm_type():
    assert sorted(TABLE["types"]) == parity.causal_lm_types()
    assert TABLE["counts"] == architectures.counts(TABLE["types"])


def test_the_docs_page_is_the_tables():
    assert DOCS_PAGE.read_text() == architectures.markdown(TABLE)


def test_supported_reaches_the_transformer_lens_bridge():
    """At least as many decoder-only types supported as TransformerLens's bridge maps causal LMs (101 here)."""
    from transformer_lens.factories.architecture_adapter_factory import SUPPORTED_ARCHITECTURES

    bridge = sum(1 for a in SUPPORTED_ARCHITECTURES if a.endswith("ForCausalLM"))
    assert TABLE["counts"]["supported"] >= bridge


# partial by a rule of the hook algebra, for a reason of the architecture: Gemma 4 multiplies each layer's output by a
# learned scalar and adds its per-layer input after the MLP, so resid_post is not resid_mid + mlp_out
PARTIAL_BY_DESIGN = {"gemma4_text": ["resid_post"]}


def test_every_type_the_issue_names_is_supported():
    got = {mt: TABLE["types"][mt]["status"] for mt in NAMED}
    assert got == {mt: "partial" if mt in PARTIAL_BY_DESIGN else "supported" for mt in NAMED}
    for mt, rules in PARTIAL_BY_DESIGN.items():
        record = TABLE["types"][mt]
        assert record["lacks"] == [] and [b.split(" ")[0] for b in record["breaks"]] == rules


def test_refused_types_stop_before_any_weight(tmp_path):
    """probe.load (and the CLI's early --model check, which resolves first) refuses a refused type in one line."""
    import json

    import probe
    from probe.checkpoints.load import resolve

    refused = next(mt for mt, r in sorted(TABLE["types"].items()) if r["status"] == "refused")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": refused}))
    for call in (lambda: resolve(str(tmp_path)), lambda: probe.load(str(tmp_path))):
        with pytest.raises(architectures.UnsupportedArchitectureError, match=f"model_type '{refused}'") as e:
            call()
        assert "\n" not in str(e.value) and TABLE["types"][refused]["reason"] in str(e.value)


@pytest.mark.slow
def test_regenerate_the_table():
    data = parity.generate(architectures.TABLE_FILE, DOCS_PAGE)
    assert data["counts"]["supported"] > 0
