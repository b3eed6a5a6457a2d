#!/usr/bin/env python3
"""Static file server for tests and the demo, on 127.0.0.1 only.

Sends CORS and Cross-Origin-Resource-Policy headers so a page on another local origin may
fetch the model and the package, and with --coop-coep the COOP/COEP pair that makes a page
cross-origin isolated (the threads build needs it).

usage: serve.py DIR PORT [--coop-coep] [--pid-file F] [--only a,b,c] [--index PATH]
                [--test-routes] [--csp POLICY] [--csp-scripts]
  --only         serve only these top-level folders of DIR (404 for everything else)
  --index        where `/` redirects to (e.g. /www/)
  --test-routes  /__test__/slow/<path> (throttled), /__test__/truncated/<path> (the full
                 Content-Length, then the connection closes after 1 MiB), /__test__/requests
                 (JSON list of every path requested so far)
  --csp          send this Content-Security-Policy with HTML pages
  --csp-scripts  and with scripts too (a worker's own policy comes with its script)
"""
import functools, http.server, json, os, sys, threading, time


class Handler(http.server.SimpleHTTPRequestHandler):
    coop_coep = False
    only = None
    index = None
    test_routes = False
    csp = None
    csp_scripts = False
    seen = []
    seen_lock = threading.Lock()

    def end_headers(self):
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Cross-Origin-Resource-Policy", "cross-origin")
        self.send_header("Cache-Control", "no-store")
        if self.coop_coep:
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        kinds = (".html", "/", ".js", ".mjs") if self.csp_scripts else (".html", "/")
        if self.csp and self.path.split("?")[0].endswith(kinds):
            self.send_header("Content-Security-Policy", self.csp)
        super().end_headers()

    def log_message(self, *args):
        pass

    def _file(self, rel):
        path = self.translate_path("/" + rel)
        return path if os.path.isfile(path) else None

    def do_GET(self):
        path = self.path.split("?")[0]
        if self.test_routes and path == "/__test__/requests":
            with self.seen_lock:
                body = json.dumps(self.seen).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        with self.seen_lock:
            self.seen.append(path)
        if self.test_routes and path.startswith(("/__test__/slow/", "/__test__/truncated/")):
            kind, rel = path[len("/__test__/"):].split("/", 1)
            f = self._file(rel)
            if not f:
                self.send_error(404)
                return
            size = os.path.getsize(f)
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            limit = (1 << 20) if kind == "truncated" else size
            sent = 0
            try:
                with open(f, "rb") as fh:
                    while sent < limit:
                        block = fh.read(min(1 << 18, limit - sent))
                        if not block:
                            break
                        self.wfile.write(block)
                        sent += len(block)
                        if kind == "slow":
                            time.sleep(0.05)  # ~5 MB/s
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True
            return
        if not self._refused(path):
            super().do_GET()

    def do_HEAD(self):
        path = self.path.split("?")[0]
        if self.test_routes and path.startswith(("/__test__/slow/", "/__test__/truncated/")):
            # The headers a GET would send (the package's device check asks for the size).
            f = self._file(path[len("/__test__/"):].split("/", 1)[1])
            if not f:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(os.path.getsize(f)))
            self.end_headers()
            return
        if not self._refused(path):
            super().do_HEAD()

    def _refused(self, path):
        """Answer `/` with the index redirect and paths outside --only with 404."""
        if path == "/" and self.index:
            self.send_response(302)
            self.send_header("Location", self.index)
            self.end_headers()
            return True
        if self.only is not None:
            top = path.lstrip("/").split("/", 1)[0]
            if top not in self.only:
                self.send_error(404)
                return True
        return False


def main():
    root, port = sys.argv[1], int(sys.argv[2])
    args = sys.argv[3:]

    def opt(name):
        return args[args.index(name) + 1] if name in args else None

    Handler.coop_coep = "--coop-coep" in args
    Handler.test_routes = "--test-routes" in args
    Handler.index = opt("--index")
    Handler.csp = opt("--csp")
    Handler.csp_scripts = "--csp-scripts" in args
    if opt("--only"):
        Handler.only = set(opt("--only").split(","))
    if opt("--pid-file"):
        with open(opt("--pid-file"), "w") as f:
            f.write(str(os.getpid()))
    Handler.extensions_map[".wasm"] = "application/wasm"
    Handler.extensions_map[".js"] = "text/javascript"
    Handler.extensions_map[".mjs"] = "text/javascript"
    handler = functools.partial(Handler, directory=root)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    print(f"serving {os.path.abspath(root)} at http://127.0.0.1:{port}/", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
