"""A hundred steps on bundled text lower the loss for the baseline and one variant of each family (by 3.7 nats from
~9.5 when last measured, each variant; the test asks for 2)."""

import pytest
import torch

from probe.data import WindowSampler, eval_batches, load_corpus, load_tokenizer, tokenize_documents
from probe.models import create
from probe.train.trainer import TrainConfig, evaluate, train
from tests.support import SMALL as TINY_TIER_SHRUNK  # noqa: E402

SMALL = dict(TINY_TIER_SHRUNK, d_model=64, d_mlp=128)


@pytest.fixture(scope="module")
def data():
    tok = load_tokenizer("probe-bpe-8k")
    docs = tokenize_documents(load_corpus("wikitext-2-valid"), tok)
    held_out = eval_batches("wikitext-2-test", tok, n_batches=2, batch_size=8, ctx=64, seed=0)
    return tok, docs, held_out


# baseline, then one variant of each family: abstention+gate, value activation, depth routing, dense, value residual
@pytest.mark.parametrize("variant", ["baseline", "sink+proj", "gatedv", "slr-block4-r16", "mudd", "value-residual"])
def test_training_lowers_held_out_loss(tmp_path, data, variant):
    tok, docs, held_out = data
    torch.manual_seed(0)
    model = create(variant, tier="tiny", seed=0, **SMALL)
    before = evaluate(model, held_out)
    sampler = WindowSampler(docs, 64, seed=0, eos_id=tok.eos_token_id)
    cfg = TrainConfig(steps=100, batch_size=8, lr=3e-3, warmup=10, eval_every=0, ckpt_every=0, log_every=50)
    train(model, sampler, cfg, tmp_path, progress=False)
    after = evaluate(model, held_out)
    assert after < before - 2.0, (variant, before, after)  # from ~ln(8192) = 9.0 to well below
