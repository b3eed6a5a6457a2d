"""GGUF headers (metadata and tensor index, no tensor data) of real models in llama.cpp's
Q4_K_M type mix, with their real vocabularies: what `kerze synth --shape-of HEADER --out FILE`
fills with random weights, so that `make bench-scale` measures the shapes people run without
their weights.

    python tests/scale/make_headers.py OUT_DIR [NAME ...]   # default: every model below

writes OUT_DIR/NAME.header.gguf and prints each one's tensor types and bytes. Needs the `gguf`
package (0.19.0, the version llama.cpp 0.3.36 vendors) and two inputs, both from packages:
- llama-cpp-python 0.3.36's sdist (`--sdist`, default $KERZE_CACHE/sdist/…; downloaded with
  pip when missing): its vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf is the Llama 3
  vocabulary (128 256 tokens, 280 147 merges) and ggml-vocab-qwen2.gguf Qwen2's (151 936);
- Gemma 3 270M's GGUF (`--gemma`, default models/gemma-3-270m-q4_k_m.gguf, `kerze fetch
  gemma-3-270m`): the Gemma 3 vocabulary (262 144 tokens), the same in every Gemma 3 size.
Every `tokenizer.*` key of the vocabulary's file is copied as it is.

The type of each tensor follows llama.cpp's `llama-quantize … Q4_K_M` (src/llama-quant.cpp,
llama_tensor_get_type_impl and tensor_type_fallback, read in the 0.3.36 sdist):
- Q4_K by default (the token embedding too when the model has an output.weight);
- Q6_K for output.weight, or for token_embd when the embeddings are tied (no output.weight),
  but Q8_0 there when a row is not whole 256-value blocks;
- attn_v and ffn_down Q6_K on the "use_more_bits" layers: i < n/8, i >= 7n/8,
  (i - n/8) % 3 == 2 (attn_v counts attn_v tensors in file order: the layer here);
- a K-quant on rows that are not whole 256-value blocks falls back: Q4_K → Q5_0,
  Q6_K → Q8_0;
- vectors (norms, biases, rope_freqs) stay F32.
"""
import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("KERZE_CACHE", Path.home() / ".cache/kerze"))
LLAMA_CPP_PY = "0.3.36"
SDIST = CACHE / "sdist" / f"llama_cpp_python-{LLAMA_CPP_PY}.tar.gz"
T = gguf.GGMLQuantizationType

# The models, from each one's Hugging Face config.json (and for what that leaves out, the keys
# llama.cpp's convert_hf_to_gguf.py writes). ctx: max_position_embeddings; eps: rms_norm_eps.
MODELS = {
    # meta-llama/Llama-3.2-1B-Instruct: rope_scaling llama3 (factor 32, low_freq_factor 1,
    # high_freq_factor 4, original_max_position_embeddings 8192), tie_word_embeddings true.
    # Real Q4_K_M: 807 690 656 bytes.
    "llama-3.2-1b": dict(arch="llama", name="Llama 3.2 1B Instruct", vocab="llama-bpe", layers=16, embd=2048, ff=8192,
                         heads=32, kv_heads=8, head_dim=64, rope_theta=500000.0, llama3_rope=True, ctx=131072, eps=1e-5, tied=True),
    # meta-llama/Llama-3.2-3B-Instruct: the same rope scaling, tied. Real Q4_K_M: 2.02 GB.
    "llama-3.2-3b": dict(arch="llama", name="Llama 3.2 3B Instruct", vocab="llama-bpe", layers=28, embd=3072, ff=8192,
                         heads=24, kv_heads=8, head_dim=128, rope_theta=500000.0, llama3_rope=True, ctx=131072, eps=1e-5, tied=True),
    # meta-llama/Llama-3.1-8B-Instruct: rope_scaling llama3 (factor 8, low 1, high 4, original
    # 8192), an output.weight of its own. Real Q4_K_M: 4.92 GB.
    "llama-3.1-8b": dict(arch="llama", name="Llama 3.1 8B Instruct", vocab="llama-bpe", layers=32, embd=4096, ff=14336,
                         heads=32, kv_heads=8, head_dim=128, rope_theta=500000.0, llama3_rope=True, ctx=131072, eps=1e-5, tied=False),
    # Qwen/Qwen2.5-1.5B-Instruct: q/k/v biases, tie_word_embeddings true, no sliding window
    # (use_sliding_window false).
    "qwen2.5-1.5b": dict(arch="qwen2", name="Qwen2.5 1.5B Instruct", vocab="qwen2", layers=28, embd=1536, ff=8960,
                         heads=12, kv_heads=2, head_dim=128, rope_theta=1000000.0, ctx=32768, eps=1e-6, tied=True),
    # Qwen/Qwen2.5-3B-Instruct: q/k/v biases, tied.
    "qwen2.5-3b": dict(arch="qwen2", name="Qwen2.5 3B Instruct", vocab="qwen2", layers=36, embd=2048, ff=11008,
                       heads=16, kv_heads=2, head_dim=128, rope_theta=1000000.0, ctx=32768, eps=1e-6, tied=True),
    # google/gemma-3-1b-it: head_dim 256, sliding_window 512 in 5 of every 6 layers
    # (sliding_window_pattern 6; llama.cpp and kerze both take the 6 and the local rope base
    # 10 000 from the architecture, not from a key), rope_theta 1e6 on the global layers, no
    # rope scaling, q/k norms, tied. 1152 is not whole 256-blocks: most matrices are Q5_0 and
    # the embedding Q8_0.
    "gemma-3-1b": dict(arch="gemma3", name="Gemma 3 1B IT", vocab="gemma3", layers=26, embd=1152, ff=6912,
                       heads=4, kv_heads=1, head_dim=256, rope_theta=1000000.0, ctx=32768, eps=1e-6, tied=True,
                       sliding_window=512),
}


def q4_k_m(name, layer, n_layer, cols, tied):
    """llama.cpp's Q4_K_M type for a matrix (see the module's docstring)."""
    def more_bits(i):
        return i < n_layer // 8 or i >= 7 * n_layer // 8 or (i - n_layer // 8) % 3 == 2
    if name == "output.weight" or (name == "token_embd.weight" and tied):
        return T.Q6_K if cols % 256 == 0 else T.Q8_0
    ty = T.Q6_K if name in ("attn_v.weight", "ffn_down.weight") and more_bits(layer) else T.Q4_K
    if cols % 256:
        ty = {T.Q4_K: T.Q5_0, T.Q6_K: T.Q8_0}[ty]
    return ty


def tensors(m):
    """(name, rows, cols or None for a vector, type) in the order llama.cpp's files have them."""
    e, hd, v = m["embd"], m["head_dim"], m["n_vocab"]
    q, kv = m["heads"] * hd, m["kv_heads"] * hd
    out = []
    if m.get("llama3_rope"):
        # Llama 3.1's frequency factors (rope_scaling: llama3), one per rotated pair.
        out.append(("rope_freqs.weight", hd // 2, None, T.F32))
    out.append(("token_embd.weight", v, e, q4_k_m("token_embd.weight", None, m["layers"], e, m["tied"])))
    for i in range(m["layers"]):
        mats = [("attn_q.weight", q, e), ("attn_k.weight", kv, e), ("attn_v.weight", kv, e), ("attn_output.weight", e, q),
                ("ffn_gate.weight", m["ff"], e), ("ffn_up.weight", m["ff"], e), ("ffn_down.weight", e, m["ff"])]
        vecs = [("attn_norm.weight", e), ("ffn_norm.weight", e)]
        if m["arch"] == "qwen2":
            vecs += [("attn_q.bias", q), ("attn_k.bias", kv), ("attn_v.bias", kv)]
        if m["arch"] == "gemma3":
            vecs += [("attn_q_norm.weight", hd), ("attn_k_norm.weight", hd),
                     ("post_attention_norm.weight", e), ("post_ffw_norm.weight", e)]
        out += [(f"blk.{i}.{n}", r, c, q4_k_m(n, i, m["layers"], c, m["tied"])) for n, r, c in mats]
        out += [(f"blk.{i}.{n}", n_, None, T.F32) for n, n_ in vecs]
    out.append(("output_norm.weight", e, None, T.F32))
    if not m["tied"]:
        out.append(("output.weight", v, e, q4_k_m("output.weight", None, m["layers"], e, False)))
    return out


def nbytes(rows, cols, ty):
    block, size = gguf.GGML_QUANT_SIZES[ty]
    return (rows * (cols or 1)) // block * size


def copy_tokenizer(reader, w):
    """Every tokenizer.* key of a vocabulary's GGUF, with its own value types."""
    for key, f in reader.fields.items():
        if key.startswith("tokenizer."):
            vtype = f.types[0]
            sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(key, f.contents(), vtype, sub)
    return int(len(reader.fields["tokenizer.ggml.tokens"].data))


def vocab_files(sdist, gemma, tmp):
    if not sdist.exists():
        # The same download as the Makefile's $(LLAMA_CPP_SDIST): PyPI has only the sdist.
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", "llama-cpp-python",
                        "--dest", str(sdist.parent), f"llama-cpp-python=={LLAMA_CPP_PY}"], check=True)
    out = {"gemma3": gemma}
    with tarfile.open(sdist) as tar:
        for v in ("llama-bpe", "qwen2"):
            member = f"llama_cpp_python-{LLAMA_CPP_PY}/vendor/llama.cpp/models/ggml-vocab-{v}.gguf"
            out[v] = Path(tmp) / f"{v}.gguf"
            out[v].write_bytes(tar.extractfile(member).read())
    return out


def write_header(key, m, vocab_path, out_dir):
    arch = m["arch"]
    w = gguf.GGUFWriter(None, arch)
    w.add_string("general.name", m["name"])  # synth makes it "kerze synthetic, … in the shape of" it
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.MOSTLY_Q4_K_M))
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
    for k, v in [("context_length", m["ctx"]), ("embedding_length", m["embd"]), ("block_count", m["layers"]),
                 ("feed_forward_length", m["ff"]), ("attention.head_count", m["heads"]),
                 ("attention.head_count_kv", m["kv_heads"]), ("attention.key_length", m["head_dim"]),
                 ("attention.value_length", m["head_dim"])]:
        w.add_uint32(f"{arch}.{k}", v)
    w.add_float32(f"{arch}.rope.freq_base", m["rope_theta"])
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", m["eps"])
    if arch == "llama":
        w.add_uint32("llama.rope.dimension_count", m["head_dim"])
    if "sliding_window" in m:
        w.add_uint32(f"{arch}.attention.sliding_window", m["sliding_window"])
    m["n_vocab"] = copy_tokenizer(gguf.GGUFReader(vocab_path), w)
    if arch == "llama":
        w.add_uint32("llama.vocab_size", m["n_vocab"])
    counts, total = {}, 0
    for name, rows, cols, ty in tensors(m):
        n = nbytes(rows, cols, ty)
        shape = (rows,) if cols is None else (rows, cols)  # numpy order: the writer reverses it
        w.add_tensor_info(name, shape, np.dtype(np.float32), n, raw_dtype=ty)
        c = counts.setdefault(ty.name, [0, 0])
        c[0] += 1
        c[1] += n
        total += n
    path = out_dir / f"{key}.header.gguf"
    tmp = path.with_suffix(".tmp")
    w.write_header_to_file(tmp)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()  # and no tensor data: a header
    w.close()
    tmp.replace(path)
    types = ", ".join(f"{k} ×{n} {b / 1e6:.1f} MB" for k, (n, b) in sorted(counts.items()))
    print(f"{path.name}: {len(tensors(m))} tensors, {total / 1e6:.1f} MB of tensors ({types})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("names", nargs="*", help=f"of {', '.join(MODELS)} (default: all)")
    ap.add_argument("--sdist", type=Path, default=SDIST)
    ap.add_argument("--gemma", type=Path, default=ROOT / "models/gemma-3-270m-q4_k_m.gguf")
    a = ap.parse_args()
    unknown = set(a.names) - set(MODELS)
    if unknown:
        ap.error(f"unknown {sorted(unknown)}: {', '.join(MODELS)}")
    a.out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        vocab = vocab_files(a.sdist, a.gemma, tmp)
        for key in a.names or MODELS:
            write_header(key, dict(MODELS[key]), vocab[MODELS[key]["vocab"]], a.out_dir)


if __name__ == "__main__":
    main()
