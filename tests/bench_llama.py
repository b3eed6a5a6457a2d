"""llama.cpp (llama-cpp-python) on the same work as `kerze bench`: the given prompt ids, then
greedy tokens (end of sequence ignored), one fresh context per thread count. Prints one JSON
line per thread count: {"threads", "prefill_tokens_per_s", "decode_tokens_per_s", "construct_s",
"ready_s", "ready_at_ms", "rss_after_load_mb", "peak_rss_mb"}.

    python tests/bench_llama.py MODEL.gguf GEN_TOKENS THREADS[,THREADS…] [N_CTX] < ids.json

`make bench-native` and `make bench-scale` run it beside `kerze bench` (the ids from
`kerze bench --prompt-ids`). N_CTX (default: the ids, the tokens and 8) is the context, which
bench-scale gives kerze too (`--n-ctx`), so that neither engine's KV cache is larger."""
import json
import sys
import time

from llama_cpp import Llama


def status_mb(key):
    """VmRSS / VmHWM of this process, MB (what the benchmark also samples from outside)."""
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith(key + ":"))
    return kb * 1024 / 1e6


def main():
    path, gen, threads = sys.argv[1], int(sys.argv[2]), [int(t) for t in sys.argv[3].split(",")]
    ids = json.load(sys.stdin)
    n_ctx = int(sys.argv[4]) if len(sys.argv) > 4 else len(ids) + gen + 8
    for n in threads:
        # n_batch = n_ctx: the prompt is one batch, and llama-cpp-python keeps a row of scores
        # per batch position (the last token's logits only: logits_all off).
        t_load = time.perf_counter()
        # The default mmap, as llama.cpp's users run it. Constructing maps the file but reads
        # little of it: the weights come in as the first evaluation touches them (page faults,
        # or the disk on a cold cache). So "ready" is the constructor and a first one-token
        # evaluation (every weight it reads is then resident), which is what kerze's load
        # does before it is ready (it reads and repacks every weight); construct_s alone is
        # reported beside it.
        llm = Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_threads=n,
                    n_threads_batch=n, logits_all=False, verbose=False)
        construct_s = time.perf_counter() - t_load
        llm.eval(ids[:1])
        ready_s = time.perf_counter() - t_load
        ready_at_ms = time.time() * 1000
        rss_after_load = status_mb("VmRSS")
        llm.reset()
        # One untimed run first, as `kerze bench` loads and warms before it times.
        llm.eval(ids[:8])
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        tok = int(llm.scores[llm.n_tokens - 1].argmax())
        t2 = time.perf_counter()
        for _ in range(gen - 1):
            llm.eval([tok])
            tok = int(llm.scores[llm.n_tokens - 1].argmax())
        t3 = time.perf_counter()
        print(json.dumps({
            "engine": "llama.cpp",
            "threads": n,
            "prefill_tokens_per_s": len(ids) / (t1 - t0),
            # The first token comes with the prompt, as in `kerze bench`: gen − 1 steps.
            "decode_tokens_per_s": (gen - 1) / (t3 - t2),
            "construct_s": construct_s,
            "ready_s": ready_s,
            "ready_at_ms": ready_at_ms,
            "rss_after_load_mb": rss_after_load,
            "peak_rss_mb": status_mb("VmHWM"),
        }), flush=True)
        llm.close()


if __name__ == "__main__":
    main()
