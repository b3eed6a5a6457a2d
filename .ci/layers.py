#!/usr/bin/env python3
"""The layering check of `make lint`: imports between kerze's source files point down.

It reads every `crate::…`, `super::…` and `self::…` path in the Rust sources under `src/`
(test code left out: an item behind `#[cfg(test)]`), resolves each to the file that defines
it (following `pub use` re-exports to where the item lives), and every relative `import` in
`pkg/*.js`. The layers are `.ci/layers.toml`: a file may import from its own layer or one
below it. The check fails on

- an upward arrow: a file importing from a layer above its own;
- a circle: files that import each other, directly or round a loop (Tarjan's strongly
  connected components over the file graph);
- a source file the table does not place.

    .ci/layers.py                  check the tree (exit 1 on a finding)
    .ci/layers.py --report         counts and the arrows between layers, never fails
    .ci/layers.py --root DIR       check another tree (the test of this check uses it)
"""

import argparse
import fnmatch
import os
import re
import sys
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------------------------------------
# Rust: files, modules and the paths they name


def strip_rust(text):
    """The source with comments, string and char literals blanked (same length and lines)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 260]) and not re.match(r"\w", text[i - 1:i] or " "):
            m = re.match(r'r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            # A char literal ('a', '\n', '\u{..}') or a lifetime ('a): blank only the former.
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:i + 12])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def skip_item(text, i):
    """The index just past the item that starts at `i` (up to its `;` or its matched `}`)."""
    n = len(text)
    while i < n and text[i] not in "{;":
        i += 1
    if i >= n or text[i] == ";":
        return i + 1
    depth = 0
    while i < n:
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


TEST_ATTR = re.compile(r"#\[cfg\((test|all\(test[^\]]*|any\(test[^\]]*)\)\]")


def drop_test_items(text):
    """Blank every item behind `#[cfg(test)]` (tests may reach anywhere)."""
    while True:
        m = TEST_ATTR.search(text)
        if not m:
            return text
        end = skip_item(text, m.end())
        text = text[: m.start()] + re.sub(r"[^\n]", " ", text[m.start():end]) + text[end:]


def module_path(rel):
    """`src/cpu/int8/mod.rs` → ('cpu', 'int8'); `src/lib.rs` → ()."""
    parts = rel.split("/")[1:]
    if parts[-1] in ("mod.rs", "lib.rs"):
        parts = parts[:-1]
    else:
        parts[-1] = parts[-1][:-3]
    return tuple(parts)


USE = re.compile(r"\buse\s+((?:crate|super|self)\b[^;]*);")
REEXPORT = re.compile(r"\bpub(?:\([^)]*\))?\s+use\s[^;]*;")
PATH = re.compile(r"\b((?:crate|super|self)(?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)+)")


def expand_use(tree):
    """`a::{b, c::{d, e as f}, g::*}` → ['a::b', 'a::c::d', 'a::c::e', 'a::g::*'] (aliases dropped)."""
    tree = re.sub(r"\s+as\s+[A-Za-z_][A-Za-z0-9_]*", "", tree)
    tree = re.sub(r"\s+", "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        if cur:
            parts.append(cur)
        return parts

    def walk(prefix, s):
        if "{" in s and s.endswith("}"):
            head, body = s.split("{", 1)
            head = head.rstrip(":")
            for part in split_top(body[:-1]):
                yield from walk(prefix + ([head] if head else []), part)
        else:
            yield "::".join(prefix + [s]) if s else "::".join(prefix)

    return list(walk([], tree))


class RustTree:
    def __init__(self, root):
        self.root = root
        self.files = {}  # module path → relative file
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, "src")):
            rel_dir = os.path.relpath(dirpath, root)
            # Workspace crates of their own (a Cargo.toml) and the binary are not modules.
            dirnames[:] = sorted(
                d for d in dirnames
                if not os.path.exists(os.path.join(dirpath, d, "Cargo.toml")) and d != "bin"
            )
            for f in sorted(filenames):
                if f.endswith(".rs"):
                    rel = os.path.join(rel_dir, f).replace(os.sep, "/")
                    self.files[module_path(rel)] = rel
        self.code = {}
        for mod, rel in self.files.items():
            with open(os.path.join(root, rel), encoding="utf-8") as fh:
                self.code[mod] = drop_test_items(strip_rust(fh.read()))
        # Inline modules (`pub mod dtype { … }`) belong to their file.
        self.inline = {}
        self.inline_spans = {}  # file's module → [(start, end, inline module path)]
        for mod, code in self.code.items():
            for m in re.finditer(r"\bmod\s+([a-z_][a-z0-9_]*)\s*\{", code):
                self.inline[mod + (m.group(1),)] = mod
                end = skip_item(code, m.start())
                self.inline_spans.setdefault(mod, []).append((m.start(), end, mod + (m.group(1),)))
        self.reexports = {mod: self._reexports(mod) for mod in self.files}

    def _absolute(self, mod, path):
        """A `crate::`/`super::`/`self::` path as segments from the crate root."""
        segs = [s for s in re.sub(r"\s+", "", path).split("::") if s]
        base = list(mod)
        if segs[0] == "crate":
            base, segs = [], segs[1:]
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
        return tuple(base + segs)

    def _reexports(self, mod):
        out = {}
        for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]*);", self.code[mod]):
            tree = m.group(1)
            for path in expand_use(tree):
                if not re.match(r"(crate|super|self)\b", path):
                    # `pub use child::X` names a child module relative to this one.
                    path = "self::" + path
                segs = self._absolute(mod, path)
                alias = re.search(r"\bas\s+([A-Za-z_][A-Za-z0-9_]*)\s*$", tree)
                name = alias.group(1) if alias and len(expand_use(tree)) == 1 else segs[-1]
                out[name] = segs
        return out

    def resolve(self, segs, seen=None):
        """The file that defines the item at `segs` (following re-exports)."""
        seen = seen or set()
        for k in range(len(segs), -1, -1):
            prefix = segs[:k]
            if prefix in self.inline:
                prefix = self.inline[prefix]
            if prefix in self.files:
                rest = segs[k:]
                if rest and rest[0] != "*" and rest[0] in self.reexports[prefix] and (prefix, rest[0]) not in seen:
                    seen.add((prefix, rest[0]))
                    target = self.reexports[prefix][rest[0]] + rest[1:]
                    return self.resolve(target, seen)
                return self.files[prefix]
        return None

    def edges(self):
        """{(from file, to file): first line that makes the arrow}."""
        out = {}
        for mod, code in self.code.items():
            src = self.files[mod]
            found = []
            # A re-export is no dependency of the file's own code: its users are resolved to
            # the item's origin.
            reexported = [(m.start(), m.end()) for m in REEXPORT.finditer(code)]
            for m in USE.finditer(code):
                if not any(a <= m.start() < b for a, b in reexported):
                    found.extend((m.start(), p) for p in expand_use(m.group(1)))
            spans = [(m.start(), m.end()) for m in USE.finditer(code)] + reexported
            for m in PATH.finditer(code):
                if any(a <= m.start() < b for a, b in spans):
                    continue
                found.append((m.start(), m.group(1)))
            # Paths that start at a child module (`use int8::QMatrix;`, `dense::Kernel::new()`).
            children = [c[-1] for c in self.files if c[:-1] == mod and len(c) == len(mod) + 1]
            children += [c[-1] for c, owner in self.inline.items() if owner == mod]
            if children:
                bare = re.compile(r"(?<![\w:])(" + "|".join(children) + r")\s*::\s*[A-Za-z_{*]")
                for m in bare.finditer(code):
                    if any(a <= m.start() < b for a, b in reexported):
                        continue
                    path = re.match(
                        r"[A-Za-z_][A-Za-z0-9_]*(?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)*", code[m.start():]
                    ).group(0)
                    found.append((m.start(), "self::" + path))
            for pos, p in found:
                # `super::` inside an inline module (`mod guide { … }`) starts from that module.
                here = mod
                for a, b, inner in self.inline_spans.get(mod, []):
                    if a <= pos < b and len(inner) > len(here):
                        here = inner
                segs = self._absolute(here, p)
                if segs == mod:
                    continue
                dst = self.resolve(segs)
                if dst and dst != src:
                    line = code.count("\n", 0, pos) + 1
                    out.setdefault((src, dst), line)
        return out


# ---------------------------------------------------------------------------------------------
# JavaScript: pkg/*.js imports


JS_IMPORT = re.compile(
    r"""(?:\bimport\s*(?:[\w*{}\s,$]+\s*from\s*)?|\bexport\s*[\w*{}\s,$]*\s*from\s*|\bimport\s*\(\s*)['"](\.{1,2}/[^'"]+)['"]"""
)


def strip_js(text):
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return re.sub(r"(^|[^:\\'\"])//[^\n]*", lambda m: m.group(1), text)


def js_edges(root):
    out = {}
    pkg = os.path.join(root, "pkg")
    if not os.path.isdir(pkg):
        return out
    for f in sorted(os.listdir(pkg)):
        if not f.endswith(".js"):
            continue
        src = "pkg/" + f
        with open(os.path.join(pkg, f), encoding="utf-8") as fh:
            code = strip_js(fh.read())
        for m in JS_IMPORT.finditer(code):
            target = os.path.normpath(os.path.join("pkg", m.group(1))).replace(os.sep, "/")
            # The wasm builds' own glue (pkg/wasm/…) is generated: not a layer of its own.
            if target.startswith("pkg/wasm/") or not target.endswith(".js"):
                continue
            line = code.count("\n", 0, m.start()) + 1
            out.setdefault((src, target), line)
    return out


# ---------------------------------------------------------------------------------------------
# Layers, circles, the verdict


def load_layers(path):
    with open(path, "rb") as fh:
        table = tomllib.load(fh)
    layers = table["layer"]
    return [(entry["name"], entry["files"]) for entry in layers]


def layer_of(layers, rel):
    """The index of the layer that places `rel` (0 is the top), or None."""
    for i, (_, globs) in enumerate(layers):
        if any(fnmatch.fnmatchcase(rel, g) for g in globs):
            return i
    return None


def circles(nodes, edges):
    """Strongly connected components of more than one file (Tarjan, iterative)."""
    graph = {n: [] for n in nodes}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def check(root, table):
    layers = load_layers(table)
    rust = RustTree(root)
    edges = dict(rust.edges())
    edges.update(js_edges(root))
    nodes = set(rust.files.values()) | {
        "pkg/" + f for f in os.listdir(os.path.join(root, "pkg")) if f.endswith(".js")
    } if os.path.isdir(os.path.join(root, "pkg")) else set(rust.files.values())
    unplaced = sorted(n for n in nodes if layer_of(layers, n) is None)
    upward = []
    for (a, b), line in sorted(edges.items()):
        la, lb = layer_of(layers, a), layer_of(layers, b)
        if la is not None and lb is not None and lb < la:
            upward.append((a, line, b, layers[la][0], layers[lb][0]))
    return nodes, edges, upward, circles(nodes, edges), unplaced, layers


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(HERE))
    ap.add_argument("--table", default=None, help="the layer table (default: ROOT/.ci/layers.toml)")
    ap.add_argument("--report", action="store_true", help="print counts, never fail")
    args = ap.parse_args()
    table = args.table or os.path.join(args.root, ".ci", "layers.toml")
    nodes, edges, upward, loops, unplaced, layers = check(args.root, table)

    for a, line, b, la, lb in upward:
        print(f"{a}:{line}: imports {b}, a layer above it ({la} → {lb}): move the item down, or pass it in")
    for comp in loops:
        ring = " → ".join(comp)
        print(f"circle of {len(comp)} files: {ring}")
        for (a, b), line in sorted(edges.items()):
            if a in comp and b in comp:
                print(f"  {a}:{line} → {b}")
    for rel in unplaced:
        print(f"{rel}: in no layer of {os.path.relpath(table, args.root)}: add it to the layer it belongs to")
    print(
        f"layers: {len(nodes)} files, {len(edges)} arrows, {len(upward)} upward, "
        f"{len(loops)} circles ({sum(map(len, loops))} files), {len(unplaced)} unplaced"
    )
    if args.report:
        return 0
    return 1 if upward or loops or unplaced else 0


if __name__ == "__main__":
    sys.exit(main())
