#!/usr/bin/env bash
# CI stage: the docs (tools/check_docs.py). Every relative link and #anchor of
# README.md and docs/**/*.md must resolve, and every fenced block marked
# ```sh runnable``` (the README's five-minute path among them) must run: each
# page's blocks in order, in a fresh temporary directory where the
# repository's top-level entries are linked, with build/reshard (or
# RESHARD_BIN) first on PATH. The marker and how to use it:
# docs/contributing.md, "The docs and runnable blocks".
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${RESHARD_BIN:-build/reshard}"
[ -x "$bin" ] || { echo "15-docs: $bin is missing (build first)" >&2; exit 1; }
RESHARD_BIN="$bin" python3 tools/check_docs.py -v
