#!/usr/bin/env python3
"""`pub fn`s of das-driver named nowhere in product code but their definition (tests, e2e and
fakes aside; benches count as users), leaving out those already built only for tests
(`#[cfg(test)]`, `#[cfg(any(test, feature = "testing"))]` on the fn or on a module above it).
Such a fn belongs behind one of those: `python3 tools/pubonly.py`."""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import modgraph as mg  # noqa: E402

# A test-only `#[cfg]` ending the code before an item (other attributes may follow it), in code
# whose strings are blanked (`feature = ""`).
TEST_ONLY = re.compile(r'#\[cfg\((test|any\(test, feature = ""\))\)\](\s*#\[[^\]]*\])*$')


def test_only_before(code: str, at: int) -> bool:
    """Whether the item starting at `at` in blanked `code` is under a test-only `#[cfg]`."""
    return bool(TEST_ONLY.search(code[:at].rstrip()[-200:]))


def parent_of(f: Path) -> tuple[Path, str] | None:
    """The file declaring module file `f` and the module's name (None for a crate root)."""
    if f.name in ("lib.rs", "main.rs") and f.parent.name == "src":
        return None
    name = f.parent.name if f.name == "mod.rs" else f.stem
    folder = f.parent.parent if f.name == "mod.rs" else f.parent
    for decl in (folder.with_suffix(".rs"), folder / "mod.rs", folder / "lib.rs"):
        if decl.exists() and decl != f:
            return decl, name
    return None


def gated(f: Path) -> bool:
    """Whether file `f` is built only for tests: its module, or one above it, is declared under
    a test-only `#[cfg]`."""
    up = parent_of(f)
    if up is None:
        return False
    decl, name = up
    src = mg.strip_comments_and_strings(decl.read_text())
    m = re.search(r"(pub(\([a-z]+\))?\s+)?mod\s+" + name + r"\s*;", src)
    return bool(m and test_only_before(src, m.start())) or gated(decl)


def test_only_pub_fns() -> list[str]:
    """`<file> <fn>` of every `pub fn` of das-driver that only tests name."""
    code = {f: mg.strip_cfg_test_blocks(mg.strip_comments_and_strings(f.read_text()))
            for f in mg.product_files() if "/e2e/" not in str(f)}
    for f in (mg.ROOT / "driver" / "benches").rglob("*.rs"):
        code[f] = mg.strip_comments_and_strings(f.read_text())
    only = []
    for f, c in code.items():
        if "/driver/src/" not in str(f) or gated(f):
            continue
        for m in re.finditer(r"\bpub\s+(?:async\s+|const\s+)*fn\s+(" + mg.IDENT + ")", c):
            name = m.group(1)
            if name in ("new", "default", "fmt", "from", "drop", "main"):
                continue
            if test_only_before(c, m.start()):
                continue
            if sum(len(re.findall(r"\b" + name + r"\b", t)) for t in code.values()) <= 1:
                only.append(f"{f.relative_to(mg.ROOT)} {name}")
    return only


def main() -> int:
    only = test_only_pub_fns()
    print(f"pub fns used only by tests: {len(only)}")
    print("\n".join("  " + o for o in only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
