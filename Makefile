# kerze — one entry point for set-up, tests, demo and benchmarks.
# `make test` and `make demo` install what they need on a fresh machine (Debian, rustup):
# the wasm target, the pinned wasm-bindgen CLI, Chromium + chromedriver, the model.
# Tool installs and the model are cached outside the clone, in $(KERZE_CACHE).

SHELL := /bin/bash
KERZE_CACHE ?= $(HOME)/.cache/kerze
export KERZE_CACHE
WASM_BINDGEN_VERSION := 0.2.130
WASM_BINDGEN_DIR := $(KERZE_CACHE)/wasm-bindgen-$(WASM_BINDGEN_VERSION)
export PATH := $(WASM_BINDGEN_DIR)/bin:$(PATH)
MODEL := models/gemma-3-270m-q4_k_m.gguf
KERZE := target/release/kerze
PROMPT ?= The three most important things to know about baking bread are

.PHONY: help setup setup-rust setup-browser fetch build test test-native test-wasm lint demo bench bench-native bench-wasm fuzz clean

help:
	@echo "make demo   — fetch the default model, build, and generate with it"
	@echo "make test   — every test: lint, native, wasm in headless Chromium"
	@echo "make fetch  — fetch the default model into models/"
	@echo "make bench  — prefill/decode tokens/s natively and in headless Chromium"
	@echo "make fuzz   — 100 000 mutated GGUF headers"

setup: setup-rust setup-browser

setup-rust:
	@rustup target list --installed | grep -q '^wasm32-unknown-unknown$$' || rustup target add wasm32-unknown-unknown
	@rustup component list --installed | grep -q '^clippy' || rustup component add clippy
	@rustup component list --installed | grep -q '^rustfmt' || rustup component add rustfmt
	@if [ "$$(wasm-bindgen --version 2>/dev/null)" != "wasm-bindgen $(WASM_BINDGEN_VERSION)" ]; then \
	  echo "installing wasm-bindgen-cli $(WASM_BINDGEN_VERSION) into $(WASM_BINDGEN_DIR) (about 4 minutes, once)"; \
	  cargo install wasm-bindgen-cli --version $(WASM_BINDGEN_VERSION) --root $(WASM_BINDGEN_DIR); \
	fi

setup-browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  echo "installing Debian's chromium and chromium-driver"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	fi

$(KERZE): $(shell find src -name '*.rs') Cargo.toml Cargo.lock models/catalog.json
	cargo build --release --bin kerze

build: $(KERZE)

fetch: $(KERZE)
	@$(KERZE) fetch gemma-3-270m

lint: setup-rust
	cargo fmt --check
	cargo clippy --release --all-targets -- -D warnings
	cargo clippy --release --target wasm32-unknown-unknown --all-targets -- -D warnings

test-native: fetch
	cargo test --release

test-wasm: setup fetch
	tests/wasm_tests.sh

test: setup lint test-native test-wasm
	@echo "make test: all passed"

demo: setup-rust fetch
	@echo "(the browser demo comes with the browser package; until then, the CLI)"
	$(KERZE) generate --model gemma-3-270m --prompt "$(PROMPT)" --max-tokens 64 --temperature 0.7 --seed 1

bench: bench-native bench-wasm

bench-native: fetch
	CANDLE_NUM_THREADS=1 $(KERZE) bench --model gemma-3-270m --prompt-tokens 128 --gen-tokens 64 --json
	$(KERZE) bench --model gemma-3-270m --prompt-tokens 128 --gen-tokens 64 --json

bench-wasm: setup fetch
	KERZE_BENCH=1 tests/wasm_tests.sh --test wasm_bench -- --nocapture

fuzz:
	KERZE_FUZZ_CASES=100000 cargo test --release --test bad_input mutated_headers -- --nocapture

clean:
	cargo clean
