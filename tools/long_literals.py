#!/usr/bin/env python3
"""String literals of at least N characters (default 200) in the workspace's product code (test
code excluded, as in tools/modgraph.py), by where they are written: in an `#[error(...)]` of a
typed error, or inline in code (a `format!`, a log line, an event note...). Long user messages
belong in typed errors' `Display`s; this lists what is still inline. No compile: reads the files.

    python3 tools/long_literals.py [--min N] [--inline] [PATH_PREFIX]
"""
from __future__ import annotations

import re
import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
import modgraph as mg  # noqa: E402


def literals(src: str):
    """(line, text, in_error_attribute) of each plain string literal of `src` outside comments."""
    i, n = 0, len(src)
    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
            continue
        c = src[i]
        if c == "'" and re.match(r"'(\\.|[^\\'])'", src[i:i + 4]):
            i += src.find("'", i + 2 if src[i + 1] != "\\" else i + 3) - i + 1
            continue
        if c != '"' or (i > 0 and (src[i - 1].isalnum() or src[i - 1] in "_#")):
            i += 1
            continue
        j = i + 1
        while j < n and src[j] != '"':
            j += 2 if src[j] == "\\" else 1
        before = src[max(0, i - 200):i]
        in_error = before.rfind("#[error(") > max(before.rfind(")]"), before.rfind(";"))
        yield src.count("\n", 0, i) + 1, src[i + 1:j], in_error
        i = j + 1


def main(argv: list[str]) -> int:
    least, only_inline, prefix = 200, False, ""
    args = iter(argv[1:])
    for a in args:
        if a == "--min":
            least = int(next(args))
        elif a == "--inline":
            only_inline = True
        else:
            prefix = a
    counts = {"error": 0, "inline": 0}
    for f in mg.product_files():
        rel = str(f.relative_to(mg.ROOT))
        if not rel.startswith(prefix):
            continue
        for line, text, in_error in literals(mg.strip_cfg_test_blocks(f.read_text())):
            if len(text) < least:
                continue
            where = "error" if in_error else "inline"
            counts[where] += 1
            if not (only_inline and in_error):
                print(f"{where:6} {len(text):4}  {rel}:{line}  {text[:60]}…")
    print(f"literals of {least}+ characters under {prefix or '.'}: "
          f"{counts['error']} in #[error], {counts['inline']} inline")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
