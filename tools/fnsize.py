#!/usr/bin/env python3
"""Function sizes of the workspace's product code, as clippy's `too_many_lines` counts them:
the lines of a function's body that hold code (blank lines and comment-only lines left out),
test code excluded (test files and folders, inline `#[cfg(test)] mod` blocks, as in
tools/modgraph.py). No compile: reads the files.

    python3 tools/fnsize.py [--over N] [--top K] [PATH_PREFIX]
"""
from __future__ import annotations

import re
import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
import modgraph as mg  # noqa: E402

FN = re.compile(r"\bfn\s+(" + mg.IDENT + r")")


def functions(code: str):
    """(name, first line, code lines of body, lines from `fn` to the closing brace) of every fn with a body in stripped `code`."""
    for m in FN.finditer(code):
        j, depth = m.end(), 0
        while j < len(code):  # the signature: to the body's `{` or a `;` (no body)
            c = code[j]
            if c in "([<" and not (c == "<" and code[j - 1] == "-"):
                depth += 1
            elif c in ")]>" and not (c == ">" and code[j - 1] == "-"):
                depth -= 1
            elif c in "{;" and depth <= 0:
                break
            j += 1
        if j >= len(code) or code[j] == ";":
            continue
        start, depth = j, 0
        while j < len(code):
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
            if depth == 0:
                break
        body = code[start:j].splitlines()
        lines = sum(1 for ln in body if ln.strip() not in ("", "{", "}")) if len(body) > 1 else 1
        first = code.count("\n", 0, m.start()) + 1
        yield m.group(1), first, lines, code.count("\n", m.start(), j) + 1


def main(argv: list[str]) -> int:
    over, top, prefix = 80, 15, ""
    args = iter(argv[1:])
    for a in args:
        if a == "--over":
            over = int(next(args))
        elif a == "--top":
            top = int(next(args))
        else:
            prefix = a
    rows = []
    for f in mg.product_files():
        rel = str(f.relative_to(mg.ROOT))
        if not rel.startswith(prefix):
            continue
        code = mg.strip_cfg_test_blocks(mg.strip_comments_and_strings(f.read_text()))
        rows += [(n, rel, line, name, span) for name, line, n, span in functions(code)]
    rows.sort(reverse=True)
    print(f"functions: {len(rows)}; over {over} lines: {sum(1 for r in rows if r[0] > over)}")
    print("  code  span  where")
    for n, rel, line, name, span in rows[:top]:
        print(f"  {n:4d}  {span:4d}  {rel}:{line}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
