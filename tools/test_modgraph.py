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
