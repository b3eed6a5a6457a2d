"""llama.cpp (llama-cpp-python) on the same work as `kerze bench`: the given prompt ids, then
greedy tokens (end of sequence ignored), one fresh context per thread count. Prints one JSON
line per thread count: {"threads", "prefill_tokens_per_s", "decode_tokens_per_s"}.

    python tests/bench_llama.py MODEL.gguf GEN_TOKENS THREADS[,THREADS…] < ids.json

`make bench-native` runs it beside `kerze bench` (the ids from `kerze tokenize`)."""
import json
import sys
import time

from llama_cpp import Llama


def main():
    path, gen, threads = sys.argv[1], int(sys.argv[2]), [int(t) for t in sys.argv[3].split(",")]
    ids = json.load(sys.stdin)
    for n in threads:
        # n_batch = n_ctx: the prompt is one batch, and llama-cpp-python keeps a row of scores
        # per batch position (the last token's logits only: logits_all off).
        n_ctx = len(ids) + gen + 8
        llm = Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_threads=n,
                    n_threads_batch=n, logits_all=False, verbose=False)
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
        }), flush=True)
        llm.close()


if __name__ == "__main__":
    main()
