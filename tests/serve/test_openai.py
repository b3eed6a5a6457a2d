"""`kerze serve` against the official PyPI `openai` client (`make test-serve` runs it in its
own venv). On 127.0.0.1 only; every server started here is stopped by its PID.

Checked: models.list / retrieve, completions' greedy text equals `kerze generate`'s, chat
whole equals the concatenated stream and the usage chunk (no choices) comes last, and every
error status surfaces as the client's error class: 400 BadRequestError, 401
AuthenticationError, 404 NotFoundError, 413 APIStatusError, 429 RateLimitError (after which
the client's own retries succeed), 503 InternalServerError while the model loads.
"""

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

import openai

from harness import KERZE, MODEL, MODEL_ID, ROOT, expect, health, ready, start, stop_all, test
import harness

GEMMA = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
KEY = "py-key"


def generate(prompt, n):
    out = subprocess.run(
        [KERZE, "generate", "--model", MODEL, "--device", "cpu", "--prompt", prompt,
         "--max-tokens", str(n), "--temperature", "0", "--json"],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out.strip().split("\n")[-1])


try:
    proc, base = start(["--api-key", KEY, "--slots", "2", "--prepare-constraints"])
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)

    @test("openai PyPI: models.list and retrieve")
    def _():
        ids = [m.id for m in client.models.list().data]
        assert ids == [MODEL_ID], ids
        assert client.models.retrieve(MODEL_ID).owned_by == "kerze"

    @test("openai PyPI: completions greedy text equals kerze generate")
    def _():
        for prompt in ["Once upon a time", "The three most important things to know about baking bread are"]:
            want = generate(prompt, 20)
            r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=20, temperature=0)
            assert r.choices[0].text == want["text"], (r.choices[0].text, want["text"])
            assert r.usage.prompt_tokens == len(want["prompt_ids"])
            assert r.usage.completion_tokens == len(want["ids"])
            streamed = "".join(
                c.choices[0].text for c in client.completions.create(
                    model=MODEL_ID, prompt=prompt, max_tokens=20, temperature=0, stream=True)
                if c.choices)
            assert streamed == want["text"], streamed

    @test("openai PyPI: chat whole equals the concatenated stream; usage chunk last")
    def _():
        messages = [{"role": "user", "content": "Name three colours."}]
        whole = client.chat.completions.create(model=MODEL_ID, messages=messages, temperature=0, max_tokens=32)
        chunks = list(client.chat.completions.create(
            model=MODEL_ID, messages=messages, temperature=0, max_tokens=32, stream=True,
            stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == whole.choices[0].message.content, (text, whole.choices[0].message.content)
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
        assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
        assert whole.usage.prompt_tokens_details.cached_tokens >= 0

    @test("openai PyPI: error statuses are the client's error classes")
    def _():
        msgs = [{"role": "user", "content": "Hi"}]
        bad = openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0)
        expect(openai.AuthenticationError, 401, lambda: bad.models.list())
        expect(openai.NotFoundError, 404, lambda: client.chat.completions.create(model="gpt-9", messages=msgs))
        expect(openai.BadRequestError, 400,
               lambda: client.chat.completions.create(model=MODEL_ID, messages=msgs, top_p=0))
        expect(openai.BadRequestError, 400, lambda: client.chat.completions.create(
            model=MODEL_ID, messages=msgs, extra_body={"temprature": 0}))
        expect(openai.BadRequestError, 400,
               lambda: client.completions.create(model=MODEL_ID, prompt="x", max_tokens=10**9))
        e = expect(openai.APIStatusError, 413, lambda: client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "x" * (10 << 20)}]))
        assert e.body["type"] == "invalid_request_error", e.body

        tight, tbase = start(["--slots", "1", "--queue", "0"])
        tc = openai.OpenAI(base_url=f"{tbase}/v1", api_key="none", max_retries=0)
        # A stream holds the one slot until we close it.
        long = tc.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=3000,
                                     temperature=0.8, seed=1, stream=True)
        chunks = iter(long)
        next(chunks)
        e = expect(openai.RateLimitError, 429, lambda: tc.completions.create(model=MODEL_ID, prompt="x", max_tokens=2))
        assert e.response.headers["retry-after"] == "1"
        # The client retries a 429 on its own (after retry-after); the slot frees when the
        # stream's client goes away.
        patient = openai.OpenAI(base_url=f"{tbase}/v1", api_key="none", max_retries=8)
        threading.Timer(0.5, long.close).start()
        assert patient.completions.create(model=MODEL_ID, prompt="x", max_tokens=2, temperature=0).choices
        tight.terminate()
        assert tight.wait(30) == 0

        loading, lbase = start([], model=GEMMA, wait=False)
        status, body = health(lbase)
        assert status == 503 and body == {"error": {"code": 503, "message": "Loading model",
                                                     "type": "unavailable_error", "param": None}}, (status, body)
        lc = openai.OpenAI(base_url=f"{lbase}/v1", api_key="none", max_retries=0)
        expect(openai.InternalServerError, 503, lambda: lc.chat.completions.create(model="gemma-3-270m-q4_k_m", messages=msgs))
        loading.terminate()
        assert loading.wait(30) == 0

    @test("openai PyPI: embeddings from an encoder server equal kerze embed")
    def _():
        minilm = os.path.join(ROOT, "models", "all-minilm-l6-v2-q8_0.gguf")
        enc, ebase = start([], model=minilm)
        ec = openai.OpenAI(base_url=f"{ebase}/v1", api_key="none", max_retries=0)
        texts = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
        out = subprocess.run([KERZE, "embed", "--model", minilm, "--device", "cpu", "--json",
                              *sum([["--text", t] for t in texts], [])],
                             check=True, capture_output=True, text=True).stdout
        want = json.loads(out.strip().split("\n")[-1])
        for fmt in (None, "float"):
            kw = {"encoding_format": fmt} if fmt else {}
            r = ec.embeddings.create(model="all-minilm-l6-v2-q8_0", input=texts, **kw)
            assert len(r.data) == 3 and r.usage.prompt_tokens == want["usage"]["prompt_tokens"]
            for d, w in zip(r.data, want["data"]):
                dot = sum(a * b for a, b in zip(d.embedding, w["embedding"]))
                assert dot > 0.99999, (fmt, dot)
        sims = [sum(a * b for a, b in zip(r.data[i].embedding, r.data[j].embedding)) for i, j in ((0, 1), (0, 2), (1, 2))]
        assert all(abs(s - w) < 2e-3 for s, w in zip(sims, (0.6660, 0.1046, 0.1411))), sims
        expect(openai.BadRequestError, 400, lambda: ec.embeddings.create(model="all-minilm-l6-v2-q8_0", input="x", dimensions=3))
        expect(openai.BadRequestError, 400, lambda: client.embeddings.create(model=MODEL_ID, input="x"))
        enc.terminate()
        assert enc.wait(30) == 0

    @test("openai PyPI: --response-cache answers a repeated greedy or seeded request from disk, with no slot; sampled never; TTL, another model and a corrupt file miss")
    def _():
        import shutil
        import tempfile
        d = tempfile.mkdtemp(prefix="kerze-responses-")
        try:
            rc, rbase = start(["--slots", "1", "--queue", "0", "--response-cache", d])
            c = openai.OpenAI(base_url=f"{rbase}/v1", api_key="none", max_retries=0)
            messages = [{"role": "user", "content": "Name a river."}]
            ask = dict(model=MODEL_ID, messages=messages, temperature=0, max_tokens=12)
            first = c.chat.completions.with_raw_response.create(**ask)
            again = c.chat.completions.with_raw_response.create(**ask)
            assert (first.headers["x-kerze-cache"], again.headers["x-kerze-cache"]) == ("miss", "hit")
            a, b = first.parse(), again.parse()
            assert a.choices[0].message.content == b.choices[0].message.content
            assert b.usage.prompt_tokens_details.cached_tokens == b.usage.prompt_tokens == a.usage.prompt_tokens
            assert b.usage.completion_tokens == a.usage.completion_tokens
            streamed = "".join(x.choices[0].delta.content or "" for x in c.chat.completions.create(**ask, stream=True) if x.choices)
            assert streamed == a.choices[0].message.content, streamed
            # No slot, no forward pass: the one slot is held by a stream and the queue is 0,
            # yet the cached answer comes; a request not seen before gets 429.
            long = c.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=3000,
                                        temperature=0.8, seed=1, stream=True, extra_body={"cache": False})
            chunks = iter(long)
            next(chunks)
            held = c.chat.completions.with_raw_response.create(**ask)
            assert held.headers["x-kerze-cache"] == "hit" and held.parse().choices[0].message.content == a.choices[0].message.content
            expect(openai.RateLimitError, 429, lambda: c.chat.completions.create(**{**ask, "max_tokens": 5}))
            long.close()
            time.sleep(0.5)
            # Sampled without a seed: never cached (no header); seeded: cached; cache: false: neither.
            sampled = c.chat.completions.with_raw_response.create(model=MODEL_ID, messages=messages, temperature=0.9, max_tokens=4)
            assert "x-kerze-cache" not in sampled.headers
            s1 = c.completions.with_raw_response.create(model=MODEL_ID, prompt="The sea", temperature=0.9, seed=5, max_tokens=6)
            s2 = c.completions.with_raw_response.create(model=MODEL_ID, prompt="The sea", temperature=0.9, seed=5, max_tokens=6)
            assert (s1.headers["x-kerze-cache"], s2.headers["x-kerze-cache"]) == ("miss", "hit")
            assert s1.parse().choices[0].text == s2.parse().choices[0].text
            off = c.chat.completions.with_raw_response.create(**ask, extra_body={"cache": False})
            assert "x-kerze-cache" not in off.headers
            expect(openai.BadRequestError, 400, lambda: c.chat.completions.create(**ask, extra_body={"cache": "no"}))
            rc.terminate()
            assert rc.wait(30) == 0
            # A corrupt entry is a miss (and is removed); a short TTL expires; another model misses.
            for f in os.listdir(d):
                with open(os.path.join(d, f), "w") as fh:
                    fh.write("{not json")
            rc2, rbase2 = start(["--response-cache", d, "--response-cache-ttl", "1"])
            c2 = openai.OpenAI(base_url=f"{rbase2}/v1", api_key="none", max_retries=0)
            r = c2.chat.completions.with_raw_response.create(**ask)
            assert r.headers["x-kerze-cache"] == "miss" and r.parse().choices[0].message.content == a.choices[0].message.content
            assert c2.chat.completions.with_raw_response.create(**ask).headers["x-kerze-cache"] == "hit"
            time.sleep(2.1)
            assert c2.chat.completions.with_raw_response.create(**ask).headers["x-kerze-cache"] == "miss"
            rc2.terminate()
            assert rc2.wait(30) == 0
            g, gbase = start(["--response-cache", d], model=GEMMA)
            gc = openai.OpenAI(base_url=f"{gbase}/v1", api_key="none", max_retries=0)
            gask = {**ask, "model": gc.models.list().data[0].id}
            assert gc.chat.completions.with_raw_response.create(**gask).headers["x-kerze-cache"] == "miss"
            g.terminate()
            assert g.wait(30) == 0
        finally:
            shutil.rmtree(d, ignore_errors=True)

    @test("openai PyPI: server defects — unseeded sampled requests differ, each reports its seed (x-kerze-seed), which replays it, and kerze generate reports one too; a repeated greedy request is served from the default in-memory cache (--response-cache-mb 0: none); a body short of its content-length gets a 408 within --body-timeout")
    def _():
        import socket
        messages = [{"role": "user", "content": "Write one sentence about the sea."}]
        sampled = dict(model=MODEL_ID, messages=messages, temperature=0.9, max_tokens=24)
        runs = [client.chat.completions.with_raw_response.create(**sampled) for _ in range(3)]
        texts = [r.parse().choices[0].message.content for r in runs]
        seeds = [int(r.headers["x-kerze-seed"]) for r in runs]
        assert len(set(texts)) == 3 and len(set(seeds)) == 3, (texts, seeds)
        assert all("x-kerze-cache" not in r.headers for r in runs)
        again = client.chat.completions.with_raw_response.create(**sampled, seed=seeds[1])
        assert again.parse().choices[0].message.content == texts[1] and int(again.headers["x-kerze-seed"]) == seeds[1]
        greedy = client.chat.completions.with_raw_response.create(model=MODEL_ID, messages=messages, temperature=0, max_tokens=8)
        assert "x-kerze-seed" not in greedy.headers
        cli = [json.loads(subprocess.run([KERZE, "generate", "--model", MODEL, "--device", "cpu", "--prompt", "The sea",
                                          "--max-tokens", "12", "--temperature", "0.9", "--json"],
                                         check=True, capture_output=True, text=True).stdout.strip().split("\n")[-1]) for _ in range(2)]
        assert cli[0]["seed"] != cli[1]["seed"] and cli[0]["text"] != cli[1]["text"], cli
        replay = json.loads(subprocess.run([KERZE, "generate", "--model", MODEL, "--device", "cpu", "--prompt", "The sea",
                                            "--max-tokens", "12", "--temperature", "0.9", "--seed", str(cli[0]["seed"]), "--json"],
                                           check=True, capture_output=True, text=True).stdout.strip().split("\n")[-1])
        assert replay["text"] == cli[0]["text"] and replay["seed"] == cli[0]["seed"], (replay, cli[0])
        # The default cache: no flag, in memory; off with --response-cache-mb 0.
        for flags, want in ([], ("miss", "hit")), (["--response-cache-mb", "0"], (None, None)):
            p, b = start(flags)
            c = openai.OpenAI(base_url=f"{b}/v1", api_key="none", max_retries=0)
            ask = dict(model=MODEL_ID, messages=messages, temperature=0, max_tokens=8)
            first, second = (c.chat.completions.with_raw_response.create(**ask) for _ in range(2))
            assert (first.headers.get("x-kerze-cache"), second.headers.get("x-kerze-cache")) == want, (flags, first.headers)
            assert first.parse().choices[0].message.content == second.parse().choices[0].message.content
            p.terminate()
            assert p.wait(30) == 0
        # A body that promises 1000 bytes and sends 10: a 408 with an OpenAI error, in time.
        p, b = start(["--body-timeout", "1"])
        host, port = b.removeprefix("http://").split(":")
        t0 = time.time()
        with socket.create_connection((host, int(port)), timeout=20) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"messages\"")
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                reply += chunk
        took = time.time() - t0
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), reply
        err = json.loads(body)["error"]
        assert err["type"] == "timeout_error" and "body" in err["message"] and 0.9 < took < 5, (err, took)
        assert client.models.list().data[0].id == MODEL_ID
        p.terminate()
        assert p.wait(30) == 0

    @test("openai PyPI: a chat's system prompt is computed once; the next question and a restarted server with --prefix-cache DIR compute only the question (cached_tokens), with the same answer; a damaged file is dropped with a warning")
    def _():
        import shutil
        import tempfile
        d = tempfile.mkdtemp(prefix="kerze-prefixes-")
        system = "You sort support messages into billing, delivery or technical. " + " ".join(
            f"Example {i}: {t}" for i, t in enumerate([
                "I was charged twice this month: billing.", "The parcel has not arrived: delivery.",
                "The app crashes on start: technical.", "Why is there a fee on my invoice: billing.",
                "The courier lost my box: delivery.", "I cannot log in any more: technical.",
                "Refund the second payment: billing.", "Tracking says delivered, nothing came: delivery.",
                "The page is blank after saving: technical.", "My card was declined: billing.",
                "The box arrived wet: delivery.", "Notifications stopped: technical."] * 2))
        try:
            def asker(base):
                c = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
                return lambda q: c.chat.completions.create(
                    model=MODEL_ID, temperature=0, max_tokens=8,
                    messages=[{"role": "system", "content": system}, {"role": "user", "content": q}])
            p, base = start(["--slots", "1", "--prefix-cache", d])
            ask = asker(base)
            a = ask("Where is my parcel?")
            b = ask("My invoice is wrong.")
            assert a.usage.prompt_tokens_details.cached_tokens == 0, a.usage
            shared = b.usage.prompt_tokens_details.cached_tokens
            assert 200 <= shared < b.usage.prompt_tokens, b.usage
            assert [f for f in os.listdir(d) if f.endswith(".kv")], os.listdir(d)
            p.terminate()
            assert p.wait(30) == 0
            # A new process: the prefix comes from the folder.
            p, base = start(["--slots", "1", "--prefix-cache", d])
            again = asker(base)("Where is my parcel?")
            assert again.usage.prompt_tokens_details.cached_tokens == shared, again.usage
            assert again.choices[0].message.content == a.choices[0].message.content
            p.terminate()
            assert p.wait(30) == 0
            for f in os.listdir(d):
                path = os.path.join(d, f)
                data = bytearray(open(path, "rb").read())
                data[len(data) // 2] ^= 1
                open(path, "wb").write(bytes(data))
            p, base = start(["--slots", "1", "--prefix-cache", d])
            ask = asker(base)
            broken = ask("Where is my parcel?")
            assert broken.usage.prompt_tokens_details.cached_tokens == 0, broken.usage
            assert broken.choices[0].message.content == a.choices[0].message.content
            assert any("saved prompt prefix was dropped" in x for x in p.lines), p.lines
            p.terminate()
            assert p.wait(30) == 0
            p, base = start(["--slots", "1", "--prefix-cache", d])
            assert asker(base)("Where is my parcel?").usage.prompt_tokens_details.cached_tokens == shared
            p.terminate()
            assert p.wait(30) == 0
        finally:
            shutil.rmtree(d, ignore_errors=True)

    @test("openai PyPI: response_format json_schema / json_object / regex / choices (with each choice's probability): the answer parses and validates (jsonschema), whole and streamed, finish_reason stop; a bad schema is a 400")
    def _():
        import jsonschema
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                  "age": {"type": "integer", "minimum": 0, "maximum": 120}, "city": {"enum": ["Berlin", "Paris", "Rome"]}},
                  "required": ["name", "age", "city"], "additionalProperties": False}
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}
        messages = [{"role": "user", "content": "Anna is 31 and lives in Paris. Reply with her as JSON."}]
        for extra in [dict(temperature=0), dict(temperature=0.8, seed=1), dict(temperature=0.8, seed=2)]:
            r = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=96, response_format=fmt, **extra)
            text = r.choices[0].message.content
            assert r.choices[0].finish_reason == "stop", (text, r.choices[0].finish_reason)
            jsonschema.validate(json.loads(text), schema)
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=MODEL_ID, messages=messages, max_tokens=96, response_format=fmt, temperature=0, stream=True) if c.choices)
        jsonschema.validate(json.loads(streamed), schema)
        # Any object: whole when it says stop; cut off by max_tokens (not a whole value) when it says length.
        r = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=96, temperature=0,
                                           response_format={"type": "json_object"})
        obj, finish = r.choices[0].message.content, r.choices[0].finish_reason
        if finish == "stop":
            assert isinstance(json.loads(obj), dict), obj
        else:
            assert finish == "length", finish
            try:
                json.loads(obj)
                raise AssertionError(f"length, yet whole: {obj!r}")
            except json.JSONDecodeError:
                pass
        # --prepare-constraints built the token trie before the server said it was ready.
        assert any("constraint engine ready in" in x for x in proc.lines), proc.lines
        date = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "A date?"}], max_tokens=32,
                                              temperature=0, extra_body={"response_format": {"type": "regex", "regex": "[0-9]{4}-[0-9]{2}-[0-9]{2}"}}).choices[0].message.content
        assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", date), date
        # Choices: picked by likelihood, each one's probability beside the answer (whole and on the finish chunk).
        options = ["billing", "delivery", "technical"]
        ask = [{"role": "user", "content": "My parcel has not arrived. Is this about billing, delivery or technical?"}]
        fmt = {"response_format": {"type": "choices", "choices": options}}
        r = client.chat.completions.create(model=MODEL_ID, messages=ask, max_tokens=8, temperature=0, extra_body=fmt)
        scores = r.choices[0].model_extra["choice_scores"]
        assert [x["choice"] for x in scores] == options and abs(sum(x["prob"] for x in scores) - 1) < 1e-6, scores
        assert r.choices[0].message.content == max(scores, key=lambda x: x["prob"])["choice"], (r, scores)
        last = [c for c in client.chat.completions.create(model=MODEL_ID, messages=ask, max_tokens=8, temperature=0, stream=True,
                                                            extra_body=fmt) if c.choices][-1]
        assert last.choices[0].finish_reason == "stop" and last.choices[0].model_extra["choice_scores"] == scores, last
        t = client.completions.create(model=MODEL_ID, prompt="The capital of France is", max_tokens=8, temperature=0,
                                      extra_body={"response_format": {"type": "choices", "choices": [" Berlin", " Paris", " Rome"]}})
        assert t.choices[0].text == " Paris" and len(t.choices[0].model_extra["choice_scores"]) == 3, t
        bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strin"}}}}}
        expect(openai.BadRequestError, 400, lambda: client.chat.completions.create(model=MODEL_ID, messages=messages, response_format=bad))

    @test("openai PyPI: tools — required, a named function, auto; whole and streamed (name only in the first delta); arguments validate (jsonschema); the result goes back as a tool message; bad tools are a 400")
    def _():
        import jsonschema
        weather = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}
        tools = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                                   "parameters": weather, "strict": True}},
                 {"type": "function", "function": {"name": "local_time", "description": "The time here"}}]
        schemas = {"get_weather": dict(weather, additionalProperties=False),
                   "local_time": {"type": "object", "properties": {}, "additionalProperties": False}}
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        whole = None
        for choice, parallel, extra in [("required", False, dict(temperature=0)),
                                        ("required", False, dict(temperature=0.8, seed=3)),
                                        ({"type": "function", "function": {"name": "get_weather"}}, True, dict(temperature=0)),
                                        ("required", True, dict(temperature=0.8, seed=5))]:
            r = client.chat.completions.create(model=MODEL_ID, messages=messages, tools=tools, tool_choice=choice,
                                               parallel_tool_calls=parallel, max_tokens=160, **extra)
            ch = r.choices[0]
            calls = ch.message.tool_calls
            assert calls, ch
            if ch.finish_reason == "length":
                continue  # cut short: the last call's arguments may be partial
            assert ch.finish_reason == "tool_calls", ch
            assert ch.message.content is None, ch.message
            assert not parallel or choice == "required" or all(c.function.name == "get_weather" for c in calls), calls
            for c in calls:
                assert c.type == "function" and c.id.startswith("call_"), c
                jsonschema.validate(json.loads(c.function.arguments), schemas[c.function.name])
            if choice == "required" and not parallel and extra.get("temperature") == 0:
                assert len(calls) == 1, calls
                whole = r
        assert whole is not None
        # Streamed: the same call; id, type and name only in its first delta.
        deltas = [c.choices[0].delta for c in client.chat.completions.create(
            model=MODEL_ID, messages=messages, tools=tools, tool_choice="required", parallel_tool_calls=False,
            max_tokens=160, temperature=0, stream=True) if c.choices]
        parts = [d.tool_calls[0] for d in deltas if d.tool_calls]
        name = parts[0].function.name
        assert parts[0].id and name in schemas and parts[0].type == "function", parts[0]
        assert all(p.id is None and p.function.name is None for p in parts[1:]), parts[1:]
        jsonschema.validate(json.loads("".join(p.function.arguments or "" for p in parts)), schemas[name])
        assert not any(d.content for d in deltas), deltas
        # auto: text or whole calls, never a broken call.
        r = client.chat.completions.create(model=MODEL_ID, messages=messages, tools=tools, max_tokens=96, temperature=0)
        m = r.choices[0].message
        if m.tool_calls:
            assert r.choices[0].finish_reason in ("tool_calls", "length"), r
        else:
            assert "<tool_call>" not in (m.content or ""), m
        # The call and its result go back; the model answers in text (tool_choice none).
        call = whole.choices[0].message.tool_calls[0]
        follow = messages + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                             {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}]
        r = client.chat.completions.create(model=MODEL_ID, messages=follow, tools=tools, tool_choice="none",
                                           max_tokens=48, temperature=0)
        assert r.choices[0].message.tool_calls is None and r.choices[0].message.content, r
        assert r.choices[0].finish_reason in ("stop", "length"), r
        bad = [{"type": "function", "function": {"name": "get weather"}}]
        expect(openai.BadRequestError, 400, lambda: client.chat.completions.create(model=MODEL_ID, messages=messages, tools=bad))
        expect(openai.BadRequestError, 400, lambda: client.chat.completions.create(
            model=MODEL_ID, messages=messages, tools=tools, tool_choice={"type": "function", "function": {"name": "nope"}}))

    proc.terminate()
    code = proc.wait(30)
    if code != 0:
        harness.fail(f"the server exited with {code} on SIGTERM")
finally:
    stop_all()

print(f"\ntest_openai.py: {'all passed' if harness.failures == 0 else f'{harness.failures} failed'}")
sys.exit(1 if harness.failures else 0)
