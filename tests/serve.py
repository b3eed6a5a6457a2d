#!/usr/bin/env python3
"""Static file server for tests and the demo, on 127.0.0.1 only.

Sends CORS and Cross-Origin-Resource-Policy headers so a page on another local origin (the
wasm-bindgen test runner, which is cross-origin isolated) may fetch the model, and with
--coop-coep the COOP/COEP pair a threads build needs.
usage: serve.py DIR PORT [--coop-coep] [--pid-file F]
"""
import functools, http.server, os, sys


class Handler(http.server.SimpleHTTPRequestHandler):
    coop_coep = False

    def end_headers(self):
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Cross-Origin-Resource-Policy", "cross-origin")
        if self.coop_coep:
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def log_message(self, *args):
        pass


def main():
    root, port = sys.argv[1], int(sys.argv[2])
    Handler.coop_coep = "--coop-coep" in sys.argv
    if "--pid-file" in sys.argv:
        with open(sys.argv[sys.argv.index("--pid-file") + 1], "w") as f:
            f.write(str(os.getpid()))
    Handler.extensions_map[".wasm"] = "application/wasm"
    Handler.extensions_map[".js"] = "text/javascript"
    handler = functools.partial(Handler, directory=root)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    print(f"serving {os.path.abspath(root)} at http://127.0.0.1:{port}/", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
