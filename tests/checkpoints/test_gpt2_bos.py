"""GPT-2 under the BOS rule (docs/definitions.md#bos-rule): its tokenizer adds no BOS, so probe's windows and text
calls are raw text; TransformerLens prepends ``<|endoftext|>`` by default, which ``bos=True`` / ``prepend_bos=True``
reproduce. A tiny GPT-2 with a tokenizer set up as GPT-2's is (``<|endoftext|>`` its BOS, EOS and nothing added)."""

from __future__ import annotations

import pytest
import torch

import probe
from probe.checkpoints.tiny import VOCAB, tiny_model
from probe.data.windows import wants_bos, window_bos_id

EOT = 1  # <|endoftext|>: GPT-2's BOS and EOS (50256 there), never added by its tokenizer
TEXT = "w5 w7 w9"


def gpt2_style_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<|endoftext|>": EOT, **{f"w{i}": i for i in range(2, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    eot = "<|endoftext|>"
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token=eot, eos_token=eot)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_gpt2_bos")
    tiny_model("gpt2").save_pretrained(d)
    gpt2_style_tokenizer().save_pretrained(d)
    return d


@torch.no_grad()
def test_gpt2_reads_raw_text_and_transformer_lens_prepends_endoftext(gpt2_dir):
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m = probe.load(str(gpt2_dir))
    tok = m.tokenizer
    assert tok("w5 w7")["input_ids"] == [5, 7] and tok.bos_token_id == EOT  # a BOS token that is never added
    assert not wants_bos(m, tok) and window_bos_id(m, tok) is None  # windows: raw text
    assert window_bos_id(m, tok, bos=True) == EOT  # --bos: <|endoftext|> first, as TransformerLens feeds GPT-2
    assert m.to_tokens(TEXT).tolist() == [[5, 7, 9]]

    hf = AutoModelForCausalLM.from_pretrained(gpt2_dir, attn_implementation="eager", dtype=torch.float32).eval()
    bridge = TransformerBridge.boot_transformers(
        str(gpt2_dir), hf_model=hf, tokenizer=AutoTokenizer.from_pretrained(gpt2_dir)
    )
    want = bridge.to_tokens(TEXT)  # TransformerLens's default: prepend_bos=True
    assert want.tolist() == [[EOT, 5, 7, 9]]
    assert torch.equal(m.to_tokens(TEXT, prepend_bos=True).cpu(), want.cpu())
    torch.testing.assert_close(m(TEXT, prepend_bos=True, return_type="logits"), bridge(want), atol=1e-5, rtol=0)
