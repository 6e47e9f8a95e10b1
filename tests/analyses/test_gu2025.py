"""Gu et al.'s Sink^eps protocol as a preset (docs/definitions.md#sink-eps-protocols) and the token domains
(docs/definitions.md#token-domains): the per-window indicator, streaming = pattern for every variant, Gu et al.'s
windows, the synthetic random / repeated inputs, and the CLI's flags, errors and meta. The golden comparison with the
authors' evaluation on Gemma 3 270M is tests/analyses/test_gu2025_golden.py."""

from __future__ import annotations

import json

import pytest
import torch

from probe.analyses.sink_heads import PROTOCOLS, SinkEpsAccumulator, sink_heads
from probe.analyses.sink_pass import sink_analyses
from probe.cli import flags
from probe.data.corpus import Corpus
from probe.data.synthetic import TokenDomain, is_token_domain, parse_synthetic, parse_token_domain
from probe.data.windows import batch_layout, text_windows
from probe.hooks.info import ModelInfo
from tests.support.analyses import every_variant, tiny, windows
from tests.support.cli import probe


def hand_info(L=1, H=2):
    return ModelInfo(
        name="hand",
        family="test",
        n_layers=L,
        d_model=8,
        n_heads=H,
        n_kv_heads=H,
        d_head=4,
        n_ctx=16,
        vocab_size=10,
        layer_types=[],
    )


def numbers(df):
    return torch.tensor(df.select_dtypes("number").to_numpy(float))


# ------------------------------------------------------------------------------------------------------- the statistic


def test_per_window_indicator_is_not_the_pooled_threshold():
    """Two windows, one head: α0 (rows t >= 0) is 0.5 in one window and 0.2 in the other. Pooled: α = 0.35 > 0.3, one
    sink head; Gu et al.: the head is a sink in one window of two, Sink^0.3 = 0.5."""
    key0 = torch.tensor([[1.0, 0.5, 0.3, 0.2], [1.0, 0.0, 0.0, -0.2]]).view(2, 1, 4)  # α0 = 0.5 and 0.2
    out = {}
    for per_window in (False, True):
        acc = SinkEpsAccumulator(hand_info(H=1), eps=(0.3, 0.6), include_query0=True, per_window=per_window)
        acc.add(0, key0, torch.ones(2, 1, 4), torch.zeros(2, 1, 4))
        out[per_window] = acc.tables()["summary"].set_index("epsilon")
    assert out[False].loc[0.3, "sink_share"] == 1.0 and out[False].loc[0.6, "sink_share"] == 0.0
    assert out[True].loc[0.3, "sink_share"] == 0.5 and out[True].loc[0.6, "sink_share"] == 0.0
    assert out[True].loc[0.3, "n_sink_heads"] == 0.5  # sink heads per window, on average


def test_per_window_standard_error_leaves_out_one_batch_of_windows():
    acc = SinkEpsAccumulator(hand_info(H=1), eps=0.3, include_query0=True, per_window=True)
    for a in (0.5, 0.2, 0.4):  # three batches of one window each: indicators 1, 0, 1
        acc.add(0, torch.full((1, 1, 4), a), torch.ones(1, 1, 4), torch.zeros(1, 1, 4))
    s = acc.tables()["summary"].iloc[0]
    loo = torch.tensor([0.5, 1.0, 0.5], dtype=torch.float64)  # the share with each batch left out
    want = float(((len(loo) - 1) / len(loo) * ((loo - loo.mean()) ** 2).sum()).sqrt())
    assert s["sink_share"] == pytest.approx(2 / 3) and s["sink_share_se"] == pytest.approx(want)


def test_gu2025_on_a_model_equals_its_definition_from_the_pattern():
    """α0 per (window, layer, head) from hook_pattern by hand: mean over i = 0..63 of A[i, 0]; Sink^ε is the mean of
    α0 > ε over windows, layers and heads. The preset must give exactly that; the pooled default does not."""
    from probe.hooks import names

    model, toks = tiny("sink+proj"), windows(2, 3, 64)
    info = model.probe_info
    alpha = []
    for ids in toks[..., :-1]:
        _, cache = model.run_with_cache(ids, names_filter=lambda n: n.endswith("hook_pattern"))
        alpha.append(
            torch.stack(
                [cache[names.attn(l, "hook_pattern")][..., 0].double().mean(-1) for l in range(info.n_layers)], 1
            )
        )  # (B, L, H)
    alpha = torch.cat(alpha)  # (windows, L, H)
    eps = (0.05, 0.1, 0.2)
    got = sink_heads(model, toks, eps=eps, protocol="gu2025")
    pooled = sink_heads(model, toks, eps=eps)
    for e in eps:
        share = got["summary"].set_index("epsilon").loc[e, "sink_share"]
        assert share == pytest.approx(float((alpha > e).double().mean()), abs=1e-12)
    assert got["heads"]["key0_mass"].tolist() == pytest.approx(alpha.mean(0).flatten().tolist(), abs=1e-6)
    assert (pooled["heads"]["key0_mass"] - got["heads"]["key0_mass"]).abs().max() > 1e-3  # rows t >= 1: another α
    assert got["meta"]["protocol"].iloc[0] == "gu2025" and pooled["meta"]["protocol"].iloc[0] == "pooled"
    assert got["meta"]["threshold"].iloc[0] == "per window" and pooled["meta"]["threshold"].iloc[0] == "pooled"


@pytest.mark.parametrize("variant,over", every_variant())
def test_gu2025_streaming_equals_pattern(variant, over):
    model = tiny(variant, **over)
    toks = windows(2, 2, 64)
    fast = sink_heads(model, toks, eps=(0.05, 0.1, 0.3), protocol="gu2025")
    ref = sink_heads(model, toks, eps=(0.05, 0.1, 0.3), protocol="gu2025", method="pattern")
    for key in ("heads", "layers", "summary"):
        assert torch.allclose(numbers(fast[key]), numbers(ref[key]), atol=1e-5, equal_nan=True), key


def test_gu2025_refuses_windows_of_another_length_and_unknown_protocols():
    model = tiny()
    with pytest.raises(ValueError, match="reads the first 64 tokens of each text, but these windows hold 16"):
        sink_heads(model, windows(1, 2, 16), protocol="gu2025")
    with pytest.raises(ValueError, match="unknown protocol 'gu'; choose one of pooled, gu2025"):
        sink_analyses(model, windows(1, 2, 64), protocol="gu")
    assert flags.PROTOCOLS == PROTOCOLS  # the CLI's light copy


def test_every_result_of_the_one_pass_records_the_protocol():
    model = tiny("sink+proj")
    found = sink_analyses(model, windows(1, 2, 64), massive=True, protocol="gu2025")
    for name in ("sinks", "sink_eps", "massive"):
        assert found[name]["meta"]["protocol"].iloc[0] == "gu2025", name


# ------------------------------------------------------------------------------------------------------------ windows


class CharTokenizer:
    """One id per character, a BOS (id 1) first by default, as ``tokenizer(texts)`` of HF does with special tokens."""

    name_or_path, bos_token_id, eos_token_id = "chars", 1, None

    def __call__(self, texts, add_special_tokens=True, verbose=False):
        return {"input_ids": [([1] if add_special_tokens else []) + [2 + ord(c) % 90 for c in t] for t in texts]}


def test_text_windows_take_texts_in_order_with_the_special_tokens():
    texts = ["a" * 70, "short", "b" * 64, "c" * 63, "d" * 100, "e" * 64]
    w = text_windows(Corpus("hand", texts), CharTokenizer(), n=3, ctx=64, batch_size=8)
    assert w.doc_ids.flatten().tolist() == [0, 2, 4]  # in order; texts of < 65 tokens (BOS included) are passed over
    assert w.tokens.shape == (1, 3, 65) and (w.tokens[..., 0] == 1).all() and w.bos
    assert w.tokens[0, 1, 1:].tolist() == [2 + ord("b") % 90] * 64
    meta = w.to_dict()
    assert meta["mode"] == "texts" and meta["texts_skipped"] == 2 and meta["special_tokens"] == "tokenizer default"
    few = text_windows(Corpus("hand", texts), CharTokenizer(), n=10, ctx=64)
    assert few.doc_ids.flatten().tolist() == [0, 2, 4, 5]  # all of them when there are fewer than n
    with pytest.raises(ValueError, match="no text of at least 65 tokens"):
        text_windows(Corpus("hand", ["x"]), CharTokenizer(), n=2)


def test_batch_layout_keeps_every_window():
    assert batch_layout(60, 8) == (10, 6) and batch_layout(64, 8) == (8, 8) and batch_layout(37, 8) == (37, 1)
    assert batch_layout(3, 8) == (1, 3)


# ------------------------------------------------------------------------------------------------------- token domains


def test_random_and_repeat_domains_draw_as_documented():
    r = parse_token_domain("synthetic:random[T=64,n=5,seed=3]")
    ids = r.generate(1000)
    assert ids.tolist() == torch.randint(0, 1000, (5, 65), generator=torch.Generator().manual_seed(3)).tolist()
    rep = parse_token_domain("synthetic:repeat[T=8,n=4,seed=1]").generate(50)
    one = torch.randint(0, 50, (4,), generator=torch.Generator().manual_seed(1))
    assert (rep == one[:, None]).all() and rep.shape == (4, 9)
    fixed = parse_token_domain("synthetic:repeat[ token = 7 , n=2, T=4]").generate(50)
    assert (fixed == 7).all()
    with_bos = parse_token_domain("synthetic:random[T=4,n=3,bos=1]").generate(50, bos_id=49)
    assert (with_bos[:, 0] == 49).all() and (with_bos[:, 1:] == r.__class__("random", 4, 3).generate(50)[:, 1:]).all()
    w = parse_token_domain("synthetic:random[T=16,n=6]").windows(97, batch_size=4)
    assert w.tokens.shape == (2, 3, 17) and w.to_dict()["bos"] is False and w.to_dict()["vocab_size"] == 97
    assert TokenDomain("repeat", token=3).spec() == "synthetic:repeat[T=64,n=100,token=3,seed=0,bos=0]"
    assert parse_token_domain(TokenDomain("random", T=8).spec()) == TokenDomain("random", T=8)
    assert is_token_domain("synthetic:random") and not is_token_domain("synthetic:bb[T=4]")


def test_token_domain_without_n_follows_the_batches_flags():
    from probe.jobs.inputs import token_domain_windows
    from probe.jobs.specs import WindowSpec

    model = tiny()
    got = token_domain_windows(WindowSpec(data="synthetic:random[T=8]", batches=2, batch_size=3), model)
    assert got.tokens.shape == (2, 3, 9) and got.domain.n == 6
    named = token_domain_windows(WindowSpec(data="synthetic:repeat[T=8,n=5]", batches=2, batch_size=3), model)
    assert named.tokens.shape[0] * named.tokens.shape[1] == 5  # the name's n wins over --batches
    assert parse_token_domain("synthetic:random[T=8]").n == 100  # in Python without the flags: the default


@pytest.mark.parametrize(
    "name,message",
    [
        ("synthetic:random[T=1]", r"T=1 is not valid; choose at least 2"),
        ("synthetic:random[n=0]", r"n=0 is not valid; choose at least 1"),
        ("synthetic:random[token=3]", r"unknown key 'token' in .*; valid keys: T, n, seed, bos"),
        ("synthetic:repeat[bos=2]", r"bos=2 is not valid; choose 0 \(no BOS\) or 1"),
        ("synthetic:repeat[token=-1]", r"token=-1 is not valid"),
        ("synthetic:repeat[token=x]", r"token='x' in .* must be an integer"),
        ("synthetic:repeat[n=2,n=3]", r"key 'n' given twice"),
        ("synthetic:random[T]", r"'T' in .* is not key=value; keys: T, n, seed, bos"),
    ],
)
def test_token_domain_errors_are_one_line(name, message):
    with pytest.raises(ValueError, match=message) as e:
        parse_token_domain(name)
    assert "\n" not in str(e.value)


def test_token_beyond_the_vocabulary_and_training_on_a_token_domain_are_errors():
    with pytest.raises(ValueError, match=r"token=500 is beyond the model's vocabulary; choose 0\.\.96"):
        parse_token_domain("synthetic:repeat[token=500]").generate(97)
    with pytest.raises(ValueError, match="bos=1 but the model's tokenizer has no BOS token"):
        parse_token_domain("synthetic:random[bos=1]").generate(97)
    with pytest.raises(ValueError, match="unknown synthetic task 'random'.*choose one of: bb"):
        parse_synthetic("synthetic:random[T=8]")  # what `probe train --data` parses: Bigram-Backcopy only


# -------------------------------------------------------------------------------------------------------- command line
# in-process (probe.cli.main.main, the command's own entry point): a subprocess costs ~10 s of imports on a busy machine


def cli(capsys, *args) -> tuple[int, str, str]:
    from probe.cli.main import main

    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_probe_sinks_gu2025_on_random_tokens_records_the_protocol(capsys):
    code, out, err = cli(
        capsys,
        "sinks",
        "--protocol",
        "gu2025",
        "--data",
        "synthetic:random[T=64,n=4,seed=1]",
        "--batch-size",
        "2",
        "--eps",
        "0.1",
        "0.3",
        "--json",
        "--quiet",
    )
    assert code == 0, err
    out = json.loads(out)
    meta = out["meta"]
    assert meta["protocol"] == "gu2025" and meta["corpus"] == "synthetic:random[T=64,n=4,seed=1,bos=0]"
    assert meta["ctx"] == 64 and meta["n_documents"] == 4 and meta["bos"] is False
    summary = out["tables"]["sink_eps_summary"]
    assert [s["epsilon"] for s in summary] == [0.1, 0.3] and {s["rows"] for s in summary} == {"t>=0"}
    code, out, err = cli(capsys, "sinks", "--data", "synthetic:random[T=64,n=4,seed=1]", "--json", "--quiet")
    assert code == 0, err
    out = json.loads(out)  # the default: the sink statistics' meta as before (no key), rows t >= 1
    assert "protocol" not in out["meta"] and out["tables"]["sink_eps_summary"][0]["rows"] == "t>=1"


def test_probe_sinks_gu2025_on_a_jsonl_of_texts(tmp_path, capsys):
    texts = tmp_path / "texts.jsonl"
    texts.write_text(
        "".join(
            json.dumps({"text": "The cat sat on the mat and looked around the room. " * 8 + str(i)}) + "\n"
            for i in range(3)
        )
        + json.dumps({"text": "too short"})
        + "\n"
    )
    code, out, err = cli(capsys, "sinks", "--protocol", "gu2025", "--data", texts, "--json", "--quiet")
    assert code == 0, err
    meta = json.loads(out)["meta"]
    assert meta["mode"] == "texts" and meta["n_documents"] == 3 and meta["texts_skipped"] == 1
    assert meta["protocol"] == "gu2025" and meta["ctx"] == 64


@pytest.mark.parametrize(
    "args,message",
    [
        (["--ctx", "128"], "--ctx 128 conflicts with --protocol gu2025 (--protocol gu2025 reads the first 64 tokens"),
        (["--window-mode", "first"], "--window-mode first conflicts with --protocol gu2025"),
        (["--bos"], "--bos conflicts with --protocol gu2025"),
        (["--data", "synthetic:random[T=32]"], "T=32 conflicts with --protocol gu2025"),
        (["--data", "synthetic:bb"], "--protocol gu2025 reads text or synthetic:random / synthetic:repeat"),
        (["--data", "synthetic:repeat[token=99999]"], "token=99999 is beyond the model's vocabulary; choose 0..8191"),
        (["--data", "synthetic:random[seed=x]"], "--data: seed='x' in 'synthetic:random[seed=x]' must be an integer"),
    ],
)
def test_probe_sinks_gu2025_conflicts_are_one_line_usage_errors(args, message, capsys):
    code, _, err = cli(capsys, "sinks", "--protocol", "gu2025", *args, "--quiet")
    assert code == 2, err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_probe_sinks_gu2025_conflict_exits_2_from_the_shell():
    r = probe("sinks", "--protocol", "gu2025", "--ctx", "128", "--quiet")
    assert r.returncode == 2 and "--ctx 128 conflicts with --protocol gu2025" in r.stderr, r.stderr


def test_probe_report_gu2025(tmp_path, capsys):
    code, out, err = cli(
        capsys,
        "report",
        "--models",
        "probe/tiny-sink+proj",
        "--protocol",
        "gu2025",
        "--data",
        "synthetic:repeat[T=64,n=2]",
        "--out",
        tmp_path / "rep",
        "--json",
        "--quiet",
    )
    assert code == 0, err
    assert json.loads(out)["settings"]["protocol"] == "gu2025"
    code, _, err = cli(
        capsys,
        "report",
        "--models",
        "probe/tiny-sink+proj",
        "--protocol",
        "gu2025",
        "--ctx",
        "32",
        "--out",
        tmp_path / "bad",
        "--quiet",
    )
    assert code == 2 and "--ctx 32 conflicts with --protocol gu2025" in err, err
