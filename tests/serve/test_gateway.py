"""`kerze serve` as the team's gateway, against the official PyPI `openai` client (`make
test-serve` runs it). Everything listens on 127.0.0.1; mock upstreams are Python HTTP servers
here, the OpenAI-compatible one is a second `kerze serve`.

Checked: the config file (flags, upstream tables, the errors that stop the process); an
upstream kerze answers through the gateway exactly as when called directly; overflow
(`--slots 1 --queue 0`, 8 concurrent: every one 200, both routes); a prompt past the local
context; a local answer that fails midway continued upstream; token-command refresh with
2-second tokens; bad credentials; an upstream down (local service unaffected), the breaker
opening and closing; the rate limit and the token budget; an upstream's 5xx, bad JSON, 429
with Retry-After, broken stream and timeout as typed errors; a client that disconnects
cancels the upstream request; upstream answers in the response cache; /metrics counts.
"""

import binascii
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.eventstream import EventStreamBuffer

import harness
from harness import MODEL_ID, expect, refused, start, stop, stop_all, test

TMP = tempfile.mkdtemp(prefix="kerze-gateway-")


def config(name, text):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def metrics(base):
    """/metrics as {(name, frozenset(labels)): value}."""
    with urllib.request.urlopen(f"{base}/metrics") as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        if "{" in head:
            name, labels = head.split("{", 1)
            labels = frozenset(tuple(kv.split("=", 1)) for kv in labels.rstrip("}").split(",") if kv)
            labels = frozenset((k, v.strip('"')) for k, v in labels)
        else:
            name, labels = head, frozenset()
        out[(name, labels)] = float(value)
    return out


def metric(m, name, **labels):
    return m.get((name, frozenset(labels.items())), 0.0)


class JsonHandler(BaseHTTPRequestHandler):
    """What the mocks' handlers share: HTTP/1.1, quiet, a JSON reply, a stream's head."""
    protocol_version = "HTTP/1.1"
    mock = None

    def log_message(self, *a):
        pass

    def reply(self, status, obj, headers=()):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.mock.cancelled.set()  # the gateway gave up on it (its timeout)

    def stream_head(self, content_type):
        self.send_response(200)
        self.send_header("content-type", content_type)
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True


class Loopback:
    """A mock server on 127.0.0.1 (port 0: any free one), its handler bound to this mock."""

    def serve(self, handler, port=0):
        self.cancelled = threading.Event()
        handler.mock = self
        self.server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Mock(Loopback):
    """An OpenAI-compatible upstream that does what `mode` says: ok, 500, badjson, 429, broken
    (a stream cut off before [DONE]), slow (3 s before answering), slowstream (a chunk every
    0.2 s for 10 s; a write that fails sets `cancelled`). `check` vets the Authorization
    header (None: any). Its answers use 5 prompt and 3 completion tokens."""

    def __init__(self, port=0):
        self.mode = "ok"
        self.token = None  # a token endpoint: (form body) -> (status, JSON)
        self.check = None
        self.hits = 0
        self.bodies = []
        mock = self

        class Handler(JsonHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers["content-length"]))
                if self.path == "/token":
                    return self.reply(*mock.token(raw))
                body = json.loads(raw)
                mock.hits += 1
                mock.bodies.append(body)
                if mock.check and not mock.check(self.headers.get("authorization", "")):
                    return self.reply(401, {"error": {"message": "bad token", "type": "authentication_error"}})
                mode = mock.mode
                if mode == "500":
                    return self.reply(500, {"error": {"message": "mock is broken"}})
                if mode == "badjson":
                    data = b"<html>not json</html>"
                    self.send_response(200)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    return self.wfile.write(data)
                if mode == "429":
                    return self.reply(429, {"error": {"message": "slow down"}}, [("retry-after", "2")])
                if mode == "slow":
                    time.sleep(3)
                words = ["Hallo", " from", " upstream"]
                if not body.get("stream"):
                    return self.reply(200, {
                        "id": "mock-1", "object": "chat.completion", "created": 1, "model": body.get("model"),
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(words)},
                                     "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})
                self.stream_head("text/event-stream")

                def chunk(delta, finish=None):
                    return {"id": "mock-1", "object": "chat.completion.chunk", "created": 1, "model": body.get("model"),
                            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

                def send(obj):
                    self.wfile.write(f"data: {json.dumps(obj) if obj != '[DONE]' else obj}\n\n".encode())
                    self.wfile.flush()
                try:
                    if mode == "slowstream":
                        for _ in range(50):
                            send(chunk({"content": "."}))
                            time.sleep(0.2)
                    send(chunk({"role": "assistant", "content": ""}))
                    for w in words[: 2 if mode == "broken" else 3]:
                        send(chunk({"content": w}))
                    if mode == "broken":
                        self.close_connection = True
                        return
                    send(chunk({}, "stop"))
                    if (body.get("stream_options") or {}).get("include_usage"):
                        send({"id": "mock-1", "object": "chat.completion.chunk", "created": 1, "choices": [],
                              "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})
                    send("[DONE]")
                except (BrokenPipeError, ConnectionResetError):
                    mock.cancelled.set()

        self.url = self.serve(Handler, port) + "/v1"


def es_message(headers, payload):
    """One AWS event-stream message (string headers), as the AWS runtimes frame them."""
    hb = b""
    for k, v in headers.items():
        kb, vb = k.encode(), v.encode()
        hb += struct.pack("B", len(kb)) + kb + b"\x07" + struct.pack(">H", len(vb)) + vb
    prelude = struct.pack(">II", 12 + len(hb) + len(payload) + 4, len(hb))
    msg = prelude + struct.pack(">I", binascii.crc32(prelude)) + hb + payload
    return msg + struct.pack(">I", binascii.crc32(msg))


class AwsMock(Loopback):
    """SageMaker runtime and Bedrock runtime on loopback. Every request's SigV4 signature is
    checked with botocore's signer (an implementation independent of the gateway's) against
    `creds`, its scope against `region`; a wrong key, signature or session token gets AWS's
    403 with `x-amzn-ErrorType`. `bearer` (when set) is a Bedrock API key taken instead."""

    def __init__(self, creds, region):
        self.creds, self.region, self.bearer = creds, region, None
        self.bodies, self.paths = [], []
        mock = self

        class Handler(JsonHandler):
            def refuse(self, kind, message):
                self.reply(403, {"message": message}, [("x-amzn-ErrorType", f"{kind}:http://internal")])

            def check(self, body, service):
                auth = self.headers.get("authorization", "")
                if mock.bearer and auth == f"Bearer {mock.bearer}":
                    return True
                m = re.match(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
                             r"SignedHeaders=([^,]+), Signature=([0-9a-f]{64})$", auth)
                if not m:
                    return self.refuse("MissingAuthenticationTokenException", f"not SigV4: {auth[:40]!r}")
                key, _, region, svc, signed, signature = m.groups()
                if key != mock.creds.access_key:
                    return self.refuse("UnrecognizedClientException", "The security token included in the request is invalid.")
                if (region, svc) != (mock.region, service):
                    return self.refuse("InvalidSignatureException", f"scope {region}/{svc}")
                if mock.creds.token and self.headers.get("x-amz-security-token") != mock.creds.token:
                    return self.refuse("ExpiredTokenException", "The security token included in the request is expired")
                req = AWSRequest(method="POST", url=f"http://{self.headers['host']}{self.path}", data=body,
                                 headers={h: self.headers[h] for h in signed.split(";")})
                req.context["timestamp"] = self.headers["x-amz-date"]
                signer = SigV4Auth(mock.creds, svc, region)
                want = signer.signature(signer.string_to_sign(req, signer.canonical_request(req)), req)
                if want != signature:
                    return self.refuse("InvalidSignatureException", "The request signature we calculated does not match")
                return True

            def stream(self, messages):
                self.stream_head("application/vnd.amazon.eventstream")
                for m in messages:
                    self.wfile.write(m)
                    self.wfile.flush()

            def do_POST(self):
                raw = self.rfile.read(int(self.headers["content-length"]))
                body = json.loads(raw)
                mock.bodies.append(body)
                mock.paths.append(self.path)
                if self.path.startswith("/endpoints/"):
                    if self.check(raw, "sagemaker") is not True:
                        return
                    if self.path.endswith("/invocations"):
                        return self.reply(200, {
                            "id": "sm-1", "object": "chat.completion", "created": 1, "model": "lmi",
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Guten Tag aus SageMaker"},
                                         "finish_reason": "stop"}],
                            "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}})
                    text = ""
                    for w in ["Guten", " Tag", " aus", " SageMaker"]:
                        text += "data: " + json.dumps({"id": "sm-1", "object": "chat.completion.chunk", "created": 1,
                                                       "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]}) + "\n\n"
                    text += "data: [DONE]\n\n"
                    # The container's stream in PayloadParts that cut lines anywhere.
                    data = text.encode()
                    cuts = list(range(0, len(data), 37)) + [len(data)]
                    return self.stream([es_message({":message-type": "event", ":event-type": "PayloadPart",
                                                    ":content-type": "application/octet-stream"}, data[a:b])
                                        for a, b in zip(cuts, cuts[1:])])
                if self.path.startswith("/model/"):
                    if self.check(raw, "bedrock") is not True:
                        return
                    if self.path.endswith("/converse"):
                        return self.reply(200, {
                            "output": {"message": {"role": "assistant", "content": [{"text": "Grüezi aus Bedrock"}]}},
                            "stopReason": "end_turn",
                            "usage": {"inputTokens": 9, "outputTokens": 5, "totalTokens": 14},
                            "metrics": {"latencyMs": 10}})

                    def ev(kind, payload):
                        return es_message({":message-type": "event", ":event-type": kind, ":content-type": "application/json"},
                                          json.dumps(payload).encode())
                    return self.stream([ev("messageStart", {"role": "assistant"})] +
                                       [ev("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": w}})
                                        for w in ["Grüezi", " aus", " Bedrock"]] +
                                       [ev("contentBlockStop", {"contentBlockIndex": 0}),
                                        ev("messageStop", {"stopReason": "end_turn"}),
                                        ev("metadata", {"usage": {"inputTokens": 9, "outputTokens": 5, "totalTokens": 14},
                                                        "metrics": {"latencyMs": 10}})])
                self.reply(404, {"message": f"no route {self.path}"})

        self.url = self.serve(Handler)


def gateway(name, upstream_tables, flags="", args=(), env=None):
    path = config(name, f"{flags}\n{upstream_tables}")
    return start(["--config", path, *args], env=env)


def client(base, retries=0):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=retries)


HI = [{"role": "user", "content": "Hi"}]
mocks = []

try:
    peer, peer_base = start(["--slots", "2", "--queue", "16"])
    direct = client(peer_base)

    @test("gateway config: flags from the file (the command line wins), and what stops the process at start")
    def _():
        path = config("flags.toml", 'queue = 3\nslots = 1\nresponse_cache_mb = 0\ncors_origin = ["https://a.example"]\n')
        p, base = start(["--config", path, "--queue", "5"])
        _, h = harness.health(base)
        assert (h["slots"], h["queue"]) == (1, 5), h
        stop(p)
        bad = config("bad-key.toml", "# a comment\nslots = 1\nslotz = 2\n")
        code, err = refused(["--config", bad])
        assert code == 2 and "line 3" in err and "unknown key `slotz`" in err and "response_cache_mb" in err, err
        assert bad in err, err
        bad = config("bad-upstream.toml", '[[upstream]]\nname = "x"\nkind = "openai"\nurl = "http://127.0.0.1:9/v1"\nurll = "y"\n')
        code, err = refused(["--config", bad])
        assert code == 2 and "line 5" in err and "unknown field `urll`" in err and "api_key_env" in err, err
        bad = config("no-env.toml", '[[upstream]]\nname = "x"\nkind = "openai"\nurl = "http://127.0.0.1:9/v1"\napi_key_env = "KERZE_TEST_NOT_SET"\n')
        code, err = refused(["--config", bad])
        assert code == 2 and "KERZE_TEST_NOT_SET" in err and "not set" in err, err
        code, err = refused(["--config", config("secret.toml", 'api_key = "sk-1"\n')])
        assert code == 2 and "secret" in err, err
        code, err = refused(["--config", config("kind.toml", '[[upstream]]\nname = "x"\nkind = "grpc"\n')])
        assert code == 2 and "line 3" in err and "kind" in err, err
        code, err = refused(["--config", config("type.toml", 'slots = "two"\n')])
        assert code == 2 and "slots" in err, err
        code, err = refused(["--config", os.path.join(TMP, "missing.toml")])
        assert code == 2 and "cannot be read" in err, err

    @test("gateway: a second kerze serve answers through it exactly as when called directly; /v1/models lists both")
    def _():
        p, base = gateway("peer.toml", f'''
[[upstream]]
name = "peer"
kind = "openai"
url = "{peer_base}/v1"
serves = ["remote-smol"]
model = "{MODEL_ID}"
when = ["model"]
''', "response_cache_mb = 0")
        gw = client(base)
        models = {m.id: m.owned_by for m in gw.models.list().data}
        assert models == {MODEL_ID: "kerze", "remote-smol": "upstream:peer"}, models
        assert gw.models.retrieve("remote-smol").owned_by == "upstream:peer"
        for kw in [dict(temperature=0), dict(temperature=0.9, seed=7)]:
            want = direct.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=24, **kw)
            raw = gw.chat.completions.with_raw_response.create(model="remote-smol", messages=HI, max_tokens=24, **kw)
            got = raw.parse()
            assert raw.headers["x-kerze-route"] == "upstream:peer", raw.headers
            assert got.model_extra["kerze"] == {"route": "upstream:peer", "reason": "model"}, got.model_extra
            assert got.choices[0].message.content == want.choices[0].message.content, (got, want)
            assert got.usage.prompt_tokens == want.usage.prompt_tokens
            assert got.usage.completion_tokens == want.usage.completion_tokens
        chunks = list(gw.chat.completions.create(model="remote-smol", messages=HI, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
        assert chunks[0].model_extra["kerze"]["route"] == "upstream:peer", chunks[0]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        want = direct.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=24, temperature=0)
        assert text == want.choices[0].message.content, text
        assert chunks[-1].usage.completion_tokens == want.usage.completion_tokens, chunks[-1]
        # Without include_usage the client gets no usage chunk (the gateway asked for it).
        chunks = list(gw.chat.completions.create(model="remote-smol", messages=HI, max_tokens=8, temperature=0, stream=True))
        assert all(c.choices for c in chunks), chunks[-1]
        r = gw.completions.create(model="remote-smol", prompt="Once upon a time", max_tokens=12, temperature=0)
        w = direct.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=12, temperature=0)
        assert r.choices[0].text == w.choices[0].text, (r, w)
        local = gw.chat.completions.with_raw_response.create(model=MODEL_ID, messages=HI, max_tokens=8, temperature=0)
        assert local.headers["x-kerze-route"] == "local" and local.parse().model_extra["kerze"]["route"] == "local"
        stop(p)

    @test("gateway overflow: --slots 1 --queue 0 and 8 concurrent requests: every one 200, both routes")
    def _():
        p, base = gateway("busy.toml", f'''
[[upstream]]
name = "peer"
kind = "openai"
url = "{peer_base}/v1"
when = ["busy"]
''', "response_cache_mb = 0", ["--slots", "1", "--queue", "0"])
        gw = client(base)
        routes, errors = [], []

        def one(i):
            try:
                r = gw.chat.completions.with_raw_response.create(
                    model=MODEL_ID, messages=[{"role": "user", "content": f"Count to {i + 3}."}], max_tokens=24, temperature=0)
                routes.append((r.headers["x-kerze-route"], r.parse().model_extra["kerze"]["reason"]))
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert not errors, errors
        assert len(routes) == 8 and {r for r, _ in routes} == {"local", "upstream:peer"}, routes
        assert all(reason == ("busy" if r != "local" else "local") for r, reason in routes), routes
        m = metrics(base)
        assert metric(m, "kerze_requests_total", route="upstream:peer", reason="busy") == sum(r != "local" for r, _ in routes)
        stop(p)

    @test("gateway context: a prompt past the local context goes upstream; a local failure midway is continued there")
    def _():
        p, base = gateway("context.toml", f'''
[[upstream]]
name = "peer"
kind = "openai"
url = "{peer_base}/v1"
when = ["context"]
''', "response_cache_mb = 0\nn_ctx = 64")
        long = [{"role": "user", "content": "Summarise: " + "the cat sat on the mat. " * 40}]
        r = client(base).chat.completions.with_raw_response.create(model=MODEL_ID, messages=long, max_tokens=8, temperature=0)
        assert r.headers["x-kerze-route"] == "upstream:peer" and r.parse().model_extra["kerze"]["reason"] == "context"
        stop(p)
        # Every local generation fails after 3 pieces: the upstream (the same model) continues
        # the text so far, so the answer is the one the model gives whole.
        p, base = gateway("error.toml", f'''
[[upstream]]
name = "peer"
kind = "openai"
url = "{peer_base}/v1"
when = ["error"]
''', "response_cache_mb = 0", env={"KERZE_TEST_FAIL_AFTER": "3"})
        gw = client(base)
        ask = [{"role": "user", "content": "What is the capital of France?"}]
        want = direct.chat.completions.create(model=MODEL_ID, messages=ask, max_tokens=64, temperature=0)
        assert want.choices[0].finish_reason == "stop", want
        chunks = list(gw.chat.completions.create(model=MODEL_ID, messages=ask, max_tokens=64, temperature=0, stream=True))
        tags = [(i, c.model_extra["kerze"]) for i, c in enumerate(chunks) if "kerze" in c.model_extra]
        assert tags[0] == (0, {"route": "local", "reason": "local"}), tags
        assert len(tags) == 2 and tags[1][1] == {"route": "upstream:peer", "reason": "error"}, tags
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == want.choices[0].message.content, (text, want.choices[0].message.content)
        r = gw.chat.completions.with_raw_response.create(model=MODEL_ID, messages=ask, max_tokens=64, temperature=0)
        assert r.headers["x-kerze-route"] == "upstream:peer", r.headers
        assert r.parse().choices[0].message.content == want.choices[0].message.content
        stop(p)

    @test("gateway token command: 2-second tokens, refreshed before they expire; the mock refuses expired ones")
    def _():
        mock = Mock()
        mocks.append(mock)
        mock.check = lambda h: h.startswith("Bearer t-") and time.time() - float(h[len("Bearer t-"):]) < 2.0
        count = os.path.join(TMP, "token-count")
        cmd = config("token.py", f'''import json, time
with open({count!r}, "a") as f:
    f.write("x")
print(json.dumps({{"access_token": "t-%.3f" % time.time(), "expires_in": 2, "token_type": "Bearer"}}))
''')
        p, base = gateway("token.toml", f'''
[[upstream]]
name = "vertex"
kind = "openai"
url = "{mock.url}"
serves = ["gemini"]
token_command = ["{sys.executable}", "{cmd}"]
''', "response_cache_mb = 0")
        gw = client(base)
        for _ in range(6):
            r = gw.chat.completions.create(model="gemini", messages=HI)
            assert r.choices[0].message.content == "Hallo from upstream", r
            time.sleep(0.7)
        runs = len(open(count).read())
        assert 2 <= runs <= 6, runs
        stale = urllib.request.Request(f"{mock.url}/chat/completions", data=b"{}", method="POST",
                                       headers={"authorization": f"Bearer t-{time.time() - 3:.3f}", "content-type": "application/json"})
        try:
            urllib.request.urlopen(stale)
            raise AssertionError("the mock took an expired token")
        except urllib.error.HTTPError as e:
            assert e.code == 401
        stop(p)

    @test("gateway service account: its OAuth token (a JWT assertion checked with PyJWT against the public key), refreshed before it expires")
    def _():
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        import jwt
        import urllib.parse
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        mock = Mock()
        mocks.append(mock)
        token_uri = mock.url[: -len("/v1")] + "/token"
        issued = {}

        def token(raw):
            form = urllib.parse.parse_qs(raw.decode())
            if form.get("grant_type") != ["urn:ietf:params:oauth:grant-type:jwt-bearer"]:
                return 400, {"error": "unsupported_grant_type"}
            try:
                claims = jwt.decode(form["assertion"][0], key.public_key(), algorithms=["RS256"], audience=token_uri)
            except jwt.PyJWTError as e:
                return 400, {"error": "invalid_grant", "error_description": str(e)}
            assert claims["iss"] == "gateway@my-project.iam.gserviceaccount.com", claims
            assert claims["scope"] == "https://www.googleapis.com/auth/cloud-platform" and claims["exp"] - claims["iat"] == 3600
            t = f"sa-{len(issued)}"
            issued[t] = time.time()
            return 200, {"access_token": t, "expires_in": 2, "token_type": "Bearer"}
        mock.token = token
        mock.check = lambda h: h.startswith("Bearer ") and time.time() - issued.get(h[7:], 0) < 2.0
        keyfile = config("sa.json", json.dumps({"type": "service_account", "project_id": "my-project",
                                               "private_key_id": "k1", "private_key": pem,
                                               "client_email": "gateway@my-project.iam.gserviceaccount.com",
                                               "token_uri": token_uri}))
        p, base = gateway("sa.toml", f"""
[[upstream]]
name = "vertex"
kind = "openai"
url = "{mock.url}"
serves = ["gemini"]
service_account_file = "{keyfile}"
""", "response_cache_mb = 0")
        gw = client(base)
        for _ in range(5):
            assert gw.chat.completions.create(model="gemini", messages=HI).choices[0].message.content == "Hallo from upstream"
            time.sleep(0.7)
        assert 2 <= len(issued) <= 5, issued
        stop(p)
        other = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
        wrong = config("sa-wrong.json", json.dumps({"type": "service_account", "private_key": other,
                                                   "client_email": "gateway@my-project.iam.gserviceaccount.com",
                                                   "token_uri": token_uri}))
        p, base = gateway("sa-wrong.toml", f"""
[[upstream]]
name = "vertex"
kind = "openai"
url = "{mock.url}"
serves = ["gemini"]
service_account_file = "{wrong}"
""", "response_cache_mb = 0")
        e = expect(openai.APIStatusError, 502, lambda: client(base).chat.completions.create(model="gemini", messages=HI))
        assert "invalid_grant" in e.body["message"] and e.body["type"] == "upstream_error", e.body
        stop(p)
        code, err = refused(["--config", config("sa-bad.toml", f"""
[[upstream]]
name = "vertex"
kind = "openai"
url = "{mock.url}"
service_account_file = "{os.path.join(TMP, 'missing.json')}"
""")])
        assert code == 2 and "cannot be read" in err, err

    @test("gateway credentials: a wrong key is a typed 502 naming the upstream; the right one answers whole and streamed")
    def _():
        mock = Mock()
        mocks.append(mock)
        mock.check = lambda h: h == "Bearer right-key"
        table = f'''
[[upstream]]
name = "azure"
kind = "openai"
url = "{mock.url}"
serves = ["gpt-4o-mini"]
api_key_env = "KERZE_TEST_UPSTREAM_KEY"
'''
        p, base = gateway("wrong.toml", table, "response_cache_mb = 0", env={"KERZE_TEST_UPSTREAM_KEY": "wrong-key"})
        e = expect(openai.APIStatusError, 502, lambda: client(base).chat.completions.create(model="gpt-4o-mini", messages=HI))
        assert e.body["type"] == "upstream_error" and "azure" in e.body["message"], e.body
        stop(p)
        p, base = gateway("right.toml", table, "response_cache_mb = 0", env={"KERZE_TEST_UPSTREAM_KEY": "right-key"})
        gw = client(base)
        assert gw.chat.completions.create(model="gpt-4o-mini", messages=HI).choices[0].message.content == "Hallo from upstream"
        text = "".join(c.choices[0].delta.content or "" for c in gw.chat.completions.create(
            model="gpt-4o-mini", messages=HI, stream=True) if c.choices)
        assert text == "Hallo from upstream", text
        assert mock.bodies[-1]["model"] == "gpt-4o-mini" and "cache" not in mock.bodies[-1], mock.bodies[-1]
        stop(p)

    @test("gateway breaker: an upstream down leaves the local model serving; the breaker opens, then closes")
    def _():
        port = free_port()
        p, base = gateway("down.toml", f'''
[[upstream]]
name = "down"
kind = "openai"
url = "http://127.0.0.1:{port}/v1"
serves = ["big"]
breaker_failures = 2
breaker_cooldown_s = 1.5
''', "response_cache_mb = 0")
        gw = client(base)
        for _ in range(2):
            e = expect(openai.APIStatusError, 502, lambda: gw.chat.completions.create(model="big", messages=HI))
            assert "cannot be reached" in e.body["message"], e.body
        e = expect(openai.APIStatusError, 503, lambda: gw.chat.completions.create(model="big", messages=HI))
        assert "breaker" in e.body["message"] and e.response.headers.get("retry-after"), e.body
        assert metric(metrics(base), "kerze_upstream_breaker_open", upstream="down") == 1
        r = gw.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=8)
        assert r.model_extra["kerze"]["route"] == "local"
        mock = Mock(port)
        mocks.append(mock)
        time.sleep(1.6)
        assert gw.chat.completions.create(model="big", messages=HI).choices[0].message.content == "Hallo from upstream"
        m = metrics(base)
        assert metric(m, "kerze_upstream_breaker_open", upstream="down") == 0
        assert metric(m, "kerze_upstream_errors_total", upstream="down", kind="unreachable") == 2
        assert metric(m, "kerze_upstream_errors_total", upstream="down", kind="breaker") == 1
        stop(p)

    @test("gateway limits: requests a minute and the token budget give their 429s")
    def _():
        mock = Mock()
        mocks.append(mock)
        p, base = gateway("limits.toml", f'''
[[upstream]]
name = "rpm"
kind = "openai"
url = "{mock.url}"
serves = ["a"]
requests_per_minute = 2

[[upstream]]
name = "budget"
kind = "openai"
url = "{mock.url}"
serves = ["b"]
tokens_per_day = 10
''', "response_cache_mb = 0")
        gw = client(base)
        for _ in range(2):
            gw.chat.completions.create(model="a", messages=HI)
        e = expect(openai.RateLimitError, 429, lambda: gw.chat.completions.create(model="a", messages=HI))
        assert "a minute" in e.body["message"] and e.body["type"] == "rate_limit_error", e.body
        assert 0 < int(e.response.headers["retry-after"]) <= 60
        for _ in range(2):  # 8 tokens each: the second starts under the budget
            gw.chat.completions.create(model="b", messages=HI)
        e = expect(openai.RateLimitError, 429, lambda: gw.chat.completions.create(model="b", messages=HI))
        assert "budget of 10 tokens" in e.body["message"], e.body
        stop(p)

    @test("gateway failures: 5xx, bad JSON, 429 with Retry-After, a broken stream and a timeout are typed errors")
    def _():
        mock = Mock()
        mocks.append(mock)
        p, base = gateway("fail.toml", f'''
[[upstream]]
name = "flaky"
kind = "openai"
url = "{mock.url}"
serves = ["f"]
timeout_s = 1
breaker_failures = 0
''', "response_cache_mb = 0")
        gw = client(base)
        for mode, status, words in [("500", 502, "failed (500)"), ("badjson", 502, "not a completion"),
                                    ("slow", 504, "timeout")]:
            mock.mode = mode
            e = expect(openai.APIStatusError, status, lambda: gw.chat.completions.create(model="f", messages=HI))
            assert words in e.body["message"] and "flaky" in e.body["message"], (mode, e.body)
            assert e.body["type"] == "upstream_error", e.body
        mock.mode = "broken"
        try:
            list(gw.chat.completions.create(model="f", messages=HI, stream=True))
            raise AssertionError("a broken stream ended quietly")
        except openai.APIError as e:
            assert "before [DONE]" in str(e), e
        mock.mode = "429"
        e = expect(openai.RateLimitError, 429, lambda: gw.chat.completions.create(model="f", messages=HI))
        assert e.response.headers["retry-after"] == "2", e.response.headers
        hits = mock.hits
        mock.mode = "ok"
        expect(openai.RateLimitError, 429, lambda: gw.chat.completions.create(model="f", messages=HI))
        assert mock.hits == hits, "the gateway honours the upstream's Retry-After"
        time.sleep(2.1)
        assert gw.chat.completions.create(model="f", messages=HI).choices[0].message.content == "Hallo from upstream"
        stop(p)

    @test("gateway: a client that disconnects cancels the upstream request")
    def _():
        mock = Mock()
        mocks.append(mock)
        mock.mode = "slowstream"
        p, base = gateway("cancel.toml", f'''
[[upstream]]
name = "slow"
kind = "openai"
url = "{mock.url}"
serves = ["s"]
''', "response_cache_mb = 0")
        req = urllib.request.Request(f"{base}/v1/chat/completions", method="POST",
                                     data=json.dumps({"model": "s", "messages": HI, "stream": True}).encode(),
                                     headers={"content-type": "application/json"})
        r = urllib.request.urlopen(req)
        assert r.readline().startswith(b"data:")
        r.close()
        assert mock.cancelled.wait(5), "the upstream kept streaming to a gateway whose client left"
        # A whole answer: the client leaves while the upstream (3 s) is still at it.
        mock.cancelled.clear()
        mock.mode = "slow"
        body = json.dumps({"model": "s", "messages": HI}).encode()
        sock = socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     + f"content-length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(0.5)
        sock.close()
        assert mock.cancelled.wait(6), "the gateway kept waiting for an answer whose client left"
        stop(p)

    AWS = {"AWS_ACCESS_KEY_ID": "AKIDKERZETEST", "AWS_SECRET_ACCESS_KEY": "kerze/secret+key", "AWS_SESSION_TOKEN": "session-1",
           "AWS_REGION": "", "AWS_DEFAULT_REGION": "", "AWS_PROFILE": "",
           "AWS_SHARED_CREDENTIALS_FILE": os.path.join(TMP, "none"), "AWS_CONFIG_FILE": os.path.join(TMP, "none")}

    @test("gateway event-stream frames (the mocks' encoder) read back with botocore's parser")
    def _():
        buf = EventStreamBuffer()
        buf.add_data(es_message({":message-type": "event", ":event-type": "PayloadPart"}, b"data: x\n\n") * 2)
        got = [(m.headers[":event-type"], m.payload) for m in buf]
        assert got == [("PayloadPart", b"data: x\n\n")] * 2, got

    @test("gateway sagemaker: SigV4 checked by botocore, whole and streamed (PayloadParts that cut lines); wrong or expired credentials are typed errors; a shared file's profile")
    def _():
        aws = AwsMock(Credentials("AKIDKERZETEST", "kerze/secret+key", "session-1"), "eu-central-1")
        mocks.append(aws)
        table = f"""
[[upstream]]
name = "sm"
kind = "sagemaker"
url = "{aws.url}"
region = "eu-central-1"
endpoint = "lmi-llama-8b"
serves = ["llama-8b"]
"""
        p, base = gateway("sm.toml", table, "response_cache_mb = 0", env=AWS)
        gw = client(base)
        r = gw.chat.completions.create(model="llama-8b", messages=HI, max_tokens=20, temperature=0.3)
        assert r.choices[0].message.content == "Guten Tag aus SageMaker" and r.model_extra["kerze"]["route"] == "upstream:sm", r
        assert aws.paths[-1] == "/endpoints/lmi-llama-8b/invocations", aws.paths
        assert aws.bodies[-1]["messages"] == HI and aws.bodies[-1]["max_tokens"] == 20, aws.bodies[-1]
        chunks = list(gw.chat.completions.create(model="llama-8b", messages=HI, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Guten Tag aus SageMaker"
        assert aws.paths[-1] == "/endpoints/lmi-llama-8b/invocations-response-stream" and aws.bodies[-1]["stream"] is True
        e = expect(openai.BadRequestError, 400, lambda: gw.completions.create(model="llama-8b", prompt="x"))
        assert "chat completions only" in e.body["message"], e.body
        stop(p)
        for env, kind in [({"AWS_SECRET_ACCESS_KEY": "wrong"}, "InvalidSignatureException"),
                          ({"AWS_SESSION_TOKEN": "session-0"}, "ExpiredTokenException"),
                          ({"AWS_ACCESS_KEY_ID": "AKIDOTHER"}, "UnrecognizedClientException")]:
            p, base = gateway("sm.toml", table, "response_cache_mb = 0", env={**AWS, **env})
            e = expect(openai.APIStatusError, 502, lambda: client(base).chat.completions.create(model="llama-8b", messages=HI))
            assert e.body["type"] == "upstream_error" and kind in e.body["message"] and "sm" in e.body["message"], e.body
            stop(p)
        creds = config("aws-credentials", "[default]\naws_access_key_id = nobody\naws_secret_access_key = x\n\n"
                       "[gateway]\naws_access_key_id = AKIDKERZETEST\naws_secret_access_key = kerze/secret+key\n"
                       "aws_session_token = session-1\n")
        files = {**AWS, "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "",
                 "AWS_SHARED_CREDENTIALS_FILE": creds}
        p, base = gateway("sm-profile.toml", table + 'profile = "gateway"\n', "response_cache_mb = 0", env=files)
        assert client(base).chat.completions.create(model="llama-8b", messages=HI).choices[0].message.content == "Guten Tag aus SageMaker"
        stop(p)
        code, err = refused(["--config", config("sm-nocreds.toml", table)], env={**files, "AWS_SHARED_CREDENTIALS_FILE": os.path.join(TMP, "none")})
        assert code == 2 and "no AWS credentials" in err, err

    @test("gateway bedrock: Converse mapped both ways (system, sampling, stop, tools), SigV4 checked by botocore, whole and streamed; an expired session a typed error; a Bedrock API key as bearer")
    def _():
        aws = AwsMock(Credentials("AKIDKERZETEST", "kerze/secret+key", "session-1"), "us-west-2")
        mocks.append(aws)
        table = f"""
[[upstream]]
name = "br"
kind = "bedrock"
url = "{aws.url}"
region = "us-west-2"
model = "anthropic.claude-3-haiku-20240307-v1:0"
serves = ["claude-haiku"]
"""
        p, base = gateway("br.toml", table, "response_cache_mb = 0", env=AWS)
        gw = client(base)
        msgs = [{"role": "system", "content": "Antworte kurz."}, {"role": "user", "content": "Hallo"}]
        tools = [{"type": "function", "function": {"name": "wetter", "description": "Das Wetter",
                                                   "parameters": {"type": "object", "properties": {"ort": {"type": "string"}}}}}]
        raw = gw.chat.completions.with_raw_response.create(model="claude-haiku", messages=msgs, max_tokens=30, temperature=0.2,
                                                           stop=["\n\n"], tools=tools, tool_choice="auto")
        r = raw.parse()
        assert r.choices[0].message.content == "Grüezi aus Bedrock" and r.choices[0].finish_reason == "stop", r
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (9, 5), r.usage
        assert raw.headers["x-kerze-route"] == "upstream:br"
        assert aws.paths[-1] == "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse", aws.paths
        sent = aws.bodies[-1]
        assert sent["system"] == [{"text": "Antworte kurz."}] and sent["messages"] == [{"role": "user", "content": [{"text": "Hallo"}]}], sent
        assert sent["inferenceConfig"] == {"maxTokens": 30, "temperature": 0.2, "stopSequences": ["\n\n"]}, sent
        assert sent["toolConfig"]["tools"][0]["toolSpec"]["name"] == "wetter" and sent["toolConfig"]["toolChoice"] == {"auto": {}}, sent
        chunks = list(gw.chat.completions.create(model="claude-haiku", messages=msgs, stream=True,
                                                 stream_options={"include_usage": True}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Grüezi aus Bedrock"
        assert chunks[-1].usage.total_tokens == 14 and [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        assert aws.paths[-1].endswith("/converse-stream")
        stop(p)
        p, base = gateway("br.toml", table, "response_cache_mb = 0", env={**AWS, "AWS_SESSION_TOKEN": "session-0"})
        e = expect(openai.APIStatusError, 502, lambda: client(base).chat.completions.create(model="claude-haiku", messages=HI))
        assert e.body["type"] == "upstream_error" and "ExpiredTokenException" in e.body["message"], e.body
        stop(p)
        aws.bearer = "bedrock-api-key"
        p, base = gateway("br-key.toml", table + 'api_key_env = "KERZE_TEST_BEDROCK_KEY"\n', "response_cache_mb = 0",
                          env={**AWS, "KERZE_TEST_BEDROCK_KEY": "bedrock-api-key", "AWS_ACCESS_KEY_ID": ""})
        assert client(base).chat.completions.create(model="claude-haiku", messages=HI).choices[0].message.content == "Grüezi aus Bedrock"
        stop(p)

    @test("gateway redis: two gateways share the response cache, an upstream's budget and its rate; with Redis down each keeps serving from its own cache, with a warning")
    def _():
        port = free_port()
        redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        harness.procs.append(redis)
        deadline = time.time() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert time.time() < deadline, "redis-server did not start"
                time.sleep(0.05)
        mock = Mock()
        mocks.append(mock)
        table = f"""
[[upstream]]
name = "budget"
kind = "openai"
url = "{mock.url}"
serves = ["u"]
tokens_per_day = 20

[[upstream]]
name = "rate"
kind = "openai"
url = "{mock.url}"
serves = ["v"]
requests_per_minute = 2
"""
        flags = f'response_cache = "redis://127.0.0.1:{port}"'
        a, base_a = gateway("redis-a.toml", table, flags)
        b, base_b = gateway("redis-b.toml", table, flags)
        ga, gb = client(base_a), client(base_b)
        ask = [{"role": "user", "content": "What is Redis?"}]
        ra = ga.chat.completions.with_raw_response.create(model=MODEL_ID, messages=ask, max_tokens=12, temperature=0)
        rb = gb.chat.completions.with_raw_response.create(model=MODEL_ID, messages=ask, max_tokens=12, temperature=0)
        assert (ra.headers["x-kerze-cache"], rb.headers["x-kerze-cache"]) == ("miss", "hit"), (ra.headers, rb.headers)
        assert ra.parse().choices[0].message.content == rb.parse().choices[0].message.content
        hits = mock.hits
        ra = ga.chat.completions.with_raw_response.create(model="u", messages=ask, temperature=0)
        rb = gb.chat.completions.with_raw_response.create(model="u", messages=ask, temperature=0)
        assert (ra.headers["x-kerze-cache"], rb.headers["x-kerze-cache"]) == ("miss", "hit") and mock.hits == hits + 1
        # The budget: 8 tokens an answer, 20 a day, whichever gateway sends.
        ga.chat.completions.create(model="u", messages=HI, temperature=0.5)
        time.sleep(0.2)  # the spend is counted in the background
        gb.chat.completions.create(model="u", messages=HI, temperature=0.5)
        time.sleep(0.2)
        e = expect(openai.RateLimitError, 429, lambda: ga.chat.completions.create(model="u", messages=HI, temperature=0.5))
        assert "budget of 20 tokens" in e.body["message"] and "every gateway" in e.body["message"], e.body
        # The rate: 2 a minute (a fixed window there), whichever gateway sends.
        if time.time() % 60 > 50:
            time.sleep(61 - time.time() % 60)
        ga.chat.completions.create(model="v", messages=HI, temperature=0.5)
        gb.chat.completions.create(model="v", messages=HI, temperature=0.5)
        e = expect(openai.RateLimitError, 429, lambda: ga.chat.completions.create(model="v", messages=HI, temperature=0.5))
        assert "a minute" in e.body["message"] and "every gateway" in e.body["message"], e.body
        stop(redis)
        ask = [{"role": "user", "content": "And without Redis?"}]
        for g in [ga, gb]:
            r1 = g.chat.completions.with_raw_response.create(model=MODEL_ID, messages=ask, max_tokens=8, temperature=0)
            r2 = g.chat.completions.with_raw_response.create(model=MODEL_ID, messages=ask, max_tokens=8, temperature=0)
            assert (r1.headers["x-kerze-cache"], r2.headers["x-kerze-cache"]) == ("miss", "hit"), (r1.headers, r2.headers)
        assert ga.chat.completions.create(model="v", messages=HI).choices[0].message.content == "Hallo from upstream"
        for p in [a, b]:
            assert any("is not answering" in line for line in p.lines), p.lines
        stop(a)
        stop(b)

    @test("gateway docs/gateway.example.toml: the sample config starts a server that lists every upstream model")
    def _():
        env = {**AWS, "OPENAI_API_KEY": "sk-test", "AZURE_OPENAI_API_KEY": "az-test", "AWS_REGION": "eu-central-1"}
        p, base = start(["--config", os.path.join(harness.ROOT, "docs", "gateway.example.toml")], env=env)
        _, h = harness.health(base)
        assert (h["slots"], h["queue"]) == (2, 8), h
        ids = [m.id for m in client(base).models.list().data]
        assert ids == [MODEL_ID, "gpt-4o-mini", "gemini-flash", "llama-8b", "claude-haiku"], ids
        assert any("upstream sagemaker" in line for line in p.lines), p.lines
        stop(p)

    @test("gateway: upstream answers in the response cache; /metrics counts what was sent")
    def _():
        mock = Mock()
        mocks.append(mock)
        p, base = gateway("cache.toml", f'''
[[upstream]]
name = "m"
kind = "openai"
url = "{mock.url}"
serves = ["u"]
''')
        gw = client(base)
        for stream in [False, True]:
            hits = mock.hits
            seen = []
            for _ in range(2):
                raw = gw.chat.completions.with_raw_response.create(model="u", messages=HI, temperature=0, stream=stream)
                seen.append(raw.headers["x-kerze-cache"])
                r = raw.parse()
                text = r.choices[0].message.content if not stream else "".join(
                    c.choices[0].delta.content or "" for c in r if c.choices)
                assert text == "Hallo from upstream", text
            assert seen == ["miss", "hit"] and mock.hits == hits + 1, (seen, mock.hits, hits)
        gw.chat.completions.create(model="u", messages=HI, temperature=0.7)  # sampled: not kept
        for i in range(3):
            gw.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": f"Say {i}"}], max_tokens=4, temperature=0)
        m = metrics(base)
        assert metric(m, "kerze_requests_total", route="upstream:m", reason="model") == 5, m
        assert metric(m, "kerze_requests_total", route="local", reason="local") == 3, m
        assert metric(m, "kerze_tokens_total", route="upstream:m", kind="completion") == 15, m
        assert metric(m, "kerze_tokens_total", route="local", kind="completion") == 12, m
        assert metric(m, "kerze_request_duration_seconds_count", route="local") == 3, m
        assert metric(m, "kerze_queue_depth") == 0
        assert not any(k[0] == "kerze_upstream_errors_total" and v for k, v in m.items()), m
        stop(p)

finally:
    for m in mocks:
        m.close()
    stop_all()

print(f"\ntest_gateway.py: {'all passed' if harness.failures == 0 else f'{harness.failures} failed'}")
sys.exit(1 if harness.failures else 0)
