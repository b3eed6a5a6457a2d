#!/usr/bin/env python3
"""The layering check (.ci/layers.py) passes on the tree as it is and fails on what it is
there to stop: an import that runs up a layer, one that closes a circle (between two files of
one layer, and between a folder's mod.rs and its child), a file no layer places. Each case
edits a copy of src/ and pkg/ and runs the check as `make lint` does.

    python3 tests/layers_test.py
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = os.path.join(ROOT, ".ci", "layers.py")


class LayeringCheck(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kerze-layers-")
        for d in ("src", "pkg"):
            shutil.copytree(os.path.join(ROOT, d), os.path.join(self.tmp, d),
                            ignore=shutil.ignore_patterns("wasm", "node_modules"))
        os.makedirs(os.path.join(self.tmp, ".ci"))
        shutil.copy(os.path.join(ROOT, ".ci", "layers.toml"), os.path.join(self.tmp, ".ci"))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_check(self):
        r = subprocess.run([sys.executable, CHECK, "--root", self.tmp],
                           capture_output=True, text=True, timeout=120)
        return r.returncode, r.stdout + r.stderr

    def append(self, rel, text):
        with open(os.path.join(self.tmp, rel), "a", encoding="utf-8") as f:
            f.write(text)

    def test_the_tree_as_it_is_passes(self):
        code, out = self.run_check()
        self.assertEqual(code, 0, out)
        self.assertIn(" 0 upward, 0 circles", out)

    def test_an_import_up_a_layer_fails_and_names_the_line(self):
        self.append("src/logits.rs", "\npub fn up() -> usize { crate::backend::PREFILL_CHUNK }\n")
        code, out = self.run_check()
        self.assertEqual(code, 1, out)
        self.assertRegex(out, r"src/logits\.rs:\d+: imports src/backend\.rs, a layer above it")

    def test_a_use_up_a_layer_fails(self):
        self.append("src/config.rs", "\n#[allow(unused_imports)]\nuse crate::engine::Engine;\n")
        code, out = self.run_check()
        self.assertEqual(code, 1, out)
        self.assertIn("src/config.rs", out)
        self.assertRegex(out, r"imports src/engine/\w+\.rs, a layer above it")

    def test_a_circle_within_one_layer_fails(self):
        # score.rs and embed.rs share a layer and neither imports the other; two imports close
        # a circle between them.
        self.append("src/score.rs", "\n#[allow(unused_imports)]\nuse crate::embed::EmbedUsage;\n")
        self.append("src/embed.rs", "\n#[allow(unused_imports)]\nuse crate::score::ScoreUsage;\n")
        code, out = self.run_check()
        self.assertEqual(code, 1, out)
        self.assertRegex(out, r"circle of 2 files: src/embed\.rs → src/score\.rs")

    def test_a_child_that_imports_its_parents_code_closes_a_circle(self):
        # model/mod.rs uses its children; a child reaching back into mod.rs closes a circle.
        self.append("src/model/gemma3.rs", "\nfn _family() -> usize { std::mem::size_of::<super::Model<crate::cpu::CpuBackend>>() }\n")
        code, out = self.run_check()
        self.assertEqual(code, 1, out)
        self.assertRegex(out, r"circle of \d+ files: .*src/model/gemma3\.rs.*src/model/mod\.rs")

    def test_a_package_import_up_a_layer_fails(self):
        self.append("pkg/protocol.js", "\nexport { createEngine } from './index.js';\n")
        code, out = self.run_check()
        self.assertEqual(code, 1, out)
        self.assertIn("pkg/protocol.js", out)
        self.assertIn("imports pkg/index.js", out)

    def test_a_file_no_layer_places_fails(self):
        with open(os.path.join(self.tmp, "src", "stray.rs"), "w", encoding="utf-8") as f:
            f.write("pub fn stray() {}\n")
        code, out = self.run_check()
        self.assertEqual(code, 1, out)
        self.assertIn("src/stray.rs: in no layer", out)

    def test_comments_strings_and_tests_are_not_imports(self):
        self.append("src/logits.rs", '\n// crate::engine::Engine in a comment\n'
                    'pub const NOT_AN_IMPORT: &str = "crate::engine::Engine";\n'
                    '#[cfg(test)]\nmod more_tests {\n    #[allow(unused_imports)]\n'
                    '    use crate::engine::Engine;\n}\n')
        code, out = self.run_check()
        self.assertEqual(code, 0, out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
