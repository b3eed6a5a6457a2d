"""What the PyPI-client tests of `kerze serve` share: starting a server on 127.0.0.1 (every one
started is stopped by its PID at the end), its health, and the test runner that reports and
counts failures."""

import json
import os
import re
import subprocess
import threading
import time
import traceback
import urllib.error
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KERZE = os.path.join(ROOT, "target", "release", "kerze")
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
MODEL_ID = "SmolLM2-135M-Instruct.Q4_1"

procs = []
failures = 0


def start(args, model=MODEL, wait=True, env=None):
    """`kerze serve` on a free port: (process, base URL). Its stderr is kept in `p.lines`."""
    p = subprocess.Popen(
        [KERZE, "serve", "--model", model, "--port", "0", "--device", "cpu", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=None if env is None else {**os.environ, **env},
    )
    procs.append(p)
    deadline = time.time() + 30
    line = ""
    while time.time() < deadline:
        line = p.stderr.readline()
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        if m:
            base = m.group(1)
            # Keep draining stderr so the server never blocks on a full pipe (kept: tests
            # read the server's warnings).
            p.lines = []
            threading.Thread(target=lambda: [p.lines.append(x) for x in p.stderr], daemon=True).start()
            if wait:
                ready(base)
            return p, base
        if p.poll() is not None:
            break
    raise RuntimeError(f"kerze serve did not start: {line}")


def refused(args, env=None, timeout=30):
    """`kerze serve` that must stop at start: (exit code, stderr)."""
    r = subprocess.run([KERZE, "serve", "--model", MODEL, "--port", "0", "--device", "cpu", *args],
                       capture_output=True, text=True, timeout=timeout,
                       env=None if env is None else {**os.environ, **env})
    return r.returncode, r.stderr


def health(base):
    try:
        with urllib.request.urlopen(f"{base}/health") as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def ready(base):
    deadline = time.time() + 60
    while time.time() < deadline:
        if health(base)[0] == 200:
            return
        time.sleep(0.05)
    raise RuntimeError(f"{base} not ready")


def stop(p):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def stop_all():
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def test(name):
    def wrap(fn):
        global failures
        t0 = time.time()
        try:
            fn()
            print(f"ok   {name} ({time.time() - t0:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 — report and go on
            failures += 1
            print(f"FAIL {name}: {e!r}", flush=True)
            traceback.print_exc()
        return fn
    return wrap


def fail(message):
    global failures
    failures += 1
    print(f"FAIL {message}")


def expect(cls, status, fn):
    try:
        fn()
    except cls as e:
        assert e.status_code == status, f"{cls.__name__}: status {e.status_code} != {status}"
        return e
    raise AssertionError(f"no {cls.__name__}")
