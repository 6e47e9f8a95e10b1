"""Helpers of the analysis tests: tiny custom models and random token windows."""
import torch

from probe.models import create

from tests.support import SMALL

SMALL = dict(SMALL, vocab_size=97)  # random windows draw from 97 ids


def windows(n_batches=2, batch=3, ctx=16, vocab=97, seed=0, low=0):
    """(N, B, ctx+1) random token windows."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, vocab, (n_batches, batch, ctx + 1), generator=g)


def tiny(variant="baseline", seed=0, **over):
    model = create(variant, seed=seed, **{**SMALL, **over})
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 1)
        for name, p in model.named_parameters():
            if name.endswith("attn.sink"):  # nonzero sink logits
                p.copy_(torch.randn(p.shape, generator=g) * 2)
            elif name.endswith("gate.w"):  # a projection gate with a direction
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("read.query"):  # depth routing that is not uniform
                p.copy_(torch.randn(p.shape, generator=g))
    return model.eval()


def periodic(n_batches, batch, ctx, vocab=32, period=5, seed=0):
    """Windows that repeat a random block of `period` tokens: predictable by attending back `period` positions."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, vocab, (n_batches, batch, period), generator=g)
    return base.repeat(1, 1, (ctx + 1) // period + 1)[..., : ctx + 1]


def trained_periodic(variant="baseline", steps=60, seed=0, period=2):
    """A 2-layer model trained briefly (~1 s) on windows that repeat every `period` tokens, so its loss depends on
    what attention reads (predicting x[t+1] = x[t+1-period] needs attention to an earlier position)."""
    torch.manual_seed(seed)
    model = create(variant, seed=seed, n_layers=2, d_model=32, n_heads=4, d_mlp=64, n_ctx=64, vocab_size=32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    data = periodic(steps, 16, 32, period=period, seed=seed + 100)
    for x in data:
        logits = model(x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), float(loss.detach())


def every_variant() -> list[tuple[str, dict]]:
    """(variant, overrides) for every registered variant (routed ones at small N and r), plus grouped-query attention
    with a phantom and with a gate: what a test comparing a streaming analysis with the pattern runs over, so a new
    mechanism is covered without editing a list."""
    from probe.models import VARIANTS

    names = [v.replace("{N}", "2").replace("{r}", "8") for v in VARIANTS]  # parametric names at N = 2, r = 8
    return [(v, {}) for v in names] + [("baseline", dict(n_kv_heads=2)), ("sink+proj", dict(n_kv_heads=2))]
