"""probe's hook names side by side with TransformerLens's TransformerBridge and nnsight on one saved HF folder: which
names each side exposes, and how far apart the shared ones are.

``names_table(folder)`` gives the names probe (``probe.load``) and the bridge (``TransformerBridge.boot_transformers``)
each expose after one ``run_with_cache``; ``compare(folder)`` adds, for every name both expose, the largest
|difference| of the two values in fp32, and for the HF modules nnsight can reach, the same against nnsight's trace.
Both take a folder or a :class:`Run` (the three models run once, so a test's module fixture pays for them once).

Which bridge names count. The bridge's cache holds two spellings of most points: the TransformerLens names
(``blocks.0.attn.hook_q``, ``blocks.0.hook_resid_pre``) and its components' own module-boundary hooks
(``blocks.0.attn.q.hook_out``, ``blocks.0.hook_in``, ``embed.hook_out``): every bridge component has a ``hook_in`` and
a ``hook_out``, and the TransformerLens names are aliases of some of them. A name counts when it is a
TransformerLens name: an alias, or a point the bridge registers under its own name (``blocks.0.attn.hook_rot_q``,
``blocks.0.ln1.hook_scale``, ``rotary_emb.hook_cos``), in either case where TransformerLens puts hooks: on the model,
on a block, or one component below either (``ln_final.hook_scale``, ``blocks.0.attn.hook_q``). Not counted: a
``hook_in`` / ``hook_out`` (except where probe's vocabulary uses the very name, ``unembed.hook_in``: what the
unembedding reads); a registered point that an alias points at (``blocks.0.mlp.out.hook_in`` behind
``blocks.0.mlp.hook_post``: counted under the alias only); hooks deeper in the bridge's module tree
(``blocks.0.attn.q_norm.hook_scale``, the QK-norm module's own; ``blocks.0.mlp.shared_experts.hook_pre``); and
``blocks.0.attn.hook_hidden_states``, a joint-QKV attention's output fired a second time beside its hook_out.

Comparing values. Both sides are cast to fp32; scores at or below -1e30 (a mask written as the dtype's minimum, or as
-inf) are -inf on both sides and must be masked at the same places (else the difference is inf), and the finite
entries are compared. Shapes where one merges consecutive dimensions of the other (B,T,H*dh against B,T,H,dh; B,T,1
against B,T) are compared in the coarser shape; any other pair (a transposed layout, another size) is reported in
``Comparison.unreconciled``, never skipped (and where swapping the bridge's dimensions 1 and 2 gives probe's shape,
B,H,T,dh against B,T,H,dh, the difference after the swap is in ``Comparison.swapped``).

nnsight. The HF modules are found from the HF model alone (not from probe's adapters, so a wrong module choice in an
adapter shows): the input embedding's output is ``hook_embed``; each decoder layer's output ``hook_resid_post``; the
attention and MLP modules' outputs ``hook_attn_out`` / ``hook_mlp_out``: what the sub-layer adds to the stream, so
times the residual multiplier where the config has one (Granite), the output of the norm the layer puts on them where
it has one (OLMo 2, Gemma 3, GLM-4, AFMoE), and the output projection's output where the module adds the residual
itself (BLOOM's attention and MLP, MPT's MLP: a ``residual`` argument); ``q_proj``'s output ``hook_q`` (only where
the query has a projection of its own, not a fused QKV); the final norm's output ``ln_final.hook_normalized``; the LM
head's input ``unembed.hook_in``.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

NEG = -1e30  # scores at or below this are a mask
BOUNDARY = ("hook_in", "hook_out")  # the bridge components' own hooks (internal spellings)
# probe's vocabulary names that are a bridge component's boundary hook as well (counted on the bridge side too)
SHARED_BOUNDARY = ("unembed.hook_in",)
# points the bridge registers under a name of their own that repeat another of its hooks: a joint-QKV attention's
# output, fired again beside attn.hook_out (JointQKVAttentionBridge._process_output)
BRIDGE_DUPLICATES = (".attn.hook_hidden_states",)
# module names nnsight's side looks for (HF's own names across the families)
ATTN_NAMES = ("self_attn", "attn", "self_attention", "attention")
MLP_NAMES = ("mlp", "feed_forward", "block_sparse_moe", "ffn")
POST_MLP_NORMS = ("post_feedforward_layernorm", "post_mlp_layernorm")
POST_ATTN_NORMS = ("post_self_attn_layernorm", "post_attention_layernorm")  # only where a post-MLP norm exists
FINAL_NORMS = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "norm_f")
LAYER_LISTS = ("layers", "h", "blocks", "layer")


def inputs(B: int = 2, T: int = 9, seed: int = 5) -> torch.Tensor:
    return torch.randint(2, 90, (B, T), generator=torch.Generator().manual_seed(seed))


def fresh_hf(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float32).eval()


def boot_bridge(folder):
    """A TransformerBridge on its own copy of the weights (boot_transformers rewires the HF model it is given)."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    with _quiet():
        return TransformerBridge.boot_transformers(
            str(folder), hf_model=fresh_hf(folder), tokenizer=AutoTokenizer.from_pretrained(str(folder))
        )


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _tl_place(name: str) -> bool:
    """Where TransformerLens puts a hook: on the model (``hook_embed``), one component below it
    (``ln_final.hook_scale``), on a block (``blocks.0.hook_resid_pre``) or one component below a block
    (``blocks.0.attn.hook_rot_q``); deeper is the bridge's module tree (``blocks.0.attn.q_norm.hook_scale``)."""
    parts = name.split(".")
    if parts[0] == "blocks" and len(parts) > 1 and parts[1].isdigit():
        parts = parts[2:]
    return len(parts) <= 2


def canonical_bridge_names(bridge, fired) -> set[str]:
    """The TransformerLens names among the bridge hooks that fired (module docstring: which bridge names count)."""
    hooks = bridge.hook_dict
    aliased = {hp.name for key, hp in hooks.items() if hp.name != key}  # points that an alias names
    out = set()
    for key in fired:
        hp = hooks.get(key)
        if key in SHARED_BOUNDARY or (hp is not None and hp.name != key and _tl_place(key)):
            out.add(key)
        elif (
            key.rpartition(".")[2] not in BOUNDARY
            and key not in aliased
            and _tl_place(key)
            and not key.endswith(BRIDGE_DUPLICATES)
        ):
            out.add(key)
    return out


@dataclass
class Run:
    """One forward of the same ids through probe, the bridge and nnsight, kept for names_table and compare."""

    folder: Path
    ids: torch.Tensor
    probe_cache: dict
    bridge_cache: dict
    bridge_names: set
    nnsight: dict = field(default_factory=dict)  # probe name -> (nnsight value, HF module path)
    nnsight_missing: dict = field(default_factory=dict)  # probe name -> why nnsight has no module for it
    n_layers: int = 0


def run(folder, ids: torch.Tensor | None = None, nnsight: bool = True) -> Run:
    import probe

    folder = Path(folder)
    ids = inputs() if ids is None else ids
    with torch.no_grad(), _quiet():
        model = probe.load(str(folder))
        _, pcache = model.run_with_cache(ids)
        bridge = boot_bridge(folder)
        _, bcache = bridge.run_with_cache(ids)
    probe_cache = {k: v.detach() for k, v in pcache.items()}
    bridge_cache = {k: v.detach() for k, v in bcache.items()}
    r = Run(folder, ids, probe_cache, bridge_cache, canonical_bridge_names(bridge, bridge_cache))
    r.n_layers = len(model.blocks)
    if nnsight:
        r.nnsight, r.nnsight_missing = nnsight_values(folder, ids)
    return r


def _as_run(folder_or_run) -> Run:
    return folder_or_run if isinstance(folder_or_run, Run) else run(folder_or_run)


def names_table(folder_or_run) -> dict[str, set[str]]:
    """{"probe", "bridge", "shared", "only_probe", "only_bridge"} → sets of hook names (one run_with_cache each)."""
    r = _as_run(folder_or_run)
    p, b = set(r.probe_cache), set(r.bridge_names)
    return {"probe": p, "bridge": b, "shared": p & b, "only_probe": p - b, "only_bridge": b - p}


def _prefix_products(shape) -> set[int]:
    out, n = set(), 1
    for d in shape:
        n *= d
        out.add(n)
    return out


def reconcile(a: torch.Tensor, b: torch.Tensor):
    """(a, b) in one shape where one's dimensions merge consecutive dimensions of the other (B,T,H*dh against
    B,T,H,dh; B,T,1 against B,T): both in the coarser shape. None for any other pair (a transposed layout)."""
    if a.shape == b.shape:
        return a, b
    pa, pb = _prefix_products(a.shape), _prefix_products(b.shape)
    if a.numel() != b.numel() or not (pa <= pb or pb <= pa):
        return None
    coarse = a.shape if pa <= pb else b.shape
    return a.reshape(coarse), b.reshape(coarse)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| in fp32, masks (≤ -1e30 or -inf) equal on both sides, else inf."""
    a, b = a.float(), b.float()
    ma, mb = a <= NEG, b <= NEG
    if not torch.equal(ma, mb):
        return float("inf")
    keep = ~ma
    if not keep.any():
        return 0.0
    d = (a[keep] - b[keep]).abs()
    return float(d.max()) if not d.isnan().any() else float("nan")


@dataclass
class Comparison:
    table: dict  # names_table
    diffs: dict  # shared name -> max |difference| (fp32)
    unreconciled: dict  # shared name -> (probe shape, bridge shape)
    swapped: dict  # unreconciled name -> max |difference| with the bridge's dims 1 and 2 swapped (B,H,T,dh vs B,T,H,dh)
    nnsight: dict  # probe name -> (max |difference|, HF module path)
    nnsight_missing: dict  # name -> why nnsight has no module for it (or probe lacks the name)
    n_layers: int = 0

    def counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.table.items()}

    def worst(self) -> float:
        return max(self.diffs.values(), default=0.0)


def compare(folder_or_run) -> Comparison:
    r = _as_run(folder_or_run)
    table = names_table(r)
    diffs, unreconciled, swapped = {}, {}, {}
    for name in sorted(table["shared"]):
        a, b = r.probe_cache[name], r.bridge_cache[name]
        pair = reconcile(a, b)
        if pair is None:
            unreconciled[name] = (tuple(a.shape), tuple(b.shape))
            if b.dim() > 2 and b.transpose(1, 2).shape == a.shape:
                swapped[name] = max_diff(a, b.transpose(1, 2))
        else:
            diffs[name] = max_diff(*pair)
    nn = {}
    missing = dict(r.nnsight_missing)
    for name, (value, path) in r.nnsight.items():
        if name not in r.probe_cache:
            missing[name] = f"probe has no {name} (nnsight: {path})"
            continue
        pair = reconcile(r.probe_cache[name], value)
        if pair is None:
            missing[name] = f"shapes {tuple(r.probe_cache[name].shape)} / {tuple(value.shape)} ({path})"
        else:
            nn[name] = (max_diff(*pair), path)
    return Comparison(table, diffs, unreconciled, swapped, nn, missing, r.n_layers)


def template(name: str) -> str:
    """``blocks.3.attn.hook_q`` -> ``blocks.{l}.attn.hook_q`` (the per-layer name, once)."""
    return re.sub(r"^blocks\.\d+\.", "blocks.{l}.", name)


# ------------------------------------------------------------------------------------------------ nnsight


def _child(module, names):
    for n in names:
        if isinstance(getattr(module, n, None), torch.nn.Module):
            return n
    return None


def _own_write(module, path: str) -> str:
    """A sub-layer module that adds the residual itself (BLOOM's attention and MLP, MPT's MLP: a ``residual``
    argument) hands back the stream, not its write: its output projection (the last Linear in it) is the write."""
    if "residual" not in inspect.signature(module.forward).parameters:
        return path
    last = [n for n, c in module.named_children() if isinstance(c, torch.nn.Linear)][-1]
    return f"{path}.{last}"


def hf_paths(hf) -> dict[str, str]:
    """probe name -> HF module path (with ``:input`` for a module's input), found from the HF model alone."""
    named = {m: n for n, m in hf.named_modules()}
    n_layers = hf.config.get_text_config().num_hidden_layers
    from probe.checkpoints.adapters import adapter_for

    embedding = adapter_for(hf.config.model_type).embedding_module(hf)  # where the stream starts (BLOOM: its LN)
    paths = {"hook_embed": named[embedding], "unembed.hook_in": named[hf.get_output_embeddings()]}
    scale = getattr(hf.config, "embedding_multiplier", None)  # Granite: the model scales the embedding's output
    if scale not in (None, 1, 1.0):
        paths["hook_embed"] += f"*{scale}"
    paths["unembed.hook_in"] += ":input"
    layers_path = next(
        n
        for n, m in hf.named_modules()
        if isinstance(m, torch.nn.ModuleList) and len(m) == n_layers and n.rpartition(".")[2] in LAYER_LISTS
    )
    # the final norm's output is the LM head's input (unembed.hook_in, above); ln_final.hook_normalized is before the
    # norm's gain and bias (docs/definitions.md#hook-namespace), which no HF module outputs
    multiplier = getattr(hf.config, "residual_multiplier", None)
    for l, layer in enumerate(hf.get_submodule(layers_path)):
        lp = f"{layers_path}.{l}"
        attn, mlp = _child(layer, ATTN_NAMES), _child(layer, MLP_NAMES)
        post_mlp = _child(layer, POST_MLP_NORMS)
        post_attn = _child(layer, POST_ATTN_NORMS) if post_mlp else None
        if attn:
            a = layer.get_submodule(attn)
            attn = _own_write(a, attn)
            q = next((n for n, _ in a.named_modules() if n.rpartition(".")[2] == "q_proj"), None)
            if q:
                paths[f"blocks.{l}.attn.hook_q"] = f"{lp}.{attn}.{q}"
            elif l == 0:
                paths["-blocks.{l}.attn.hook_q"] = "no q_proj module: the query comes out of a fused QKV projection"
            paths[f"blocks.{l}.hook_attn_out"] = f"{lp}.{post_attn or attn}"
        if mlp:
            mlp = _own_write(layer.get_submodule(mlp), mlp)
            paths[f"blocks.{l}.hook_mlp_out"] = f"{lp}.{post_mlp or mlp}"
        if multiplier not in (None, 1, 1.0):
            for k in ("attn", "mlp"):
                if f"blocks.{l}.hook_{k}_out" in paths:
                    paths[f"blocks.{l}.hook_{k}_out"] += f"*{multiplier}"
        paths[f"blocks.{l}.hook_resid_post"] = lp
    return paths


def _envoy(lm, path):
    for part in path.split("."):
        lm = lm[int(part)] if part.isdigit() else getattr(lm, part)
    return lm


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def _cloned(value):
    """A module's output copied when it is read: Falcon adds the attention output into its MLP's output in place
    (``mlp_output += attention_output``), which a saved reference would see."""
    return value.clone() if isinstance(value, torch.Tensor) else value


def nnsight_values(folder, ids) -> tuple[dict, dict]:
    """Trace an nnsight LanguageModel over a fresh HF model of ``folder``; probe name -> (value, HF module path)."""
    from nnsight import LanguageModel
    from transformers import AutoTokenizer

    hf = fresh_hf(folder)
    paths = hf_paths(hf)
    with _quiet():
        lm = LanguageModel(hf, tokenizer=AutoTokenizer.from_pretrained(str(folder)))
    missing = {k: v for k, v in paths.items() if k.startswith("-")}
    paths = {k: v for k, v in paths.items() if not k.startswith("-")}
    names = [n for n, _ in hf.named_modules()]

    def parse(spec):  # "path[:input][*scale]"
        path, _, scale = spec.partition("*")
        path, _, kind = path.partition(":")
        return path, kind == "input", float(scale) if scale else 1.0

    def when(spec):  # modules run (mostly) in registration order; a module's output comes after its last child's
        path, is_input, _ = parse(spec)
        inside = [i for i, n in enumerate(names) if n == path or n.startswith(path + ".")]
        return (min(inside), 0) if is_input else (max(inside), 1)

    specs = {name: parse(spec) for name, spec in sorted(paths.items(), key=lambda kv: when(kv[1]))}
    envoys = {name: _envoy(lm, path) for name, (path, _, _) in specs.items()}
    saved = {}
    with torch.no_grad(), _quiet():
        try:  # one trace, the modules read in the order they run
            with lm.trace(ids):
                for name, envoy in envoys.items():
                    saved[name] = _cloned(envoy.input if specs[name][1] else envoy.output).save()
        except Exception:  # an order nnsight rejects (a parallel block): one trace per module
            saved = {}
            for name, envoy in envoys.items():
                with lm.trace(ids):
                    saved[name] = _cloned(envoy.input if specs[name][1] else envoy.output).save()
    saved = {name: _first(v) * specs[name][2] for name, v in saved.items()}
    out = {name: (saved[name].detach(), paths[name]) for name in saved}
    return out, {k[1:]: v for k, v in missing.items()}


# ------------------------------------------------------------------------------------------------ the page's words

# one model_type per adapter family that TransformerLens's bridge maps: tests/checkpoints/test_interop_families.py's
# list and the four families of test_interop.py / test_gemma.py the bridge maps too, then the other adapter families
# the bridge maps (gpt-oss's learned sinks, MoE, hybrid linear-attention and convolution layers, Gemma 4)
FAMILIES = (
    "gpt2", "gpt_neo", "gptj", "opt", "phi", "phi3", "olmo2", "cohere2", "granite", "stablelm", "glm4",
    "bloom", "mpt", "falcon", "apertus", "mixtral", "afmoe", "llama", "gemma3_text", "qwen3", "gpt_neox",
)  # fmt: skip
MORE_FAMILIES = (
    "gpt_oss", "granitemoe", "jetmoe", "lfm2", "vaultgemma", "gemma4_text", "llama4_text", "olmo_hybrid", "qwen3_next",
)  # fmt: skip
ALL_FAMILIES = FAMILIES + MORE_FAMILIES

# why a name is on one side only: per-layer template -> (the side that has it, the page's one line)
WHY = {
    "blocks.{l}.attn.hook_phantom": ("probe", "the mass on the phantom (learned sink) key; TransformerLens has none"),
    "blocks.{l}.attn.hook_lse": ("probe", "each row's log-normaliser over the real keys; no TransformerLens name"),
    "blocks.{l}.attn.hook_pattern_norm": (
        "probe",
        "‖a_ij v_j W_O[h]‖, the norm-weighted pattern; no TransformerLens name",
    ),
    "blocks.{l}.attn.hook_v_out": ("probe", "the value actually aggregated (after a gate or value residual)"),
    "blocks.{l}.attn.hook_sink_logit": ("probe", "the per-head sink logit; TransformerLens has no phantom"),
    "blocks.{l}.hook_resid_mid": (
        "probe",
        "a parallel block: probe defines resid_mid = resid_pre + attn_out, the bridge has no mid point there",
    ),
    "blocks.{l}.attn.hook_rot_q": (
        "probe",
        "on every softmax layer (= hook_q without rotary); the bridge's only where it applies rotary",
    ),
    "blocks.{l}.attn.hook_rot_k": ("probe", "as hook_rot_q"),
    "blocks.{l}.attn.hook_cos": ("bridge", "the rotary table at the attention (probe: model.rotary_tables(l, T))"),
    "blocks.{l}.attn.hook_sin": ("bridge", "as hook_cos"),
    "rotary_emb.hook_cos": ("bridge", "the rotary embedding module's table (probe: model.rotary_tables(l, T))"),
    "rotary_emb.hook_sin": ("bridge", "as rotary_emb.hook_cos"),
    "hook_unembed": ("bridge", "the logits, which probe returns rather than hooks"),
    "embed_ln.hook_scale": ("bridge", "BLOOM's LayerNorm on the embedding (probe's stream starts after it)"),
    "embed_ln.hook_normalized": ("bridge", "as embed_ln.hook_scale; the bridge's hook_embed is this too"),
    "blocks.{l}.mlp.hook_expert_indices": ("bridge", "(B*T, k); probe's vocabulary names it hook_expert_ids (B,T,k)"),
    "blocks.{l}.mlp.hook_expert_ids": ("probe", "the bridge's name for it is hook_expert_indices"),
    "blocks.{l}.mlp.hook_router_scores": (
        "bridge",
        "the scores gpt-oss's router returns (probe: mlp.hook_router_logits)",
    ),
    "blocks.{l}.attn.hook_q_gate": (
        "bridge",
        "Qwen3-Next's output-gate logits (probe: hook_out_gate, after the sigmoid)",
    ),
    "blocks.{l}.attn.hook_out_gate": ("probe", "the output gate σ(x W_g); the bridge has its logits, attn.hook_q_gate"),
    "blocks.{l}.attn.hook_kv": ("bridge", "JetMoe's joint key-value projection (mixture of attention heads)"),
    "blocks.{l}.attn.hook_q": ("probe", "the bridge's JetMoe attention (mixture of attention heads) fires none"),
    "blocks.{l}.attn.hook_k": ("probe", "as hook_q"),
    "blocks.{l}.attn.hook_v": ("probe", "as hook_q"),
    "blocks.{l}.attn.hook_z": ("probe", "as hook_q"),
}
# why, for every name under a prefix
WHY_PREFIX = {
    "blocks.{l}.linear_attn.": (
        "bridge",
        "the linear-attention (Gated DeltaNet) internals; probe has no attention hooks on a linear-attention layer",
    ),
    "blocks.{l}.conv.": ("bridge", "the short-convolution layer's internals; probe has no attention hooks there"),
}
VOCABULARY_NOTE = "in probe's vocabulary (probe/hooks/names.py); this adapter does not fire it yet"


def vocabulary() -> set[str]:
    """probe's declared hook templates (``blocks.{l}.attn.hook_q``, ``ln_final.hook_scale``, ...)."""
    from probe.hooks import names

    out = set()
    for value in vars(names).values():
        if not (isinstance(value, str) and "hook_" in value):
            continue
        for norm in names.NORMS:
            for site in names.READ_KINDS:
                out.add(value.replace("{norm}", norm).replace("{site}", site))
    return out


def why(template_name: str, side: str) -> str:
    """One line on why ``template_name`` is on ``side`` ("probe" or "bridge") only."""
    found = WHY.get(template_name) or next((w for k, w in WHY_PREFIX.items() if template_name.startswith(k)), None)
    if found and found[0] == side:
        return found[1]
    return VOCABULARY_NOTE if side == "bridge" and template_name in vocabulary() else ""
