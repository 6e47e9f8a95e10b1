#!/usr/bin/env bash
# Lint and format check of the whole tree with the configuration in pyproject.toml ([tool.ruff]: line length 120,
# rules E, F, I, B, UP). Nothing is changed: `ruff check --fix` and `ruff format` are for the author, before committing.
set -euo pipefail
cd "$(dirname "$0")/../.."
ruff --version
ruff check .
ruff format --check .
