#!/usr/bin/env bash
# The WebGPU backend's speed on a real GPU, as one prepared run for a machine that has a GPU
# but reaches neither the model file nor a package registry, and takes a small working tree
# (the team's device machines: 64 MiB travel with the repo).
#
#   tests/gpu_device.sh pack   here, once: into .device/ (ignored by git, ~24 MiB) the native
#                              binary with the GPU backend (stripped), the model's header
#                              (its metadata, vocabulary and tensor index: 6.5 MB for Gemma 3
#                              270M, `kerze inspect`'s header_bytes) and Debian's Vulkan loader
#                              and GL dispatch libraries (NVIDIA's driver links against them).
#   tests/gpu_device.sh run    there, in the repo root: the model again from its header with
#                              random weights (`kerze synth --shape-of`: the same tensors,
#                              types and vocabulary, so the same work a step), then
#                              `kerze bench` on the GPU and, for scale, on the CPU. JSON lines
#                              in $OUT (else .device/out) and a summary on stdout.
#
# Random weights change no GPU work: every product, the attention and the greedy top-1 run
# on all their values whatever they are. (The CPU's LM head filter does depend on them: its
# number here is not the real model's.)
#
# Variables: MODEL (pack; default the Makefile's), RUNS (GPU runs of 128 + 64 tokens, 3),
# LONG (a 512 + 256-token run too, 1), CPU (the CPU run, 1).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=.device
MODEL=${MODEL:-models/gemma-3-270m-q4_k_m.gguf}

case "${1:-}" in
pack)
  make target/release/kerze
  mkdir -p "$DIR/debs"
  strip -o "$DIR/kerze" target/release/kerze
  n=$("$DIR/kerze" inspect --json --model "$MODEL" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["header_bytes"])')
  head -c "$n" "$MODEL" >"$DIR/header.gguf"
  # The Vulkan loader and the GL dispatch libraries NVIDIA's Vulkan driver links against,
  # for a machine without them (the driver itself is the GPU machine's).
  rm -f "$DIR"/debs/*.deb
  debs="libvulkan1 libglvnd0 libegl1 libopengl0 libgl1 libglx0 libgles2"
  # shellcheck disable=SC2086
  (cd "$DIR/debs" && { apt-get download -qq $debs 2>/dev/null ||
    { apt-get update -qq && apt-get download -qq $debs; }; })
  du -sh "$DIR"
  ;;
run)
  OUT=${OUT:-$DIR/out}
  mkdir -p "$OUT"
  # Each packed library the machine lacks (one it has stays as it is).
  for f in "$DIR"/debs/*.deb; do
    case $(basename "$f") in
      libvulkan1_*) so=libvulkan.so.1 ;; libglvnd0_*) so=libGLdispatch.so.0 ;;
      libegl1_*) so=libEGL.so.1 ;; libopengl0_*) so=libOpenGL.so.0 ;; libgl1_*) so=libGL.so.1 ;;
      libglx0_*) so=libGLX.so.0 ;; libgles2_*) so=libGLESv2.so.2 ;; *) so= ;;
    esac
    if [ -n "$so" ] && ! ldconfig -p | grep -q "^[[:space:]]*$so "; then
      echo "unpacking $(basename "$f") (no $so here)"
      dpkg -x "$f" /
    fi
  done
  ldconfig
  # NVIDIA's ICD where the driver is mounted but not registered.
  icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  if [ -e "$icd" ] && [ -z "${VK_DRIVER_FILES:-}" ]; then export VK_DRIVER_FILES=$icd; fi
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt" || true
  fi
  # Mesa's drivers (where present) warn without one.
  export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp/kerze-xdg}
  mkdir -p -m 700 "$XDG_RUNTIME_DIR"
  model=${TMPDIR:-/tmp}/kerze-shaped.gguf
  t0=$(date +%s%N)
  "$DIR/kerze" synth --shape-of "$DIR/header.gguf" --out "$model" >/dev/null
  echo "the model from its header in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  bench() { # label, then kerze bench's arguments
    local label=$1
    shift
    "$DIR/kerze" bench --json --model "$model" "$@" |
      python3 -c 'import json, sys; v = json.load(sys.stdin); v["label"] = sys.argv[1]; print(json.dumps(v))' "$label" |
      tee -a "$OUT/bench.jsonl"
  }
  : >"$OUT/bench.jsonl"
  if ! "$DIR/kerze" bench --json --device webgpu --model "$model" --prompt-tokens 8 --gen-tokens 2 >/dev/null; then
    echo "no GPU run: the Vulkan loader and drivers seen here:" >&2
    ldconfig -p | grep -i vulkan >&2 || true
    ls /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/nvidia/share/vulkan/icd.d >&2 || true
    exit 1
  fi
  # Exactness on this GPU (software renderers are not real ones: subgroup sizes, workgroup
  # memory and float rounding differ): teacher-forced logits against the CPU engine's.
  ids=$("$DIR/kerze" bench --prompt-ids --prompt-tokens 64 --model "$model" |
    python3 -c 'import json, sys; print(",".join(map(str, json.load(sys.stdin))))')
  for d in webgpu cpu; do
    "$DIR/kerze" logits --json --top 5 --device "$d" --ids "$ids" --model "$model" >"$OUT/logits-$d.json"
  done
  python3 - "$OUT/logits-webgpu.json" "$OUT/logits-cpu.json" <<'EOF'
import json, sys
gpu, cpu = (json.load(open(p))["top"] for p in sys.argv[1:3])
agree = sum(g[0][0] == c[0][0] for g, c in zip(gpu, cpu))
deltas = [abs(dict(g)[i] - l) for g, c in zip(gpu, cpu) for i, l in c if i in dict(g)]
print(f"GPU against CPU, teacher-forced, {len(cpu)} positions: top-1 the same at {agree}, "
      f"max |logit difference| {max(deltas):.4f} over {len(deltas)} shared top-5 entries")
EOF
  for _ in $(seq "${RUNS:-3}"); do bench gpu-128+64 --device webgpu; done
  for _ in $(seq "${LONG:-1}"); do bench gpu-512+256 --device webgpu --prompt-tokens 512 --gen-tokens 256; done
  for _ in $(seq "${CPU:-1}"); do bench cpu-128+64 --device cpu; done
  python3 - "$OUT/bench.jsonl" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for label in dict.fromkeys(r["label"] for r in runs):
    rs = [r for r in runs if r["label"] == label]
    med = lambda k: statistics.median(r[k] for r in rs)
    line = f"{label}: {len(rs)} run(s), {rs[0]['backend']} ({rs[0]['reason']}): prefill {med('prefill_tokens_per_s'):.1f} tok/s, decode {med('decode_tokens_per_s'):.1f} tok/s ({1e6 / med('decode_tokens_per_s'):.0f} us a step)"
    g = rs[0].get("gpu_per_decode_step")
    if g:
        line += f"; a decode step: {g['dispatches']:.0f} dispatches, {g['submits']:.0f} submit(s), {g['encode_ms'] * 1e3:.0f} us recording, {g['bytes_read']:.0f} bytes read back"
    print(line)
EOF
  ;;
*)
  echo "usage: $0 pack | run" >&2
  exit 2
  ;;
esac
