#!/usr/bin/env bash
# Rewrite every fixture in tests/fixtures/authors/ from the authors' code at the pinned commits.
#   MIRRORS=/path/to/git/mirrors PYTHON=/tmp/authors-venv/bin/python scripts/authors/regenerate.sh
# MIRRORS holds one git repository (bare or not) per author, named owner+name (e.g. jon123boss+LR-AttnRes/repo as the
# `fetch` tool lays them out; set REPO_SUFFIX="" for plain clones). Their files are exported to a scratch folder, never
# into this repository.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python}
MIRRORS=${MIRRORS:?set MIRRORS to the folder holding the authors\' git repositories}
REPO_SUFFIX=${REPO_SUFFIX-/repo}
SRC=$(mktemp -d)
trap 'rm -rf "$SRC"' EXIT
export_files() {  # owner+name commit dest paths...
  local repo="$MIRRORS/$1$REPO_SUFFIX" commit=$2 dest=$SRC/$3
  shift 3
  mkdir -p "$dest"
  git -C "$repo" archive "$commit" "$@" | tar -x -C "$dest"
}
show_files() {  # owner+name commit dest paths... (one file at a time: for mirrors whose large blobs are absent)
  local repo="$MIRRORS/$1$REPO_SUFFIX" commit=$2 dest=$SRC/$3 path
  shift 3
  for path in "$@"; do
    mkdir -p "$dest/$(dirname "$path")"
    git -C "$repo" show "$commit:$path" > "$dest/$path"
  done
}
LR=14784c7b486f17e0d2fb849c4822cbd9d118d9a6
LR_FIRST=092e6dab9dfa486920b61aa05030942490e0dc85  # the first model.py with the fields of their released runs' code
LR_PRE_PRIOR=324995a4caee5b4c5ab66182acc3b91cbb0c20e3  # their LR-AttnRes-Full run's commit (wandb), before the prior
FLA=bc3b101dcb713ddc5bd8924b66754eb68b5ccf89
OSS=7b583341fe16729127f6d5b94a7b09ccae97e1a1
RES=95652f64aba7db6c095f4e92eafb9e76e6ed9e02
MUDD=fc067b274a5f14894b2ee299fdcb3c581a092896
DENSE=c99a623bdb5f6611bf0d37e964c67ecbf15c3c19
MASSIVE=6521c05efd2c22460e8486471c8ef511ebd8c067
DORMANT=16b3593c32a751d6b08df5dd6631a76d9fe7c0c9
QIU=49645df63aafe9e680bc44a9c0ca280d4aefa8e9
export_files jon123boss+LR-AttnRes $LR lr model.py attnres_ops.py optimizer.py schedulers.py muon
export_files jon123boss+LR-AttnRes $LR_PRE_PRIOR lr-pre-prior model.py optimizer.py schedulers.py muon
export_files fla-org+flash-linear-attention $FLA fla fla/ops/attnres/naive.py
export_files openai+gpt-oss $OSS oss gpt_oss/__init__.py gpt_oss/torch
export_files Zcchill+Value-Residual-Learning $RES res src/modeling/modeling_llama_resformer.py
export_files Caiyun-AI+MUDDFormer $MUDD mudd pytorch/muddformer pytorch/muddpythia
export_files epfml+DenseFormer $DENSE dense experiments/models
show_files locuslab+massive-activations $MASSIVE massive main_llm.py monkey_patch/modify_llama.py lib/plot_utils_llm.py
show_files GuoTianYu2000+Active-Dormant-Attention $DORMANT dormant LLM/src/entropy.py BBM/probe_utils.py
export_files qiuzh20+gated_attention $QIU qwen3_gated modeling_qwen3.py configuration_qwen3.py
"$PYTHON" lr_attnres.py --src "$SRC/lr" --commit $LR
"$PYTHON" fla_attnres.py --src "$SRC/fla/fla/ops/attnres/naive.py" --commit $FLA
"$PYTHON" gpt_oss_sink.py --src "$SRC/oss" --commit $OSS
"$PYTHON" value_residual.py --src "$SRC/res/src/modeling/modeling_llama_resformer.py" --commit $RES
"$PYTHON" mudd.py --src "$SRC/mudd/pytorch/muddformer" --commit $MUDD
"$PYTHON" denseformer.py --src "$SRC/dense/experiments" --commit $DENSE
"$PYTHON" mudd_checkpoints.py --src "$SRC/mudd/pytorch" --commit $MUDD
"$PYTHON" lr_attnres_checkpoints.py --src "$SRC/lr" --commit $LR
"$PYTHON" lr_attnres_checkpoints.py --src "$SRC/lr-pre-prior" --commit $LR_PRE_PRIOR --kinds block --save-dtype bfloat16 --tag
"$PYTHON" lr_attnres_versions.py --repo "$MIRRORS/jon123boss+LR-AttnRes$REPO_SUFFIX" --first $LR_FIRST --last $LR
"$PYTHON" mudd_configs.py --src "$SRC/mudd/pytorch" --commit $MUDD
"$PYTHON" massive.py --src "$SRC/massive" --commit $MASSIVE
"$PYTHON" dormant.py --src "$SRC/dormant" --commit $DORMANT
"$PYTHON" gated_attention.py --src "$SRC/qwen3_gated" --commit $QIU
