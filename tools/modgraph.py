#!/usr/bin/env python3
"""Module graph of the workspace's crates: the "no circles" rule of CONTRIBUTING.md, and the
shape figures the codebase is judged by.

    python3 tools/modgraph.py check     # exit 1 and print each circle between sibling modules,
                                        # and each crossing of a crate boundary (BOUNDARIES)
    python3 tools/modgraph.py figures   # files, lines, largest files, public items, crate edges
    python3 tools/modgraph.py graph CRATE_DIR  # the edges between sibling modules of one crate

The rule: within every module (a crate root or a folder module), its child modules depend on
one another without a circle. Module `a` depends on sibling `b` when any file under `a`
names something under `b`: a `use` of `crate::…`, `super::…` or `self::…` (use trees
expanded), or such a path in code. Names re-exported by a parent's `pub use` are followed to
the child that defines them, so `crate::claims::PrepareError` counts as `claims::error`.

Test code is left out: files named `tests.rs`, `*_tests.rs`, `testing.rs`, folders named
`tests`, and inline `#[cfg(test)] mod … { … }` blocks (tests may reach anywhere). Comments and
string literals are stripped first, so doc links do not count. Binaries (`src/bin`) are crate
roots of their own and are not part of the library's graph.

Boundaries: a crate listed in BOUNDARIES (by folder) must not depend on the crates its rule
names, directly (any dependency kind) or through other workspace crates (their normal and build
dependencies), and no identifier in its Rust files (code, not comments or strings; tests too)
may contain one of its rule's words. Identifiers are split into words at `_` and at case changes
(`MigSlice` → mig, slice; `allGPUs` → all, gpus), so `mpsc` or `migrate` is no `mps` or `mig`.

Isolated folders (`ISOLATED`): the children of such a module (the device kinds under
`claims::kinds`, the layers under `claims::layers`) are plug-ins of one interface. None of them
names another (no edge between siblings there, whatever the direction), and code outside the
folder names only the folder's own module (`claims::kinds`: the trait, the registry, their
vocabulary), never a child: a kind is reached through the registry. `check` fails on either.

Why our own: the tools that exist (cargo-modules) build rust-analyzer's whole analysis, minutes
of compile on a 2-core CI for a check that needs the `use` lines only.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# Folders of plug-ins (module paths from the crate root): siblings under them never name each
# other, and the rest of the crate reaches them only through the folder's module.
ISOLATED = [("claims", "kinds"), ("claims", "layers")]

# The generic DRA layer (dra/, issue 42 item 2) serves any driver: it knows no DAS crate but the
# protos and the runtime, no NVIDIA library, and no word of one vendor's devices.
BOUNDARIES = {
    "dra": {
        "deps_not": {"das-driver", "das-api", "nvml-wrapper", "nvml-wrapper-sys"},
        "words_not": {"mig", "nvml", "gpu", "gpus", "cuda", "mps"},
    },
}


def strip_comments_and_strings(src: str) -> str:
    """The source with comments, string and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if src[i] == "\n":
                        out.append("\n")
                    i += 1
        elif c == "r" and re.match(r'r#*"', src[i:i + 10]) and (i == 0 or not src[i - 1].isalnum() and src[i - 1] != "_"):
            m = re.match(r'r(#*)"', src[i:])
            end = src.find('"' + m.group(1), i + len(m.group(0)))
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""' + "\n" * src.count("\n", i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", src[i:i + 4]) or (c == "'" and src.startswith("'\\", i)):
            j = src.find("'", i + 2 if src[i + 1] != "\\" else i + 3)
            out.append("' '")
            i = j + 1 if j > 0 else n
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_cfg_test_blocks(src: str) -> str:
    """The source without inline `#[cfg(test)] mod name { … }` blocks."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(pub(\([a-z]+\))?\s+)?mod\s+" + IDENT + r"\s*\{", src)
        if not m:
            return src
        depth, j = 1, m.end()
        while j < len(src) and depth:
            depth += {"{": 1, "}": -1}.get(src[j], 0)
            j += 1
        src = src[: m.start()] + src[j:]


def expand_use_tree(tree: str) -> list[str]:
    """`a::{b, c::{d, e}}` → ["a::b", "a::c::d", "a::c::e"] (aliases and globs kept as paths)."""
    tree = re.sub(r"\s+", "", tree)
    if "{" not in tree:
        return [tree.split("as")[0] if "::" not in tree.split("as")[-1] else tree]
    i = tree.index("{")
    prefix, body = tree[:i], tree[i + 1 : tree.rindex("}")]
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    out = []
    for p in filter(None, parts):
        for q in expand_use_tree(p):
            out.append(prefix + q if q != "self" else prefix.rstrip(":"))
    return out


class Crate:
    """One crate's library modules: path (tuple of names) → file, and the file's code."""

    def __init__(self, src_dir: Path):
        self.src = src_dir
        self.files: dict[tuple[str, ...], Path] = {}
        self.code: dict[tuple[str, ...], str] = {}
        self.reexports: dict[tuple[str, ...], dict[str, tuple[str, ...]]] = {}
        # Modules another crate can name: every module on the way is `pub mod`.
        self.public: set[tuple[str, ...]] = set()
        self._load((), src_dir / "lib.rs", True)

    def _load(self, mod: tuple[str, ...], file: Path, public: bool) -> None:
        if not file.exists():
            return
        if public:
            self.public.add(mod)
        raw = file.read_text()
        code = strip_cfg_test_blocks(strip_comments_and_strings(raw))
        self.files[mod] = file
        self.code[mod] = code
        # Children: `mod x;` lines (not under #[cfg(test)]).
        base = file.parent if file.name in ("lib.rs", "mod.rs") else file.parent / file.stem
        for m in re.finditer(r"(#\[cfg\(test\)\]\s*)?(pub(\([a-z]+\))?\s+)?mod\s+(" + IDENT + r")\s*;", code):
            name = m.group(4)
            if m.group(1) or is_test_name(name):
                continue
            child = base / f"{name}.rs"
            if not child.exists():
                child = base / name / "mod.rs"
            self._load(mod + (name,), child, public and m.group(2) is not None and m.group(3) is None)
        self.reexports[mod] = {}
        for m in re.finditer(r"pub(\([a-z]+\))?\s+use\s+([^;]+);", code):
            for path in expand_use_tree(m.group(2)):
                segs = [s for s in path.split("::") if s]
                alias = segs[-1]
                if "as" in path:
                    alias = path.split("as")[-1]
                    segs = [s for s in path.split("as")[0].split("::") if s]
                target = self.resolve(mod, segs)
                if target is not None:
                    self.reexports[mod][alias] = target

    def resolve(self, mod: tuple[str, ...], segs: list[str]) -> tuple[str, ...] | None:
        """The module a path names from inside `mod` (deepest known module), or None (extern)."""
        if not segs:
            return None
        if segs[0] == "crate":
            base, rest = (), segs[1:]
        elif segs[0] == "super":
            base, rest = mod, segs
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
        elif segs[0] == "self":
            base, rest = mod, segs[1:]
        elif mod + (segs[0],) in self.files:
            base, rest = mod, segs
        else:
            return None
        cur = base
        for s in rest:
            if cur + (s,) in self.files:
                cur = cur + (s,)
            elif s in self.reexports.get(cur, {}):
                return self.reexports[cur][s]
            else:
                break
        return cur

    def references(self, mod: tuple[str, ...]) -> set[tuple[str, ...]]:
        """Modules the file of `mod` names (use declarations and paths in code)."""
        code = self.code[mod]
        refs = set()
        for m in re.finditer(r"\buse\s+([^;]+);", code):
            for path in expand_use_tree(m.group(1)):
                segs = [s for s in re.split(r"::", path.split(" as ")[0]) if s and s != "*"]
                r = self.resolve(mod, segs)
                if r is not None:
                    refs.add(r)
        for m in re.finditer(r"\b((?:crate|super|self)(?:::" + IDENT + r")+)", code):
            r = self.resolve(mod, m.group(1).split("::"))
            if r is not None:
                refs.add(r)
        return refs

    def sibling_edges(self) -> dict[tuple[str, ...], set[tuple[str, str]]]:
        """Per parent module, the edges (child a → child b) between its children."""
        edges: dict[tuple[str, ...], set[tuple[str, str]]] = {}
        for mod in self.files:
            for ref in self.references(mod):
                # The deepest common parent; the edge is between its two children on each side.
                k = 0
                while k < len(mod) and k < len(ref) and mod[k] == ref[k]:
                    k += 1
                if k < len(mod) and k < len(ref):
                    edges.setdefault(mod[:k], set()).add((mod[k], ref[k]))
        return edges


def isolation_breaches(crate: Crate, isolated=None) -> list[str]:
    """Every edge that breaks an isolated folder (`ISOLATED`): one child of the folder naming
    another, or a module outside the folder naming one of its children."""
    found = []
    for parent in ISOLATED if isolated is None else isolated:
        if parent not in crate.files:
            continue
        where = "::".join(parent)
        n = len(parent)
        for mod in sorted(crate.files):
            inside = mod[:n] == parent
            for ref in sorted(crate.references(mod)):
                if len(ref) <= n or ref[:n] != parent:
                    continue  # not below the folder
                if inside and len(mod) > n and mod[n] != ref[n]:
                    found.append(f"{where}: {mod[n]} names its sibling {ref[n]} (in {'::'.join(mod)})")
                elif not inside:
                    found.append(f"{where}: {'::'.join(mod)} names {'::'.join(ref[: n + 1])}, "
                                 f"not through {where}")
    return sorted(set(found))


def all_breaches() -> list[str]:
    found = []
    for cdir in crates():
        if (cdir / "src" / "lib.rs").exists():
            found += [f"{cdir.name}: {b}" for b in isolation_breaches(Crate(cdir / "src"))]
    return found


def is_test_name(name: str) -> bool:
    return name in ("tests", "testing") or name.endswith("_tests")


def crates() -> list[Path]:
    meta = json.loads(subprocess.check_output(["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"], cwd=ROOT))
    return [Path(p["manifest_path"]).parent for p in meta["packages"]]


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def all_circles() -> list[str]:
    found = []
    for cdir in crates():
        if not (cdir / "src" / "lib.rs").exists():
            continue
        crate = Crate(cdir / "src")
        for parent, edges in sorted(crate.sibling_edges().items()):
            for comp in cycles(edges):
                where = "::".join(("crate",) + parent)
                inner = [f"{a} -> {b}" for a, b in sorted(edges) if a in comp and b in comp]
                found.append(f"{cdir.name}: {where}: {{{', '.join(comp)}}} ({'; '.join(inner)})")
    return found


def cmd_check() -> int:
    found = all_circles()
    for line in found:
        print("import circle:", line)
    if found:
        print("modules in a circle cannot be understood or tested one at a time: move what both need "
              "into a lower module (CONTRIBUTING.md, \"Where a change goes\")")
    meta = json.loads(subprocess.check_output(["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"], cwd=ROOT))
    crossings = boundary_violations(meta["packages"], ROOT)
    for line in crossings:
        print("boundary:", line)
    if crossings:
        print("a generic crate serves any driver: keep what is one driver's (its crates, its devices' "
              "words) in that driver's crate, and pass it in (CONTRIBUTING.md, \"Where a change goes\")")
    breaches = all_breaches()
    for line in breaches:
        print("isolated folder:", line)
    if breaches:
        print("a device kind (or layer) is a plug-in: it names no other, and the rest reaches it through "
              "its folder's trait and registry; move what two of them need into the folder's module "
              "(CONTRIBUTING.md, \"Where a change goes\")")
    if found or crossings or breaches:
        return 1
    print("modgraph: no import circles between sibling modules; crate boundaries and isolated folders kept")
    return 0


def identifier_words(ident: str) -> list[str]:
    """The lower-case words of an identifier: split at `_` and at case changes, an upper-case
    run with a plural `s` kept whole (`NVMLError` → nvml, error; `allGPUs` → all, gpus)."""
    words = []
    for part in filter(None, ident.split("_")):
        words += re.findall(r"[A-Z]{2,}s(?=[A-Z0-9]|$)|[A-Z]+(?=[A-Z][a-z]|[0-9]|$)|[A-Z]?[a-z]+|[A-Z]+|[0-9]+", part)
    return [w.lower() for w in words]


def identifier_violations(crate_dir: Path, words_not: set[str]) -> list[str]:
    """`file:line: identifier (word)` for each identifier in the crate's Rust files (outside
    `target/`; comments and string literals left out) that contains one of `words_not`."""
    found = []
    for f in sorted(crate_dir.rglob("*.rs")):
        if "target" in f.relative_to(crate_dir).parts:
            continue
        code = strip_comments_and_strings(f.read_text())
        for n, line in enumerate(code.splitlines(), 1):
            for ident in re.findall(r"(?<![A-Za-z0-9_'])" + IDENT, line):
                bad = sorted(set(identifier_words(ident)) & words_not)
                if bad:
                    found.append(f"{f.relative_to(crate_dir.parent)}:{n}: `{ident}` ({', '.join(bad)})")
    return found


def dependency_violations(packages: list[dict], crate: str, deps_not: set[str]) -> list[str]:
    """The chains by which package `crate` reaches a package of `deps_not`: its own dependencies
    of any kind, then the normal and build dependencies of the workspace packages on the way
    (`packages`: cargo metadata's, `--no-deps`)."""
    by_name = {p["name"]: p for p in packages}
    found, seen = [], {crate}
    queue = [(crate, [crate])]
    while queue:
        name, chain = queue.pop(0)
        for d in by_name[name]["dependencies"]:
            if name != crate and d.get("kind") == "dev":
                continue
            if d["name"] in deps_not:
                found.append(" -> ".join(chain + [d["name"]]))
            elif d["name"] in by_name and d["name"] not in seen:
                seen.add(d["name"])
                queue.append((d["name"], chain + [d["name"]]))
    return sorted(set(found))


def boundary_violations(packages: list[dict], root: Path) -> list[str]:
    """Every crossing of BOUNDARIES by the workspace's crates (`packages`: cargo metadata's)."""
    found = []
    for folder, rule in sorted(BOUNDARIES.items()):
        crate_dir = root / folder
        names = [p["name"] for p in packages if Path(p["manifest_path"]).parent == crate_dir]
        if not names:
            found.append(f"{folder}: no workspace crate in this folder (BOUNDARIES names it)")
            continue
        for chain in dependency_violations(packages, names[0], rule["deps_not"]):
            found.append(f"{folder}: depends on {chain}")
        for hit in identifier_violations(crate_dir, rule["words_not"]):
            found.append(f"{folder}: identifier {hit}")
    return found


def product_files() -> list[Path]:
    files = []
    for cdir in crates():
        for f in sorted((cdir / "src").rglob("*.rs")):
            rel = f.relative_to(cdir / "src")
            if any(is_test_name(p.removesuffix(".rs")) for p in rel.parts):
                continue
            files.append(f)
    return files


def public_items(src_dir: Path) -> tuple[int, int, int]:
    """`pub` items (fn, struct, enum, trait, type, const, static, mod, macro), `pub` fields and
    `pub use` names of a crate's library, test code excluded, in the modules another crate can
    name (a `pub` item of a `pub(crate) mod` is not counted)."""
    crate = Crate(src_dir)
    items = fields = reexported = 0
    for mod, code in crate.code.items():
        if mod not in crate.public:
            continue
        for m in re.finditer(r"\bpub\s+(?!\()(use\s+([^;]+);|((async|unsafe|const)\s+)*(fn|struct|enum|trait|type|const|static|mod|macro)\b)?", code):
            if m.group(2):
                reexported += len(expand_use_tree(m.group(2)))
            elif m.group(5):
                items += 1
            else:
                fields += 1
    return items, fields, reexported


def cmd_figures() -> int:
    files = product_files()
    sizes = sorted(((len(f.read_text().splitlines()), f.relative_to(ROOT)) for f in files), reverse=True)
    print(f"product files (src, test files excluded): {len(files)}, lines {sum(s for s, _ in sizes)}")
    print("largest:", ", ".join(f"{p} {s}" for s, p in sizes[:5]))
    print("over 600 lines:", sum(1 for s, _ in sizes if s > 600))
    items, fields, reexported = public_items(ROOT / "driver" / "src")
    print(f"das-driver public: {items} items, {fields} fields, {reexported} re-exported names")
    print("import circles:", len(all_circles()))
    meta = json.loads(subprocess.check_output(["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"], cwd=ROOT))
    names = {p["name"] for p in meta["packages"]}
    normal, dev = set(), set()
    for p in meta["packages"]:
        for d in p["dependencies"]:
            if d["name"] in names:
                (dev if d["kind"] == "dev" else normal).add((p["name"], d["name"]))
    dev -= normal
    print(f"crate dependency edges: {len(normal)} normal/build, {len(dev)} dev-only:",
          ", ".join(f"{a}->{b}" for a, b in sorted(dev)))
    return 0


def cmd_graph(crate_dir: str) -> int:
    crate = Crate(ROOT / crate_dir / "src")
    for parent, edges in sorted(crate.sibling_edges().items()):
        print("::".join(("crate",) + parent) + ":")
        for a, b in sorted(edges):
            print(f"  {a} -> {b}")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] == "check":
        return cmd_check()
    if len(argv) >= 2 and argv[1] == "figures":
        return cmd_figures()
    if len(argv) == 3 and argv[1] == "graph":
        return cmd_graph(argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
