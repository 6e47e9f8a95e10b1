"""The configuration of a probe model: one dataclass-like HF config that selects every mechanism.

Mechanisms (docs/definitions.md#mechanisms) are orthogonal switches; `validate()` rejects combinations that make no
sense. `value_gate` names a registered gate module (gates.py), `out_gate` an output gate (out_gates.py), `depth` a
registered read (depth.py) and `dense` a registered mix (dense.py), each of which checks the settings it reads. Tiers
are named base architectures (docs/definitions.md#tiers and each paper's tables), listed in probe/catalogue.py;
`variants.py` names mechanism settings. The attention backend is not configuration: it is chosen at run time
(probe.kernels.backend).
"""

from __future__ import annotations

from transformers import PretrainedConfig

from probe.catalogue import TIERS
from probe.models.dense import DENSES
from probe.models.depth import DEPTHS
from probe.models.gates import GATES
from probe.models.out_gates import OUT_GATES

ABSTENTIONS = ("none", "offbyone", "sinklogit", "sinktoken")
# P-LR routing keys: "normalized" RMS-normalises each key as it is emitted (eps: the dtype's machine epsilon, as the
# LR-AttnRes authors' model.py), so a block's key is the sum of normalised keys, normalised again at the read; "raw"
# sums raw keys and normalises once at the read (how probe's checkpoints before this field were trained)
PLR_KEYS = ("normalized", "raw")
VALUE_RESIDUALS = ("none", "lambda", "two-weight")
QK_ACTIVATIONS = ("none", "q", "qk")
NORMS = ("rms", "layer")
POSITIONS = ("rope", "learned")
MLPS = ("swiglu", "gelu")
# RoPE's cos/sin table: "exact" fp32 cos/sin of fp32 angles; "bfloat16" / "float16" the fp32 table (torch.polar's,
# as MUDDFormer's / MUDDPythia's precompute_freqs_cis) rounded to that dtype, as those authors' code always uses it;
# "stored" n_ctx rows held as buffers (rotary.cos / rotary.sin), loaded with the weights (LR-AttnRes keeps its table in
# its checkpoint)
ROPE_TABLES = ("exact", "bfloat16", "float16", "stored")
INITS = ("fan-in", "gpt2")


def _check(field: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{field}={value!r} is not valid; choose one of {', '.join(map(str, choices))}")


class ProbeConfig(PretrainedConfig):
    model_type = "probe"

    def __init__(
        self,
        vocab_size: int = 8192,
        n_layers: int = 6,
        d_model: int = 128,
        n_heads: int = 4,
        n_kv_heads: int | None = None,
        d_head: int | None = None,
        d_value: int | None = None,  # per-head value width (GLU reduced width); default d_head
        d_mlp: int = 384,
        n_ctx: int = 256,
        norm: str = "rms",
        norm_eps: float = 1e-6,
        pos: str = "rope",
        rope_theta: float = 10000.0,
        rope_table: str = "exact",  # see ROPE_TABLES
        strict_ctx: bool = False,  # refuse sequences longer than n_ctx (an authors' model their code cannot run past)
        mlp: str = "swiglu",
        tie_embeddings: bool = True,
        qk_norm: bool = False,
        init: str = "fan-in",
        # inside a head
        abstention: str = "none",
        value_gate: str = "none",
        gate_beta: float = 8.0,
        gate_tau_init: float | None = None,  # None: expected read norm of the initial model (see gates.py)
        qk_activation: str = "none",  # GatedV placement controls: SiLU on q (or q and k) before RoPE
        out_gate: str = "none",  # an output gate on each head's attention output (out_gates.py: G1)
        value_residual: str = "none",
        # across depth: "residual" or a registered read (depth.py), "none" or a registered mix (dense.py)
        depth: str = "residual",
        depth_blocks: int = 0,  # 0: full depth routing; N: block routing with N blocks
        depth_rank: int | None = None,  # routing-key rank r for plr/slr (attnres uses d_model)
        plr_key: str = "normalized",  # see PLR_KEYS; a saved config without the field loads as "raw" (from_dict)
        # LR-AttnRes authors' block options (their attnres_block_average / attnres_block_count_prior, shared scope):
        depth_block_mean: float = 0.0,  # p: a block source's value is divided by count**p (1: the mean, 0.5: sqrt)
        depth_block_mean_learned: bool = False,  # p is one learned scalar (initialised to depth_block_mean)
        depth_block_prior: float = 0.0,  # β: β·log(count) is added to a block source's logit (1: their prior)
        depth_block_prior_learned: bool = False,  # β is one learned scalar (initialised to depth_block_prior)
        dense: str = "none",
        # options of MUDDFormer's released checkpoints (Caiyun-AI/MUDDFormer; docs/definitions.md#dense-connections)
        mudd_round64: bool = False,  # their round64: dense-network hidden width (h // 64 + 1) * 64
        mudd_expand_last: bool = False,  # their expand_last: the last layer's dense-network hidden width x4
        dense_stream_norms: bool = False,  # their sepln: blocks > 0 norm the q, k, v streams with separate norms
        d_mlp_layers: list | None = None,  # per-layer FFN widths (None: every layer d_mlp)
        # architecture options of MUDDPythia (GPT-NeoX style; docs/definitions.md#released-checkpoints)
        parallel_residual: bool = False,  # the MLP reads the block's input, not input + attention
        linear_bias: bool = False,  # biases on the q/k/v/o projections and the MLP's linear maps
        mlp_bias: bool | None = None,  # biases on the MLP's linear maps (None: as linear_bias; MUDDPythia's own flag)
        norm_bias: bool = False,  # LayerNorm with a bias (norm="layer")
        rotary_dims: int | None = None,  # RoPE on the first rotary_dims of each head only (None: all of d_head)
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.n_layers = n_layers
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads or n_heads
        self.d_head = d_head or d_model // n_heads
        self.d_value = d_value or self.d_head
        self.d_mlp = d_mlp
        self.n_ctx = n_ctx
        self.norm = norm
        self.norm_eps = norm_eps
        self.pos = pos
        self.rope_theta = rope_theta
        self.rope_table = rope_table
        self.strict_ctx = bool(strict_ctx)
        self.mlp = mlp
        self.tie_embeddings = tie_embeddings
        self.qk_norm = qk_norm
        self.init = init
        self.abstention = abstention
        self.value_gate = value_gate
        self.gate_beta = gate_beta
        self.gate_tau_init = gate_tau_init
        self.qk_activation = qk_activation
        self.out_gate = out_gate
        self.value_residual = value_residual
        self.depth = depth
        self.depth_blocks = depth_blocks
        self.depth_rank = depth_rank
        self.plr_key = plr_key
        self.depth_block_mean = float(depth_block_mean)
        self.depth_block_mean_learned = bool(depth_block_mean_learned)
        self.depth_block_prior = float(depth_block_prior)
        self.depth_block_prior_learned = bool(depth_block_prior_learned)
        self.dense = dense
        self.mudd_round64 = bool(mudd_round64)
        self.mudd_expand_last = bool(mudd_expand_last)
        self.dense_stream_norms = bool(dense_stream_norms)
        self.d_mlp_layers = None if d_mlp_layers is None else [int(m) for m in d_mlp_layers]
        self.parallel_residual = bool(parallel_residual)
        self.linear_bias = bool(linear_bias)
        self.mlp_bias = self.linear_bias if mlp_bias is None else bool(mlp_bias)
        self.norm_bias = bool(norm_bias)
        self.rotary_dims = None if rotary_dims is None else int(rotary_dims)
        # config.json files saved before the backend became a runtime choice carry it; it is a runtime choice now
        kwargs.pop("backend", None)
        kwargs.setdefault("tie_word_embeddings", False)  # tying is done by reusing the embedding matrix
        super().__init__(**kwargs)
        self.validate()

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        """A saved config.json without ``plr_key`` was trained with raw-sum P-LR keys: it loads as "raw"."""
        if "plr_key" not in config_dict and "plr_key" not in kwargs:
            config_dict = {**config_dict, "plr_key": "raw"}
        return super().from_dict(config_dict, **kwargs)

    @classmethod
    def from_json_file(cls, json_file):
        return cls.from_dict(cls._dict_from_json_file(json_file))

    # HF generic names, so generic tooling (nnsight, generation utils) finds them
    @property
    def hidden_size(self) -> int:
        return self.d_model

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layers

    @property
    def num_attention_heads(self) -> int:
        return self.n_heads

    @property
    def max_position_embeddings(self) -> int:
        return self.n_ctx

    def layer_d_mlp(self, layer: int) -> int:
        """The FFN width of block ``layer`` (d_mlp unless d_mlp_layers gives one per layer)."""
        return self.d_mlp_layers[layer] if self.d_mlp_layers else self.d_mlp

    @property
    def has_phantom(self) -> bool:
        return self.abstention in ("offbyone", "sinklogit")

    def validate(self) -> None:
        for field, choices in [
            ("abstention", ABSTENTIONS),
            ("value_gate", ("none", *GATES)),
            ("out_gate", ("none", *OUT_GATES)),
            ("depth", ("residual", *DEPTHS)),
            ("dense", ("none", *DENSES)),
            ("value_residual", VALUE_RESIDUALS),
            ("norm", NORMS),
            ("pos", POSITIONS),
            ("mlp", MLPS),
            ("init", INITS),
            ("qk_activation", QK_ACTIVATIONS),
            ("plr_key", PLR_KEYS),
            ("rope_table", ROPE_TABLES),
        ]:
            _check(field, getattr(self, field), choices)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
        if self.depth != "residual":
            DEPTHS[self.depth].check(self)
        if self.depth_blocks:
            if self.depth == "residual":
                raise ValueError(f"depth_blocks needs depth routing (depth one of {', '.join(map(repr, DEPTHS))})")
            if (2 * self.n_layers) % self.depth_blocks:
                raise ValueError(f"depth_blocks={self.depth_blocks} must divide 2L={2 * self.n_layers} sub-layers")
        for field in ("depth_block_mean", "depth_block_mean_learned", "depth_block_prior", "depth_block_prior_learned"):
            if getattr(self, field) and not self.depth_blocks:
                raise ValueError(
                    f"{field}={getattr(self, field)!r} needs block depth routing (depth_blocks > 0); got depth_blocks=0"
                )
        if self.depth != "residual" and self.dense != "none":
            raise ValueError(
                f"depth={self.depth!r} and dense={self.dense!r} both replace the residual stream; pick one"
            )
        for name, mix in DENSES.items():
            for field in mix.options:
                if getattr(self, field) and self.dense != name:
                    raise ValueError(f"{field}=True needs dense={name!r}; got dense={self.dense!r}")
        if self.d_mlp_layers is not None and (len(self.d_mlp_layers) != self.n_layers or min(self.d_mlp_layers) < 1):
            raise ValueError(
                f"d_mlp_layers={self.d_mlp_layers!r} must list one positive width per layer (n_layers={self.n_layers})"
            )
        if self.parallel_residual and self.depth != "residual":
            raise ValueError(
                f"parallel_residual=True needs the plain or dense residual stream; got depth={self.depth!r}"
            )
        if self.rope_table != "exact" and self.pos != "rope":
            raise ValueError(f"rope_table={self.rope_table!r} needs pos='rope'; got pos={self.pos!r}")
        if self.norm_bias and self.norm != "layer":
            raise ValueError(f"norm_bias=True needs norm='layer'; got norm={self.norm!r}")
        if self.rotary_dims is not None and not (0 < self.rotary_dims <= self.d_head and self.rotary_dims % 2 == 0):
            raise ValueError(f"rotary_dims={self.rotary_dims!r} must be even and in 2..d_head={self.d_head}")
        if self.value_gate == "glu" and self.value_residual != "none":
            raise ValueError("value_residual does not compose with the GLU value (different value widths)")


def tier_config(tier: str) -> dict:
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}; choose one of {', '.join(TIERS)}")
    return dict(TIERS[tier])
