#!/usr/bin/env bash
# Compares the engine's tokenizer (through TOKENIZE_TOOL, tests/engine/tokenizer/tokenize_tool.cc)
# with Hugging Face's pure-JS @huggingface/tokenizers on the fixtures' tokenizer.json files and on
# synthetic variants: see tokenizer_crosscheck.mjs.
# Usage: run_tokenizer_crosscheck.sh TOKENIZE_TOOL
set -euo pipefail
tool="$1"
here="$(cd "$(dirname "$0")" && pwd)"
if ! command -v node >/dev/null || [ ! -d "$here/node_modules/@huggingface/tokenizers" ]; then
    echo "SKIP: node or the @huggingface/tokenizers package is missing" \
        "(deploy/test installs it with npm ci in tests/node)"
    exit 0
fi
exec node "$here/tokenizer_crosscheck.mjs" "$tool"
