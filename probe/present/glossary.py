"""The terms a verb's terminal text prints, each with a one-line gloss and the anchor of its definition in
docs/definitions.md: one place for the words, which every verb's ``text`` ends with (``glossed``: a ``terms:`` block
of the terms its tables and verdict show, before the verdict), and the words for a value outside a statistic's usual
range (``remark``), which a verdict adds beside the number. tests/present/test_glossary.py checks every anchor."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

from probe.analyses.sinks import SINK_FACTOR, SINK_R0
from probe.present.terminal import WIDTH

DEFINITIONS = "docs/definitions.md"


@dataclass(frozen=True)
class Term:
    """A printed term: ``name`` as the text shows it (a column or a phrase), ``gloss`` (one line), ``anchor`` (its
    section of docs/definitions.md) and ``also`` (other spellings that show the same term, regexes)."""

    name: str
    gloss: str
    anchor: str
    also: tuple[str, ...] = ()

    def pattern(self) -> re.Pattern:
        # whole words only: "r0" is not found in "r0_later", nor "dose" in "doses"
        spellings = "|".join([re.escape(self.name), *self.also])
        return re.compile(rf"(?<![\w^-])(?:{spellings})(?![\w-])")


TERMS = (
    # sink statistics (probe sinks, the clean pass of probe inject, probe report)
    Term("pos0_share", "key 0's share of each row's attention mass on the real keys (rows t >= 1)", "sink-statistics"),
    Term(
        "uniform_ref",
        "the pos0_share of a row attending uniformly to every key it sees: mean of 1/(t+1)",
        "causal-uniform-reference",
    ),
    Term(
        "pos0_over_uniform",
        "pos0_share / uniform_ref past layer 0: 1 uniform, >= 3 a sink's share, < 1 key 0 is avoided",
        "sink-rule",
        (r"causal-uniform share",),
    ),
    Term(
        "r0",
        "key 0's value read against the window's median read, ||v_0|| / median_j ||v_j|| (1 typical, < 0.8 drained)",
        "sink-statistics",
    ),
    Term("r0_later", "r0 averaged over the layers past the first, the r0 the sink rule reads", "sink-rule"),
    Term("sink_formed", "a sink: pos0_over_uniform >= 3 and r0_later < 0.8", "sink-rule", (r"sink has formed",)),
    Term(
        "phantom_share",
        "share of all attention mass on the phantom key (a learned key with no value; 0 without one; under a row "
        "rule the mass a row leaves unspent)",
        "phantom-key",
        (r"phantom",),
    ),
    Term(
        "row_mass",
        "a row's own attention mass sum_j a_tj under a rule other than softmax (shares are taken of it)",
        "rows-of-other-rules",
    ),
    Term(
        "pos0_share_1",
        "differential attention: key 0's share of branch 1's softmax row p1 (pos0_share is the net row's, of sum |a|)",
        "signed-rows",
    ),
    Term(
        "pos0_share_2",
        "differential attention: key 0's share of branch 2's softmax row p2 (the row subtracted, times lambda)",
        "signed-rows",
    ),
    Term(
        "pos0_share_key0",
        "a sliding or chunked layer's pos0_share over the rows whose window or chunk still holds key 0",
        "layer-types",
    ),
    Term(
        "layer_type",
        "full, sliding-window or chunked attention (linear: a hybrid's layer without a pattern)",
        "layer-types",
    ),
    Term(
        "Sink^eps",
        "share of heads whose mean attention on key 0 exceeds eps (n_sink_heads of n_heads)",
        "sink-heads",
        (r"Sink\^[0-9.]+", r"sink_share", r"n_sink_heads"),
    ),
    Term("key0_mass", "mean attention on key 0 of rows t >= 1, the phantom in the normaliser", "sink-heads"),
    Term(
        "sink_share_1",
        "differential attention: Sink^eps of branch 1's softmax rows p1 (share of heads whose key0_mass_1 exceeds eps)",
        "signed-rows",
        (r"sink_share_2",),
    ),
    Term(
        "key0_mass_1",
        "differential attention: mean attention on key 0 of branch 1's softmax rows p1 (key0_mass_2: of p2)",
        "signed-rows",
        (r"key0_mass_2",),
    ),
    Term(
        "massive activations",
        "|h| > 100 and > 1000x the median |h| of its site and window; ratio = top1 / median",
        "massive-activations",
        (r"n_massive", r"top1_dim"),
    ),
    Term("dormant", "a head whose key-0 mass on an input exceeds 0.5 (else active)", "dormant-heads"),
    Term(
        "entropy_norm",
        "a row's attention entropy over log of its outcomes (keys, + the phantom): 1 uniform, 0 one-hot",
        "attention-entropy",
        (r"entropy_real_norm",),
    ),
    Term(
        "kurtosis",
        "mean(s^4) / mean(s^2)^2 of the neurons' RMS s: 1 when all are equal, large with outlier neurons",
        "outlier-kurtosis",
        (r"max_over_rms",),
    ),
    Term(
        "norm_share",
        "key 0's share of each row's norm-weighted attention ||a_ij v_j W_O||, rows t >= 1 (Kobayashi et al.)",
        "norm-weighted-attention",
    ),
    Term(
        "key0_norm", "the norm ||a_t0 v_0 W_O|| of what key 0 writes to a row, rows t >= 1", "norm-weighted-attention"
    ),
    Term(
        "row_norm", "the summed norms ||a_tj v_j W_O|| of every key a row reads, rows t >= 1", "norm-weighted-attention"
    ),
    # injection and exposure (probe inject, probe report)
    Term(
        "quiet reads",
        "per KV head and window the floor(qT) value reads of smallest norm (q25: q = 0.25; median: q = 0.5)",
        "injection",
        (r"cutoff", r"q25"),
    ),
    Term(
        "dose",
        "eps, the junk added to each quiet read in units of the head's median read norm (defined: 0 to 1.6)",
        "injection",
    ),
    Term("junk", "the direction added: structured = another read of the batch, normalised", "injection"),
    Term("delta", "mean next-token loss with the junk (or intervention) minus without, nats per token", "injection"),
    Term(
        "quiet_share",
        "the exposure: share of each row's whole attention mass (phantom included) on its quiet reads",
        "exposure",
        (r"exposure",),
    ),
    Term(
        "quiet_share_1",
        "differential attention: share of branch 1's softmax row p1 on the quiet reads (quiet_share_2: of p2)",
        "signed-rows",
        (r"quiet_share_2",),
    ),
    Term("*_se", "standard error over batches of the per-batch values", "batch-standard-errors", (r"\w+_se",)),
    # ablations (probe ablate)
    Term("setting", "the intervention's fields as one label", "ablations", (r"intervention",)),
    Term("cost_ratio", "an ablated forward's time over a clean one's, the median of timed pairs", "ablations"),
    # gates (probe gates)
    Term("mean_gate", "the gate of the reads a row attends to, weighted by its attention", "gate-statistics"),
    Term("selectivity", "how much the gates of one row's reads differ (attention-weighted s.d.)", "gate-statistics"),
    Term("spread", "s.d. of a head's mean gate over its rows", "gate-statistics"),
    Term(
        "read_mean_gate",
        "the mean gate over every read, unweighted; frac_below_half: share of reads gated below 0.5",
        "routing-slot-metrics",
        (r"frac_below_half",),
    ),
    Term("token_share", "share of the gates' variance that the read's token explains", "token-identity-share"),
    # sources (probe sources) and the cost model (probe costs)
    Term("S_src", "sum of the sources read over the read sites with at least two", "cost-model"),
    Term(
        "neff_mean",
        "exp(entropy) of a site's depth weights (streams: of its sources' shares |c| / sum |c|), mean over tokens: its "
        "sources in use",
        "effective-sources",
    ),
    Term("top1_mass", "mean largest depth weight of a site", "effective-sources"),
    Term(
        "input_dependence",
        "H(mean weights) - mean H(weights): 0 when every token routes alike",
        "effective-sources",
    ),
    Term(
        "latest_weight",
        "a dense mix's mean weight on the latest block state (the plain residual: 1, others 0)",
        "dense-weights",
        (r"embed_weight", r"earlier_weight", r"residual_distance"),
    ),
    Term(
        "read_mass", "sum of a stream read's source coefficients (the plain residual: 1 per source)", "stream-sources"
    ),
    Term(
        "usage_entropy",
        "entropy of H_pre's shares over the n streams / log n: 1 all read alike, 0 one",
        "stream-sources",
    ),
    Term(
        "identity_distance",
        "||H_res - I||_F, mean over tokens (0: every stream keeps itself)",
        "stream-sources",
        (r"identity_distance_max",),
    ),
    Term(
        "permutation_distance",
        "||H_res - P||_F to the nearest permutation P, mean over tokens (0: the streams are only reordered)",
        "stream-sources",
        (r"permutation_distance_max",),
    ),
    Term(
        "bos_ratio",
        "a stream's largest |x| at position 0 over its largest elsewhere, at the block input and stream where largest",
        "stream-sources",
        (r"bos_layer", r"bos_stream"),
    ),
    Term(
        "added_flops_pct",
        "multiply-adds per token the routing adds, % of the base C = L(4d^2 + 3dm)",
        "cost-model",
        (r"added_params_pct", r"table1_pct"),
    ),
    # evaluation (probe eval)
    Term("perplexity", "exp(mean next-token loss in nats)", "perplexity-summary"),
    # sensitivity and collapse (probe sensitivity)
    Term(
        "first_share",
        "position 0's part of the last token's sensitivity, ||dy/de_0||_F over the sum over positions",
        "sensitivity",
        (r"last_share",),
    ),
    Term(
        "mixing",
        "the part of the last token's sensitivity on positions 1 .. T-2 (neither the first nor itself)",
        "sensitivity",
    ),
    Term(
        "decay_slope",
        "slope of log sensitivity over log distance to the last token (negative: nearer tokens count more)",
        "sensitivity",
    ),
    Term(
        "estimator_rse",
        "relative standard error of the sampled estimate of ||J_i||_F^2 (0: exact)",
        "sensitivity",
    ),
    Term(
        "below_bf16",
        "the pair's relative distance is under 2^-8, half of bfloat16's machine epsilon: within one rounding step",
        "collapse",
    ),
)


def glosses(shown: str) -> list[str]:
    """The ``terms:`` block for a verb's text ``shown``: after a blank line, one line per term it shows (in the order
    they first appear), its gloss and its definition's address; nothing when it shows none."""
    found = sorted((m.start(), i) for i, t in enumerate(TERMS) if (m := t.pattern().search(shown)))
    if not found:
        return []
    lines = ["", "terms:"]
    for _, i in found:
        t = TERMS[i]
        line = f"{t.name}: {t.gloss} ({DEFINITIONS}#{t.anchor})"
        wrapped = textwrap.wrap(line, WIDTH - 2, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
        lines += [f"  {w}" for w in wrapped]
    return lines


def glossed(body: list[str], end: str = "") -> str:
    """A verb's terminal text: its ``body`` lines, the glosses of the terms they and ``end`` (its verdict) show, then
    ``end``."""
    shown = "\n".join(body + [end])
    return "\n".join(body + glosses(shown) + ([end] if end else []))


# Words for a value outside a statistic's usual range, read by the verdicts: (term, test, what it means). A ratio to
# its reference counts as outside when it lies as far from 1, on the other side, as the sink rule's threshold does
REMARKS = (
    (
        "r0",
        lambda v: v > 1 / SINK_R0,
        "above 1: key 0's value read is larger than the median read, the opposite of a drained sink's",
    ),
    (
        "pos0_over_uniform",
        lambda v: v < 1 / SINK_FACTOR,
        "below 1: rows give key 0 less than a uniform row would, they avoid it",
    ),
)


def remark(term: str, value: float) -> str:
    """The words on ``value`` of ``term`` when it lies outside the statistic's usual range ("" inside it)."""
    return next((words for t, test, words in REMARKS if t == term and test(value)), "")
