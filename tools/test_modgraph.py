"""Tests of tools/modgraph.py on small crates written to a temporary directory
(`python3 -m unittest discover -s tools`, part of `make unit`)."""

import tempfile
import textwrap
import unittest
from pathlib import Path

import modgraph


def crate(files: dict[str, str]) -> modgraph.Crate:
    root = Path(tempfile.mkdtemp()) / "src"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return modgraph.Crate(root)


def circles(files: dict[str, str]) -> list[list[str]]:
    found = []
    for edges in crate(files).sibling_edges().values():
        found += modgraph.cycles(edges)
    return found


class ModGraph(unittest.TestCase):
    def test_a_use_each_way_is_a_circle(self):
        self.assertEqual(
            circles({"lib.rs": "pub mod a;\npub mod b;\n", "a.rs": "use crate::b::X;\n", "b.rs": "use crate::a::Y;\n"}),
            [["a", "b"]],
        )

    def test_one_way_is_not(self):
        self.assertEqual(circles({"lib.rs": "mod a;\nmod b;\n", "a.rs": "use crate::b::X;\n", "b.rs": "fn f() {}\n"}), [])

    def test_paths_in_code_and_use_trees_count(self):
        files = {
            "lib.rs": "pub mod p;\n",
            "p/mod.rs": "pub mod a;\npub mod b;\npub mod c;\n",
            "p/a.rs": "use super::{b::X, c};\n",
            "p/c.rs": "fn f() { crate::p::a::g(); }\n",
            "p/b.rs": "",
        }
        self.assertEqual(circles(files), [["a", "c"]])

    def test_a_parents_reexport_is_followed_to_the_child(self):
        files = {
            "lib.rs": "pub mod a;\npub mod b;\npub use b::Thing;\n",
            "a.rs": "use crate::Thing;\n",
            "b.rs": "pub struct Thing;\nfn f() { let _ = crate::a::g; }\n",
        }
        self.assertEqual(circles(files), [["a", "b"]])

    def test_comments_strings_and_tests_do_not_count(self):
        files = {
            "lib.rs": "pub mod a;\npub mod b;\n",
            "a.rs": "use crate::b::X;\n",
            "b.rs": textwrap.dedent(
                """\
                //! See [`crate::a::Y`].
                const S: &str = "crate::a::Y";
                #[cfg(test)]
                mod tests { use crate::a::Y; }
                #[cfg(test)]
                mod more;
                """
            ),
            "b/more.rs": "use crate::a::Y;\n",
        }
        self.assertEqual(circles(files), [])

    def test_nested_circles_are_found_at_their_level(self):
        files = {
            "lib.rs": "pub mod p;\n",
            "p/mod.rs": "pub mod a;\npub mod b;\n",
            "p/a.rs": "use super::b;\n",
            "p/b.rs": "use super::a;\n",
        }
        edges = crate(files).sibling_edges()
        self.assertEqual(modgraph.cycles(edges[("p",)]), [["a", "b"]])


def package(name: str, folder: Path, deps: list[tuple[str, str | None]]) -> dict:
    """A package as `cargo metadata --no-deps` lists it: (dependency, kind) pairs."""
    return {
        "name": name,
        "manifest_path": str(folder / "Cargo.toml"),
        "dependencies": [{"name": d, "kind": k} for d, k in deps],
    }


class Boundaries(unittest.TestCase):
    RULE = modgraph.BOUNDARIES["dra"]

    def words(self, files: dict[str, str]) -> list[str]:
        root = Path(tempfile.mkdtemp()) / "dra"
        for name, text in files.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        return modgraph.identifier_violations(root, self.RULE["words_not"])

    def test_identifiers_are_split_into_words(self):
        self.assertEqual(modgraph.identifier_words("MigSlice"), ["mig", "slice"])
        self.assertEqual(modgraph.identifier_words("NVMLError"), ["nvml", "error"])
        self.assertEqual(modgraph.identifier_words("allGPUs"), ["all", "gpus"])
        self.assertEqual(modgraph.identifier_words("GPUState"), ["gpu", "state"])
        self.assertEqual(modgraph.identifier_words("open_gpu0"), ["open", "gpu", "0"])
        self.assertEqual(modgraph.identifier_words("MAX_MPS_CLIENTS"), ["max", "mps", "clients"])

    def test_a_vendor_word_in_an_identifier_is_a_crossing(self):
        found = self.words(
            {
                "src/lib.rs": "pub mod slices;\npub struct MigSlice;\n",
                "src/slices.rs": "fn open_nvml() {}\nconst MAX_GPUS: u32 = 8;\n",
                "tests/it.rs": "fn t() { let cudaCtx = 1; }\n",
            }
        )
        self.assertEqual(
            found,
            [
                "dra/src/lib.rs:2: `MigSlice` (mig)",
                "dra/src/slices.rs:1: `open_nvml` (nvml)",
                "dra/src/slices.rs:2: `MAX_GPUS` (gpus)",
                "dra/tests/it.rs:1: `cudaCtx` (cuda)",
            ],
        )

    def test_words_inside_other_words_comments_and_strings_are_not(self):
        files = {
            "src/lib.rs": textwrap.dedent(
                """\
                //! Serves any device: a GPU, say.
                use tokio::sync::mpsc;
                fn migrate(gpuless: bool) -> &'static str { "gpu-0-mig-1g.10gb" }
                /* nvml */
                """
            ),
            "target/debug/build/gen.rs": "struct MigFromABuildScript;\n",
        }
        self.assertEqual(self.words(files), [])

    def test_a_banned_crate_is_found_directly_or_through_the_workspace(self):
        root = Path("/ws")
        packages = [
            package("dra-plugin", root / "dra", [("das-runtime", None), ("tokio", None), ("das-driver", "dev")]),
            package("das-runtime", root / "runtime", [("das-api", None), ("tokio", None)]),
            package("das-api", root / "api", [("serde", None)]),
            package("das-driver", root / "driver", [("nvml-wrapper", None), ("dra-plugin", None)]),
        ]
        self.assertEqual(
            modgraph.dependency_violations(packages, "dra-plugin", self.RULE["deps_not"]),
            ["dra-plugin -> das-driver", "dra-plugin -> das-runtime -> das-api"],
        )

    def test_dev_dependencies_of_other_crates_do_not_count(self):
        root = Path("/ws")
        packages = [
            package("dra-plugin", root / "dra", [("das-proto", None)]),
            package("das-proto", root / "proto", [("tonic", None), ("das-api", "dev")]),
        ]
        self.assertEqual(modgraph.dependency_violations(packages, "dra-plugin", self.RULE["deps_not"]), [])

    def test_the_workspace_keeps_its_boundaries(self):
        """The real workspace, as `make lint` checks it."""
        meta = modgraph.json.loads(
            modgraph.subprocess.check_output(
                ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"], cwd=modgraph.ROOT
            )
        )
        self.assertEqual(modgraph.boundary_violations(meta["packages"], modgraph.ROOT), [])


KINDS = {
    "lib.rs": "pub mod claims;\n",
    "claims/mod.rs": "pub mod kinds;\npub mod preparer;\n",
    "claims/kinds/mod.rs": "pub mod a;\npub mod b;\npub use a::A;\npub trait Kind {}\npub struct Kinds;\n"
                           "fn standard() { let _ = (a::A, b::B); }\n",
    "claims/kinds/a/mod.rs": "mod x;\nmod y;\nuse super::Kind;\npub struct A;\n",
    "claims/kinds/a/x.rs": "use super::y::Z;\n",
    "claims/kinds/a/y.rs": "pub struct Z;\n",
    "claims/kinds/b.rs": "use crate::claims::kinds::Kind;\npub struct B;\n",
    "claims/preparer.rs": "use super::kinds::{Kind, Kinds};\n",
}


def breaches(files: dict[str, str]) -> list[str]:
    return modgraph.isolation_breaches(crate(files), [("claims", "kinds")])


class Isolated(unittest.TestCase):
    def test_kinds_that_use_the_folders_vocabulary_and_their_own_parts_are_kept(self):
        self.assertEqual(breaches(KINDS), [])

    def test_a_kind_naming_another_breaks_it_either_way(self):
        files = dict(KINDS, **{"claims/kinds/b.rs": "use super::a::A;\npub struct B;\n"})
        self.assertEqual(breaches(files), ["claims::kinds: b names its sibling a (in claims::kinds::b)"])
        files = dict(KINDS, **{"claims/kinds/a/y.rs": "pub struct Z;\nfn f() { crate::claims::kinds::b::B; }\n"})
        self.assertEqual(breaches(files), ["claims::kinds: a names its sibling b (in claims::kinds::a::y)"])

    def test_outside_code_reaches_a_kind_only_through_the_folder(self):
        files = dict(KINDS, **{"claims/preparer.rs": "use super::kinds::b::B;\n"})
        self.assertEqual(breaches(files), ["claims::kinds: claims::preparer names claims::kinds::b, not through claims::kinds"])
        # A re-export of a kind's item by the folder is followed to the kind.
        files = dict(KINDS, **{"claims/preparer.rs": "use super::kinds::A;\n"})
        self.assertEqual(breaches(files), ["claims::kinds: claims::preparer names claims::kinds::a, not through claims::kinds"])

    def test_tests_may_reach_a_kind(self):
        files = dict(KINDS, **{"claims/preparer.rs": "#[cfg(test)]\nmod tests { use crate::claims::kinds::b::B; }\n"})
        self.assertEqual(breaches(files), [])

    def test_a_crate_without_the_folder_has_nothing_to_keep(self):
        self.assertEqual(breaches({"lib.rs": "pub mod a;\n", "a.rs": ""}), [])


if __name__ == "__main__":
    unittest.main()
