#!/usr/bin/env python3
"""Files per device kind (issue 42): product files of driver/src (and, once it exists, any
other crate's src) whose code, with comments, strings, inline test modules and the declarations
of test modules (`#[cfg(test)] mod x;`) stripped, names an identifier of the kind.

    python3 tools/kinds.py [-v]                  # per kind, of driver/src
    python3 tools/kinds.py --under claims/ [-v]  # of driver/src/claims only (the request path),
                                                 # and how many of them are outside the kind's folder
    python3 tools/kinds.py --preparer            # the Preparer's methods and the files they are in
    python3 tools/kinds.py --branches [-v]       # files of driver/src/claims that ask which kind a
                                                 # device is (a test of its kind, not a call on it),
                                                 # outside the kind's folder
"""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import modgraph as mg  # noqa: E402

KINDS = {
    "MIG instance": r"MigInstance|mig_instance|GpuInstance|ComputeInstance|gpu_instance|compute_instance"
                    r"|create_instance|destroy_instance|(^|_)(gi|ci)_id(_|$)|mig_uuid",
    "whole GPU": r"[Ww]hole_?[Gg]pu|WHOLE_GPU",
    "shared slice": r"(^|_)(shares?|shareable|share_id|unshared)(_|$)|^Share|[a-z]Share|shareID"
                    r"|shared_(profiles?|device|slice|names)",
    "MPS": r"(^|_)mps(_|$)|Mps|MPS",
    "MIG mode": r"[Mm]ig_?[Mm]ode|MIG_MODE",
}
# Same letters, another thing: libc's unshare(2), NVML constants.
NOT_KIND = {"unshare", "ENGINE_PROFILE_SHARED", "TYPE_MIG_SHARED"}
# Code that asks which kind a device is, instead of asking its kind: a test of the kind field, a
# share or an MPS limit's presence, a whole GPU's name.
BRANCHES = {
    "MIG instance": r"DeviceKind::Mig\b",
    "whole GPU": r"is_whole_gpu(_name)?\s*\(|DeviceKind::WholeGpu\b",
    "shared slice": r"\.share\s*\.\s*is_(some|none)\s*\(|\.shared\b|match\s+&?[\w.]*\bshare\b",
    "MPS": r"\.mps\s*\.\s*is_(some|none)\s*\(",
}
# Where each kind lives once it has a folder of its own (driver/src/…).
FOLDERS = {
    "MIG instance": "claims/kinds/mig_instance/",
    "whole GPU": "claims/kinds/whole_gpu/",
    "shared slice": "claims/kinds/shared_slice/",
    "MPS": "claims/layers/mps/",
    "MIG mode": "claims/gpu_mode/",
}


def product_code(f: Path) -> str:
    """The product code of file `f`: no comments, strings or test modules."""
    code = mg.strip_cfg_test_blocks(mg.strip_comments_and_strings(f.read_text()))
    return re.sub(r"#\[cfg\(test\)\]\s*(pub(\([a-z]+\))?\s+)?mod\s+" + mg.IDENT + r"\s*;", "", code)


def files_per_kind(prefix: str = "driver/src/") -> dict[str, list[str]]:
    out = {k: [] for k in KINDS}
    for f in mg.product_files():
        rel = str(f.relative_to(mg.ROOT))
        if not rel.startswith(prefix):
            continue
        idents = set(re.findall(mg.IDENT, product_code(f))) - NOT_KIND
        for kind, pat in KINDS.items():
            if any(re.search(pat, i) for i in idents):
                out[kind].append(rel)
    return out


def branches(prefix: str = "driver/src/claims/") -> dict[str, list[str]]:
    """Per kind of `BRANCHES`, the product files under `prefix`, outside the kind's folder, whose
    code tests which kind a device is."""
    out = {k: [] for k in BRANCHES}
    for f in mg.product_files():
        rel = str(f.relative_to(mg.ROOT))
        if not rel.startswith(prefix):
            continue
        code = product_code(f)
        for kind, pat in BRANCHES.items():
            if re.search(pat, code) and not rel.startswith("driver/src/" + FOLDERS[kind]):
                out[kind].append(rel)
    return out


def preparer_methods() -> dict[str, int]:
    """Methods of `impl … Preparer` blocks, by file (driver/src/…)."""
    out = {}
    for f in mg.product_files():
        rel = str(f.relative_to(mg.ROOT))
        if not rel.startswith("driver/src/"):
            continue
        code = product_code(f)
        n = 0
        for m in re.finditer(r"\bimpl\s+(?:[\w:]+\s+for\s+)?Preparer\s*\{", code):
            depth, j = 1, m.end()
            while j < len(code) and depth:
                depth += {"{": 1, "}": -1}.get(code[j], 0)
                j += 1
            n += len(re.findall(r"\bfn\s+" + mg.IDENT, code[m.end():j]))
        if n:
            out[rel.removeprefix("driver/src/")] = n
    return out


def main(argv: list[str]) -> int:
    if "--preparer" in argv:
        methods = preparer_methods()
        print(f"Preparer: {sum(methods.values())} methods in {len(methods)} files")
        for f, n in sorted(methods.items()):
            print(f"   {f} {n}")
        return 0
    if "--branches" in argv:
        for kind, files in branches().items():
            print(f"{kind}: {len(files)} files of driver/src/claims/ test for it outside {FOLDERS[kind]}")
            if "-v" in argv:
                print("   " + " ".join(f.removeprefix("driver/src/") for f in files))
        return 0
    under = argv[argv.index("--under") + 1] if "--under" in argv else ""
    prefix = "driver/src/" + under
    total = sum(1 for f in mg.product_files() if str(f.relative_to(mg.ROOT)).startswith(prefix))
    for kind, files in files_per_kind(prefix).items():
        line = f"{kind}: {len(files)} of {total} files of {prefix}"
        if under:
            outside = [f for f in files if not f.startswith("driver/src/" + FOLDERS[kind])]
            line += f", {len(outside)} outside {FOLDERS[kind]}"
        print(line)
        if "-v" in argv:
            print("   " + " ".join(f.removeprefix("driver/src/") for f in files))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
