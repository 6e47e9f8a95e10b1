#!/usr/bin/env bash
# The device tool sends the tracked tree, and probe's is about 104 MB (the zoo's weights and the corpora), over the
# 64 MiB a run carries. The kernel checks need neither, so, from the repo root, around a device run:
#   scripts/gpu/slim_tree.sh off    # untrack them in the index only (files stay on disk) and ignore them locally
#   run(carry=[".whl"], ...)        # scripts/gpu/check.sh
#   scripts/gpu/slim_tree.sh on     # restore the index and the local ignore file
# Nothing is committed: `on` must run before the next commit (`git status` shows the paths as deleted until then).
set -euo pipefail
cd "$(dirname "$0")/../.."
paths=(probe/zoo probe/data/corpora)
exclude=.git/info/exclude
case "${1:-}" in
off)
    git rm -r -q --cached "${paths[@]}"
    mkdir -p "$(dirname "$exclude")"
    for p in "${paths[@]}"; do echo "/$p/" >> "$exclude"; done
    echo "tracked tree now $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) bytes" ;;
on)
    for p in "${paths[@]}"; do [ -f "$exclude" ] && sed -i "\#^/$p/\$#d" "$exclude"; done
    git reset -q -- "${paths[@]}"
    git status --short -- "${paths[@]}" ;;
*)
    echo "usage: scripts/gpu/slim_tree.sh off|on (got '${1:-}')" >&2; exit 2 ;;
esac
