"""Tests of tools/pubonly.py's reading of test-only `#[cfg]`s (`python3 -m unittest discover -s tools`)."""
import tempfile
import unittest
from pathlib import Path

import modgraph as mg
import pubonly


def blank(src: str) -> str:
    return mg.strip_comments_and_strings(src)


class TestOnly(unittest.TestCase):
    def test_a_cfg_right_before_a_fn_gates_it(self):
        for attr in ['#[cfg(test)]', '#[cfg(any(test, feature = "testing"))]']:
            code = blank(f"{attr}\n#[must_use]\npub fn helper() {{}}")
            self.assertTrue(pubonly.test_only_before(code, code.index("pub fn")), attr)

    def test_other_cfgs_and_earlier_items_do_not(self):
        for src in ['#[cfg(unix)]\npub fn helper() {}',
                    '#[cfg(test)]\nfn other() {}\npub fn helper() {}',
                    'pub fn helper() {}']:
            code = blank(src)
            self.assertFalse(pubonly.test_only_before(code, code.index("pub fn helper")), src)

    def test_a_file_under_a_gated_module_is_gated(self):
        with tempfile.TemporaryDirectory() as d:
            src = Path(d) / "src"
            (src / "gpu" / "fake").mkdir(parents=True)
            (src / "lib.rs").write_text("pub mod gpu;\n")
            (src / "gpu.rs").write_text(
                'mod real;\n#[cfg(any(test, feature = "testing"))]\npub(crate) mod fake;\n')
            (src / "gpu" / "real.rs").write_text("pub fn call() {}\n")
            (src / "gpu" / "fake" / "mod.rs").write_text("mod calls;\n")
            (src / "gpu" / "fake" / "calls.rs").write_text("pub fn inject() {}\n")
            self.assertFalse(pubonly.gated(src / "gpu" / "real.rs"))
            self.assertTrue(pubonly.gated(src / "gpu" / "fake" / "mod.rs"))
            self.assertTrue(pubonly.gated(src / "gpu" / "fake" / "calls.rs"))
            self.assertFalse(pubonly.gated(src / "lib.rs"))


if __name__ == "__main__":
    unittest.main()
