"""Per-row attention masses on chosen key sets, without T x T memory (sink statistics, quiet mass, exposure).

    masses[b,h,i,c] = Σ_j a_ij indicators[b,j,h//G,c]      a includes the phantom in its normaliser
    lse[b,h,i]      = log(exp(sink_h) + Σ_j exp(s_ij))      so phantom_i = exp(sink_h - lse_i)

One file per path, as dispatch.py chooses them (``probe.kernels.attention_row_masses``):

    reference.py  the T x T fp32 reference (sink attention's, with the indicators as the values)
    sparse.py     from the forward's real-key lse (``hook_lse``), when the columns mark few keys or every key
    flash.py      torch's fused CPU flash op (causal, no window, no soft-cap)
    chunked.py    explicit scores over blocks of queries: windows, Gemma 2's soft-cap, any device
    triton.py     the sink-attention Triton forward with the indicators as fp32 values (imported lazily)
    rules.py      ``rule_row_masses``: the masses and each row's total under a row rule other than softmax (softpick,
                  sigmoid, ...: probe.kernels.row_rules), from explicit scores over blocks of query rows
    signed.py     ``signed_row_masses``: differential attention's signed rows (net, absolute and per-branch masses)

The soft-cap (s -> softcap * tanh(s / softcap)) bends scale * q.k only, before key_bias and the sink, as in
probe.kernels.sink_attention.reference; the fused flash op computes the scores itself, so it cannot apply it.
"""
