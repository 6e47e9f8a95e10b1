"""Cost model vs LR-AttnRes 2026: every Table 1 "Added FLOPs (%)" entry and the Appendix A.6 numbers."""

import pytest

from probe.analyses import costs as K

D, L, M = 1024, 24, 2816

# Table 1, copied from the paper (not from probe.analyses.costs): method, N (None = full), r, added FLOPs %.
PAPER_TABLE1 = [
    ("baseline", None, None, "0.0000"),
    ("attnres", None, None, "0.8131"),
    ("attnres", 4, None, "0.1116"),
    ("attnres", 8, None, "0.1754"),
    ("attnres", 16, None, "0.3029"),
    ("p-lr", None, 16, "0.8966"),
    ("p-lr", None, 32, "1.3865"),
    ("p-lr", None, 64, "2.3665"),
    ("p-lr", 4, 32, "1.0248"),
    ("p-lr", 8, 32, "1.0577"),
    ("p-lr", 16, 32, "1.1235"),
    ("s-lr", None, 16, "0.4129"),
    ("s-lr", None, 32, "0.4193"),
    ("s-lr", None, 64, "0.4320"),
    ("s-lr", None, 128, "0.4574"),
    ("s-lr", None, 256, "0.5082"),
    ("s-lr", None, 512, "0.6099"),
    ("s-lr", 4, 64, "0.0593"),
    ("s-lr", 8, 64, "0.0932"),
    ("s-lr", 16, 64, "0.1609"),
]


@pytest.mark.parametrize("method,N,r,printed", PAPER_TABLE1)
def test_table1_added_flops(method, N, r, printed):
    pct = 100 * K.added_flops(method, D, L, M, N, r) / K.base_flops(D, L, M)
    assert f"{pct:.4f}" == printed


def test_cost_table_matches_table1_and_module_copy():
    df = K.cost_table(D, L, M)
    assert [f"{x:.4f}" for x in df["added_flops_pct"]] == [row[3] for row in PAPER_TABLE1]
    assert [t[:3] for t in K.TABLE1] == [row[:3] for row in PAPER_TABLE1]


def test_appendix_a6_numbers():
    C = K.base_flops(D, L, M)
    assert C == 24 * (4 * 1024**2 + 3 * 1024 * 2816)
    assert f"{K.kernel_reduction_pct(D, 32):.2f}" == "48.44"
    assert K.key_proj_flops("p-lr", D, L, M, 32) == 2_981_888
    assert K.added_params("p-lr", D, L, M, 32) == 2_983_424
    assert K.added_params("s-lr", D, L, M, 32) == 1_536
    assert K.key_cache_increase_pct("p-lr", D, 32) == 3.125
    assert K.key_cache_increase_pct("s-lr", D, 32) == 0.0
    assert f"{K.p_lr_param_overhead_approx_pct(D, M, 32):.3f}" == "0.957"
    assert f"{100 * K.key_proj_flops('p-lr', D, L, M, 32) / C:.4f}" == "0.9673"
    # A.6 adds rounded parts (0.4193 + 0.9673 = 1.3866); the exact total rounds to Table 1's 1.3865.
    assert f"{100 * K.kernel_flops('s-lr', D, L, None, 32) / C:.4f}" == "0.4193"
    assert f"{100 * K.kernel_flops('p-lr', D, L, 8, 32) / C:.4f}" == "0.0904"


def test_source_counts_full_and_block():
    assert K.source_counts(2) == [1, 2, 3, 4, 5]
    # 2L = 4 sub-layers, N = 2 blocks of 2: embedding, + partial, + one block, + block and partial, + two blocks
    assert K.source_counts(2, 2) == [1, 2, 2, 3, 3]
    assert K.source_counts(3, 1) == [1, 2, 2, 2, 2, 2, 2]
    assert K.source_counts(L, 2 * L) == K.source_counts(L)  # one sub-layer per block is full mode
    assert len(K.source_counts(L, 4)) == 2 * L + 1
    assert K.source_counts(L, 4)[-1] == 5  # final site: embedding + 4 completed blocks


def test_s_src_convention():
    assert K.s_src(L) == sum(range(2, 2 * L + 2)) == 1224  # site 1 (embedding only) excluded, final site included
    assert [K.s_src(L, n) for n in (4, 8, 16)] == [168, 264, 456]
    assert K.s_src(2, 2) == 10


def test_block_count_must_divide_2L():
    with pytest.raises(ValueError, match=r"N=5 must divide 2L=12"):
        K.source_counts(6, 5)
    with pytest.raises(ValueError, match="N=0"):
        K.s_src(6, 0)


def test_method_and_rank_errors():
    with pytest.raises(ValueError, match="unknown method 'lr'"):
        K.kernel_flops("lr", D, L)
    with pytest.raises(ValueError, match="s-lr needs a rank"):
        K.added_flops("s-lr", D, L, M, None, None)
    with pytest.raises(ValueError, match="r=2048"):
        K.added_flops("s-lr", D, L, M, None, 2048)


def test_identities():
    # S-LR with r = d is AttnRes (same kernel); params differ by -2L(d-r) vs AttnRes (eq. 48)
    assert K.kernel_flops("s-lr", D, L, 8, D) == K.kernel_flops("attnres", D, L, 8)
    r = 64
    assert K.added_params("s-lr", D, L, M, r) - K.added_params("attnres", D, L, M) == -2 * L * (D - r)
    # eq. 30: block N=8 P-LR r=32 does not reduce total residual FLOPs below AttnRes block N=8
    assert K.added_flops("p-lr", D, L, M, 8, 32) > K.added_flops("attnres", D, L, M, 8)
    assert K.added_flops("p-lr", D, L, M, None, 32) > K.added_flops("attnres", D, L, M, None)


def test_tiny_tier_row_and_figure():
    df = K.cost_table(128, 6, 384, rows=[("attnres", 4, None), ("s-lr", 6, 32), ("p-lr", None, 16)])
    assert list(df["S_src"]) == [K.s_src(6, 4), K.s_src(6, 6), K.s_src(6)]
    assert df.loc[0, "added_flops"] == 2 * 128 * K.s_src(6, 4)
    assert df.loc[2, "key_proj_flops"] == 16 * (6 * (128 + 384) + 128)
    from probe.present.costs import cost_figure

    fig = cost_figure(df)
    assert len(fig.data) == 2
    stacked = [a + b for a, b in zip(fig.data[0].y, fig.data[1].y)]
    assert stacked == pytest.approx(list(df["added_flops_pct"]))
