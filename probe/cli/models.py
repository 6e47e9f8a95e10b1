"""``probe models``: what can be named (variants, tiers, the zoo, known checkpoints); shaped by probe.present.models.

It answers within a second: the names come from stdlib-only modules (probe.catalogue, probe.checkpoints.load), and
pandas is imported only for --out / --json, which write the tables as DataFrames."""

from __future__ import annotations

import argparse

from probe.cli.flags import output_flags

VERB = "models"  # this module is `probe models` (probe.cli.main finds verbs by this line)
RANK = 10  # its place in `probe --help`
HELP = "list variants, tiers, zoo checkpoints and known checkpoint names"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("models", help=HELP, description=HELP, allow_abbrev=False)
    p.add_argument(
        "--architectures",
        action="store_true",
        help="instead: every transformers model_type and whether probe supports it, partly (which hooks it lacks) "
        "or refuses it (why), from the generated coverage table",
    )
    output_flags(p, "write models.csv and models.json to DIR", reads_data=False)
    return p


def run_architectures(output) -> int:
    """``probe models --architectures``: the coverage table (probe.checkpoints.architectures, stdlib only)."""
    from probe.checkpoints import architectures
    from probe.console import Console
    from probe.present import models
    from probe.present.files import emit, save_result

    rows, data = architectures.rows(), architectures.table()
    result = None
    if output.out or output.as_json:
        import pandas as pd

        result = {"architectures": pd.DataFrame(rows, columns=["model_type", "kind", "status", "adapter", "note"])}
        save_result(output, "architectures", result, [], Console(output.quiet), "Architectures")
    emit(output, "models", result, models.architectures_text(rows, data))
    return 0


def run(args: argparse.Namespace) -> int:
    from probe.catalogue import TIER_DESCRIPTIONS, TIERS, VARIANTS
    from probe.checkpoints.load import list_models
    from probe.cli.flags import output_spec
    from probe.console import Console
    from probe.present import models
    from probe.present.files import emit, save_result

    output = output_spec(args)
    if args.architectures:
        return run_architectures(output)
    variants = [{"name": k, "description": v.description} for k, v in VARIANTS.items()]
    tiers = [
        {
            "name": k,
            "layers": t["n_layers"],
            "d_model": t["d_model"],
            "heads": t["n_heads"],
            "d_mlp": t["d_mlp"],
            "ctx": t["n_ctx"],
            "vocab": t["vocab_size"],
            "description": TIER_DESCRIPTIONS.get(k, ""),
        }
        for k, t in TIERS.items()
    ]
    checkpoints = list_models()
    from probe.checkpoints import lr_attnres, muddformer

    formats = [
        {"format": "muddformer, muddpythia", "reads": muddformer.READS},
        {"format": "lr-attnres", "reads": lr_attnres.READS},
    ]
    result = None  # the tables as DataFrames, for the files and the JSON document only (pandas: ~0.7 s to import)
    if output.out or output.as_json:
        import pandas as pd

        result = {
            "variants": pd.DataFrame(variants),
            "tiers": pd.DataFrame(tiers),
            "checkpoints": pd.DataFrame(checkpoints, columns=["name", "source", "kind", "available"]),
            "formats": pd.DataFrame(formats),
        }
        save_result(output, "models", result, [], Console(output.quiet), "Models")
    emit(output, "models", result, models.text(variants, tiers, checkpoints, formats))
    return 0
