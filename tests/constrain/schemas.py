"""JSON-schema constrained generation against the `jsonschema` reference (`make test-native`
runs it in the serve venv): 120 schemas built from the keywords kerze's constraint engine
supports — nested objects, arrays with minItems/maxItems, enum, const, strings with
minLength/maxLength/pattern, integers and numbers with bounds, booleans, required,
additionalProperties: false, anyOf — each run greedy and with 5 seeds at temperature 0.8 on a
tiny synthetic model (`kerze generate --json-schema`). Every run that says `stop` must parse
and validate; one that says `length` must not be a whole valid value (it was cut off). Prints
the share of runs that ended with `stop`.

Then the same on the default model, Gemma 3 270M (through `kerze serve`'s completions with
`response_format`, so the vocabulary's token trie is built once): the first 10 schemas in CI,
all 120 with KERZE_REAL_SCHEMAS=all. There at least 95% of the runs must end with `stop`.
"""

import json
import os
import random
import subprocess
import sys
import re
import tempfile
import threading
import time
import urllib.request

import jsonschema

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KERZE = os.path.join(ROOT, "target", "release", "kerze")
MODELS = {
    "gemma3": os.path.join(ROOT, "models", "tiny-gemma3.gguf"),
    "qwen2-byte-level": os.path.join(ROOT, "models", "tiny-qwen2-chatml.gguf"),
}
N_SCHEMAS = 120
SEEDS = [None, 1, 2, 3, 4, 5]
GEMMA = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
REAL_SCHEMAS = N_SCHEMAS if os.environ.get("KERZE_REAL_SCHEMAS") == "all" else 10
REAL_PROMPT = "A record about a pet shop in Lisbon, as one JSON object:\n"


def leaf(rng, depth):
    kind = rng.choice(["string", "bounded_string", "pattern", "integer", "number", "boolean", "enum", "const", "anyof", "array", "object"])
    if depth >= 2 and kind in ("array", "object", "anyof"):
        kind = "integer"
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 12)}
    if kind == "bounded_string":
        lo = rng.randint(0, 4)
        return {"type": "string", "minLength": lo, "maxLength": lo + rng.randint(0, 8)}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(["^[a-z]{2,6}$", "^[0-9]{3}-[0-9]{2}$", "^(yes|no)$", "^[A-Z][a-z]{0,5}$"])}
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 500)}
    if kind == "number":
        lo = rng.randint(-10, 10)
        return {"type": "number", "minimum": lo, "maximum": lo + rng.randint(1, 100)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "sea", "river", 1, 2, True, None], rng.randint(1, 4))}
    if kind == "const":
        return {"const": rng.choice(["fixed", 7, False, "the sea"])}
    if kind == "anyof":
        return {"anyOf": [leaf(rng, depth + 1), leaf(rng, depth + 1)]}
    if kind == "array":
        lo = rng.randint(0, 2)
        return {"type": "array", "items": leaf(rng, depth + 1), "minItems": lo, "maxItems": lo + rng.randint(0, 3)}
    return obj(rng, depth + 1)


def obj(rng, depth):
    names = rng.sample(["name", "age", "city", "tags", "ok", "score", "kind", "note", "id", "items"], rng.randint(1, 4))
    props = {n: leaf(rng, depth) for n in names}
    required = [n for n in names if rng.random() < 0.8]
    s = {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    return s


def schemas():
    rng = random.Random(20261202)
    return [obj(rng, 0) for _ in range(N_SCHEMAS)]


def main():
    for m in MODELS.values():
        if not os.path.exists(m):
            family, tok = ("gemma3", "spm") if "gemma3" in m else ("qwen2", "gpt2")
            args = ["synth", "--family", family, "--tokenizer", tok, "--out", m]
            if family == "qwen2":
                args += ["--quant", "Q4_1"]
            subprocess.run([KERZE, *args], check=True, capture_output=True)
    runs = stops = failures = 0
    with tempfile.TemporaryDirectory(prefix="kerze-schemas-") as d:
        for i, schema in enumerate(schemas()):
            jsonschema.Draft202012Validator.check_schema(schema)
            path = os.path.join(d, f"{i}.json")
            with open(path, "w") as f:
                json.dump(schema, f)
            models = ["gemma3"] if i % 4 else ["gemma3", "qwen2-byte-level"]
            for model in models:
                for seed in SEEDS:
                    sampling = ["--temperature", "0"] if seed is None else ["--temperature", "0.8", "--seed", str(seed)]
                    out = subprocess.run(
                        [KERZE, "generate", "--model", MODELS[model], "--device", "cpu", "--prompt", "the cat is in the garden",
                         "--json-schema", path, "--max-tokens", "256", "--json", *sampling],
                        capture_output=True, text=True)
                    runs += 1
                    if out.returncode != 0:
                        failures += 1
                        print(f"FAIL schema {i} ({model}, seed {seed}): exit {out.returncode}: {out.stderr.strip()[-300:]}")
                        continue
                    # The last line by "\n" alone: splitlines() also breaks at U+2028/U+2029,
                    # which a JSON string holds unescaped (a sampled text had U+2029).
                    r = json.loads(out.stdout.strip().split("\n")[-1])
                    text, finish = r["text"], r["finish_reason"]
                    try:
                        value = json.loads(text)
                        valid = jsonschema.Draft202012Validator(schema).is_valid(value)
                    except json.JSONDecodeError:
                        valid = False
                    if finish == "stop":
                        stops += 1
                        if not valid:
                            failures += 1
                            print(f"FAIL schema {i} ({model}, seed {seed}): stop but invalid: {text!r}\n  {json.dumps(schema)}")
                    elif valid:
                        failures += 1
                        print(f"FAIL schema {i} ({model}, seed {seed}): {finish} yet a whole valid value: {text!r}")
    print(f"schemas.py: {N_SCHEMAS} schemas, {runs} runs, {stops} ended with stop ({100 * stops / runs:.1f}%), {failures} failures")
    failures += real_model()
    sys.exit(1 if failures else 0)


def check(schema, text, finish, what):
    """1 if the run breaks the rules (stop must validate; length must not be a whole value)."""
    try:
        valid = jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    except json.JSONDecodeError:
        valid = False
    if finish == "stop" and not valid:
        print(f"FAIL {what}: stop but invalid: {text!r}\n  {json.dumps(schema)}")
        return 1
    if finish != "stop" and valid:
        print(f"FAIL {what}: {finish} yet a whole valid value: {text!r}")
        return 1
    return 0


def real_model():
    """The first REAL_SCHEMAS schemas on Gemma 3 270M, greedy and 5 seeds: the failures."""
    p = subprocess.Popen([KERZE, "serve", "--model", GEMMA, "--port", "0", "--device", "cpu", "--slots", "1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        base = None
        deadline = time.time() + 60
        while time.time() < deadline and base is None:
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", p.stderr.readline())
            base = m.group(1) if m else None
        if base is None:
            print("FAIL kerze serve did not start")
            return 1
        threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
        runs = stops = failures = 0
        t0 = time.time()
        for i, schema in enumerate(schemas()[:REAL_SCHEMAS]):
            for seed in SEEDS:
                body = {"prompt": REAL_PROMPT, "max_tokens": 256, "cache": False,
                        "response_format": {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}}}
                body.update({"temperature": 0} if seed is None else {"temperature": 0.8, "seed": seed})
                req = urllib.request.Request(f"{base}/v1/completions", data=json.dumps(body).encode(),
                                             headers={"content-type": "application/json"})
                for _ in range(600):
                    try:
                        with urllib.request.urlopen(req, timeout=120) as r:
                            c = json.load(r)["choices"][0]
                        break
                    except urllib.error.HTTPError as e:
                        if e.code != 503:  # still loading
                            raise
                        time.sleep(0.1)
                runs += 1
                stops += c["finish_reason"] == "stop"
                failures += check(schema, c["text"], c["finish_reason"], f"Gemma 3 270M schema {i} seed {seed}")
        share = 100 * stops / runs
        print(f"schemas.py: Gemma 3 270M, {REAL_SCHEMAS} schemas, {runs} runs, {stops} ended with stop ({share:.1f}%), "
              f"{failures} failures, {time.time() - t0:.0f} s")
        if share < 95:
            print(f"FAIL only {share:.1f}% of the runs on the default model ended with stop (at least 95%)")
            failures += 1
        return failures
    finally:
        p.terminate()
        p.wait(30)


if __name__ == "__main__":
    main()
