"""The analysis verbs of ``probe``: sinks, inject, sources, gates, eval (model + windows -> tables, figures)."""
from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
import torch

from probe.present import figures as F
from probe.present import summaries
from probe.analyses.capture import as_windows, describe, finish, loss_forward_kwargs, output_losses
from probe.analyses.dormant import dormant_heads
from probe.present.dormant import dormant_figure, dormant_heads_figure
from probe.analyses.gates import gate_stats
from probe.analyses.inject import conditions, inject
from probe.analyses.massive import massive_activations
from probe.present.massive import massive_figure
from probe.analyses.parallel import batches_of_rank, gather_rows
from probe.analyses.sink_heads import sink_heads
from probe.present.sink_eps import sink_eps_figure
from probe.analyses.sinks import SINK_FACTOR, SINK_R0, sink_stats
from probe.analyses.sources import effective_sources
from probe.cli.distributed import all_ranks_agree
from probe.cli.parser import DEFAULT_DEPTH_MODEL, DEFAULT_MODEL
from probe.cli.specs import eps_values, injection_spec, model_spec, output_spec, window_spec
from probe.present.console import Console
from probe.progress import plural
from probe.present.errors import UsageError
from probe.data.synthetic import is_synthetic
from probe.jobs.inputs import check_data, injection_plan, load_model, text_on_bb, trained_task, windows_for
from probe.present.files import emit, header, result_meta, save_result, show
from probe.jobs.specs import WindowSpec
from probe.present.files import OutputSpec


@dataclass
class Prepared:
    """What every analysis verb starts from: the loaded model, its windows and tokenizer, and where results go."""

    console: Console
    model: object
    windows: object  # probe.data.EvalBatches on the model's device
    tokenizer: object
    window_spec: WindowSpec
    output: OutputSpec

    @property
    def progress(self) -> bool:
        return not self.console.quiet


def _prepare(args: argparse.Namespace, default: str, verb: str) -> Prepared:
    """The flags as specs, then the model and its windows, with a loading bar; fails fast on a missing data file."""
    model, windows, output = model_spec(args, default), window_spec(args), output_spec(args)
    console = Console(output.quiet)
    check_data(windows.data)
    bar = console.bar(2, f"{verb}: loading {model.name or 'the default model'}", unit="step", leave=False)
    try:
        loaded = load_model(model, console)
        bar.update()
        bar.set_description(f"{verb}: windows of {windows.data or 'the default data'}")
        eb, tok = windows_for(windows, loaded)
        bar.update()
    finally:
        bar.close()
    return Prepared(console, loaded, eb, tok, windows, output)


def plan_line(verb: str, model, eb, passes: int = 1, what: str = "") -> str:
    """The one line a verb notes before its forward passes: model, windows and how many passes."""
    n = eb.tokens.shape[0] * eb.tokens.shape[1]
    extra = f" x {passes} forward passes ({what})" if passes > 1 else ""
    return (f"plan: {verb} on {model.probe_info.name} — {plural(eb.tokens.shape[0], 'batch')} x "
            f"{plural(eb.tokens.shape[1], 'window')} x {eb.ctx} tokens ({plural(n, 'window')}, {eb.corpus}, "
            f"{eb.mode}){extra}")


def _summary_lines(row: dict, keys) -> str:
    """``  key  value`` lines; a ``<key>_se`` in the row is shown as ``value ± se`` (when there is one: it needs two
    batches), a NaN value (e.g. no token reaches --min-count) as n/a."""
    out = []
    for k in keys:
        if k in row:
            v, se = row[k], row.get(f"{k}_se")
            if isinstance(v, float):
                text = "n/a" if math.isnan(v) else f"{v:.4g}"
                if se is not None and not math.isnan(v) and math.isfinite(se):
                    text += f" ± {se:.2g}"
            else:
                text = str(v)
            out.append(f"  {k:<22} {text}")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------------------ sinks


def _dormant_domains(args: argparse.Namespace, run) -> dict:
    """--dormant's input domains as windows of the run's settings, built before any work (a bad domain is one line
    naming --dormant-corpora, not --data)."""
    domains, task = {}, trained_task(run.model)
    for corpus in dict.fromkeys(args.dormant_corpora):
        if task is not None and not is_synthetic(corpus):
            raise text_on_bb(f"--dormant-corpora {corpus!r}", run.model, task, "give Bigram-Backcopy domains, e.g. "
                             "--dormant-corpora synthetic:bb synthetic:bb[seed=1]")
        try:
            domains[corpus] = windows_for(dataclasses.replace(run.window_spec, data=corpus), run.model)[0]
        except UsageError as e:
            why = e.one_line().removeprefix(f"--data {corpus!r}: ")
            raise UsageError(f"--dormant-corpora {corpus!r}: {why}") from None
    return domains


def run_sinks(args: argparse.Namespace) -> int:
    with all_ranks_agree():  # under torchrun: a setup failure on any rank ends every rank
        run = _prepare(args, DEFAULT_MODEL, "sinks")
        domains = _dormant_domains(args, run) if args.dormant else None
    model, eb = run.model, run.windows
    run.console.note(plan_line("sinks", model, eb))
    result = sink_stats(model, eb, progress=run.progress)
    heads = sink_heads(model, eb, eps=list(eps_values(args)), progress=run.progress)
    for k in ("summary", "layers", "heads"):
        result[f"sink_eps_{k}"] = heads[k]
    figures = [F.sink_figure(result), F.sink_heads_figure(result, "pos0_share"), F.sink_heads_figure(result, "r0"),
               sink_eps_figure(heads)]
    s = result["summary"].iloc[0].to_dict()
    text = [header(result_meta(result)), "",
            f"summary (rows t >= 1; a sink has formed when pos0 share >= {SINK_FACTOR:g} x uniform and r0 < "
            f"{SINK_R0:g} over layers past the first):",
            _summary_lines(s, ("pos0_share", "uniform_ref", "pos0_over_uniform", "phantom_share", "r0", "r0_later",
                               "sink_formed"))]
    if len(result["by_type"]) > 1:
        text += ["", "by layer type:", show(result["by_type"])]
    text += ["", "per layer:", show(result["layers"], ["layer", "layer_type", "pos0_share", "uniform_ref",
                                                       "phantom_share", "r0", "pos0_share_key0"])]
    text += ["", f"sink heads (Gu et al.): share of heads whose mean attention on key 0 "
                 f"({heads['summary']['key0'].iloc[0]}) exceeds eps:",
             show(heads["summary"], ["epsilon", "n_sink_heads", "n_heads", "sink_share", "sink_share_se", "key0_mass",
                                     "key0_mass_se", "phantom_share", "uniform_ref"])]
    if args.massive:
        mas = massive_activations(model, eb, tokenizer=run.tokenizer, progress=run.progress)
        for k in ("summary", "layers", "top", "dims"):
            result[f"massive_{k}"] = mas[k]
        text += ["", "massive activations (Sun et al.; |h| > 100 and > 1000 x median):",
                 show(mas["layers"], ["layer", "top1", "median", "ratio", "top1_dim", "n_massive", "key0_mass", "r0"])]
        figures.append(massive_figure(mas))
    if args.dormant:
        dor = dormant_heads(model, domains, progress=run.progress)
        for k in ("summary", "domains", "heads", "switching"):
            result[f"dormant_{k}"] = dor[k]
        text += ["", "active / dormant heads (Guo et al.; dormant = key-0 mass > 0.5 on that input):",
                 show(dor["summary"])]
        figures += [dormant_figure(dor), dormant_heads_figure(dor)]
    save_result(run.output, "sinks", result, figures, run.console, "Attention sinks",
                summaries.sink_sections(result))
    emit(run.output, "sinks", result, "\n".join(text))
    return 0


# ------------------------------------------------------------------------------------------------------------ inject


def run_inject(args: argparse.Namespace) -> int:
    with all_ranks_agree():
        run = _prepare(args, DEFAULT_MODEL, "inject")
        model, eb, spec = run.model, run.windows, injection_spec(args)
        kinds, cutoffs, skipped = injection_plan(model, spec, run.window_spec.batch_size)
    for s in skipped:
        run.console.note(f"skipping junk {s}")
    doses = list(spec.doses)
    conds = conditions(kinds, cutoffs, doses)
    corrupted = [c for c in conds if c[2] != 0]
    run.console.note(plan_line("inject", model, eb, 1 + len(corrupted), f"1 clean + {len(corrupted)} corrupted: "
                               f"{len(kinds)} junk x {len(cutoffs)} cutoff x {len(doses)} dose"))
    result = inject(model, eb, junk=kinds, cutoffs=cutoffs, doses=doses, seed=run.window_spec.seed,
                    exposure=not args.no_exposure, progress=run.progress)
    text = [header(result_meta(result)), "", "loss increase (corrupted - clean, nats per token):",
            show(result["results"], ["junk", "cutoff", "dose", "loss_clean", "loss_corrupted", "delta"])]
    figures = [F.injection_figure(result)]
    if "exposure" in result:
        text += ["", "exposure (share of each row's attention mass, phantom included):",
                 show(result["exposure"], ["cutoff", "quiet_share", "quiet_share_se", "phantom_share",
                                           "phantom_share_se"])]
        figures.append(F.exposure_figure(result))
    save_result(run.output, "inject", result, figures, run.console, "Value-noise injection",
                summaries.inject_sections(result))
    emit(run.output, "inject", result, "\n".join(text))
    return 0


# ------------------------------------------------------------------------------------------------------------ sources


def run_sources(args: argparse.Namespace) -> int:
    with all_ranks_agree():
        run = _prepare(args, DEFAULT_DEPTH_MODEL, "sources")
        info = run.model.probe_info
        if info.depth_routing not in ("attnres", "plr", "slr"):
            raise UsageError(f"model {info.name!r} has no depth routing (depth_routing={info.depth_routing!r}); "
                             "`probe sources` needs an AttnRes / P-LR / S-LR model, e.g. `probe train --variant "
                             "attnres-block4`")
    run.console.note(plan_line("sources", run.model, run.windows))
    result = effective_sources(run.model, run.windows, progress=run.progress)
    s = result["summary"].iloc[0].to_dict()
    text = [header(result_meta(result)), "", "summary:",
            _summary_lines(s, ("mode", "n_sites", "S_src", "neff_mean", "top1_mass", "input_dependence")), "",
            "per read site:", show(result["sites"], [c for c in result["sites"].columns
                                                     if c not in ("site_index", "n_tokens")])]
    save_result(run.output, "sources", result, [F.depth_heatmap(result), F.effective_sources_figure(result)],
                run.console, "Depth routing", summaries.source_sections(result))
    emit(run.output, "sources", result, "\n".join(text))
    return 0


# ------------------------------------------------------------------------------------------------------------ gates


def run_gates(args: argparse.Namespace) -> int:
    with all_ranks_agree():
        run = _prepare(args, DEFAULT_MODEL, "gates")
        info = run.model.probe_info
        if info.value_gate == "none":
            raise UsageError(f"model {info.name!r} has no value gate; `probe gates` needs a gated model (normgate, "
                             "projgate, sink+norm, sink+proj, routing-normgate, gatedv, g2, glu-...)")
    run.console.note(plan_line("gates", run.model, run.windows))
    result = gate_stats(run.model, run.windows, min_count=args.min_count, tokenizer=run.tokenizer,
                        progress=run.progress)
    s = result["summary"].iloc[0].to_dict()
    tokens = result["tokens"].assign(token=lambda t: t["token"].map(repr))  # show spaces and newlines
    text = [header(result_meta(result)), "", "summary:",
            _summary_lines(s, ("value_gate", "mean_gate", "selectivity", "spread", "read_mean_gate",
                               "frac_below_half", "token_share", "token_share_min_count")), "",
            "per layer:", show(result["layers"])]
    cols = ["token", "token_id", "count", "mean_gate"]
    if 0 < len(tokens) <= 20:
        text += ["", f"tokens with count >= {args.min_count}, most attenuated first:", show(tokens, cols)]
    elif len(tokens):
        text += ["", f"most attenuated tokens (count >= {args.min_count}):",
                 show(tokens.head(10), cols), "", "least attenuated tokens:", show(tokens.tail(10).iloc[::-1], cols)]
    else:
        text += ["", f"no token occurs {args.min_count} times in these windows (lower --min-count)"]
    figures = [F.gate_figure(result)] + ([F.gate_token_table(result)] if len(tokens) else [])
    save_result(run.output, "gates", result, figures, run.console, "Value gates", summaries.gate_sections(result))
    emit(run.output, "gates", result, "\n".join(text))
    return 0


# ------------------------------------------------------------------------------------------------------------ eval


def run_eval(args: argparse.Namespace) -> int:
    with all_ranks_agree():
        run = _prepare(args, DEFAULT_MODEL, "eval")
    model, eb = run.model, run.windows
    run.console.note(plan_line("eval", model, eb))
    rows, mine = [], batches_of_rank(len(eb))  # under torchrun: this rank's batches; all rows gathered below
    bar = run.console.bar(len(mine), "eval", unit="batch")
    with torch.no_grad():
        for n in mine:
            window = eb.tokens[n]
            out = model(window[:, :-1], **loss_forward_kwargs(model))
            losses = output_losses(model, out, window[:, 1:]).double()
            for b in range(window.shape[0]):
                rows.append({"batch": n, "row": b, "doc_id": int(eb.doc_ids[n, b]), "loss_sum": float(losses[b].sum()),
                             "n_tokens": losses.shape[1], "loss": float(losses[b].mean())})
            bar.update()
    bar.close()
    windows = pd.DataFrame(gather_rows(rows))
    loss = float(windows["loss_sum"].sum() / windows["n_tokens"].sum())
    summary = pd.DataFrame([{"loss": loss, "perplexity": math.exp(loss), "n_tokens": int(windows["n_tokens"].sum()),
                             "n_windows": len(windows)}])
    result = finish({"summary": summary, "windows": windows}, describe(model, as_windows(eb), "eval"))
    text = [header(result_meta(result)), "", _summary_lines(result["summary"].iloc[0].to_dict(),
                                                            ("loss", "perplexity", "n_tokens", "n_windows"))]
    fig = go.Figure(go.Bar(x=list(range(len(windows))), y=windows["loss"], text=windows["doc_id"]))
    fig.update_layout(title=f"Mean next-token loss per window — {model.probe_info.name}", xaxis_title="window",
                      yaxis_title="loss (nats)")
    save_result(run.output, "eval", result, [fig], run.console, "Evaluation", summaries.eval_sections(result))
    emit(run.output, "eval", result, "\n".join(text))
    return 0
