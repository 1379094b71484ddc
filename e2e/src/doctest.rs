//! The docs, tested: shell blocks marked runnable are run against the local cluster, and the
//! README's demo output is checked against what the demo prints.
//!
//! A fenced block whose info string is `sh doctest` (GitHub shows it as `sh`) is run with
//! `bash -euo pipefail` in the workspace root, with `KUBECONFIG` set to the cluster's and
//! `.local/bin` (kubectl, helm) first on `PATH`. Placeholders a reader fills in (`<node>`,
//! `<pod>`, …) are replaced with values of the cluster the test set up ([`Placeholders`]); a
//! block with any other `<…>` placeholder is refused, so a marked block cannot silently test
//! less than it shows.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The info string that marks a runnable block.
pub const MARKER: &str = "sh doctest";

/// The info string of the README's demo output block.
pub const DEMO_OUTPUT_MARKER: &str = "text demo-output";

/// A runnable block: where it is and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// File, relative to the workspace root.
    pub file: String,
    /// Line of the opening fence (1-based).
    pub line: usize,
    /// The block's text.
    pub text: String,
}

/// The blocks of `markdown` whose info string is `info`.
pub fn blocks(file: &str, markdown: &str, info: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (i, line) in markdown.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(rest)) if rest.trim() == info => open = Some((i + 1, String::new())),
            (None, Some(_)) => {
                // Another fenced block: skip to its end so its content is not read as fences.
                open = Some((0, String::new()));
            }
            // Only a bare fence closes a block (CommonMark): "```sh" inside one is its text.
            (Some((start, text)), Some(rest)) if rest.trim_start_matches('`').trim().is_empty() => {
                if *start > 0 {
                    out.push(Block {
                        file: file.to_string(),
                        line: *start,
                        text: std::mem::take(text),
                    });
                }
                open = None;
            }
            (Some((_, text)), _) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

/// Values for the placeholders a marked block may use.
#[derive(Debug, Clone)]
pub struct Placeholders(pub Vec<(&'static str, String)>);

impl Placeholders {
    /// `block` with every placeholder replaced; an error naming any `<…>` left.
    pub fn fill(&self, block: &Block) -> Result<String> {
        let mut text = block.text.clone();
        for (name, value) in &self.0 {
            text = text.replace(name, value);
        }
        if let Some(left) = unknown_placeholder(&text) {
            bail!(
                "{}:{}: placeholder {left} has no value in the doc test (known: {})",
                block.file,
                block.line,
                self.0.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(" ")
            );
        }
        Ok(text)
    }
}

/// The first `<word…>` in `text` that looks like a reader's placeholder (letters, spaces,
/// dashes), not a shell redirection.
fn unknown_placeholder(text: &str) -> Option<String> {
    let mut rest = text;
    while let Some(start) = rest.find('<') {
        let after = &rest[start + 1..];
        if let Some(end) = after.find('>') {
            let inner = &after[..end];
            if !inner.is_empty()
                && inner.starts_with(|c: char| c.is_ascii_alphabetic())
                && inner
                    .chars()
                    .all(|c| c.is_ascii_alphabetic() || c == ' ' || c == '-')
            {
                return Some(format!("<{inner}>"));
            }
        }
        rest = after;
    }
    None
}

/// Markdown files that may hold marked blocks: README.md and docs/**/*.md.
pub fn doc_files(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
            let p = e?.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Every marked block of the docs under `root`.
pub fn runnable_blocks(root: &Path) -> Result<Vec<Block>> {
    let mut out = Vec::new();
    for f in doc_files(root)? {
        let text = std::fs::read_to_string(&f)?;
        let rel = f.strip_prefix(root).unwrap_or(&f).display().to_string();
        out.extend(blocks(&rel, &text, MARKER));
    }
    Ok(out)
}

/// Runs `script` with bash in `root`, against the cluster of `kubeconfig`; its output, or an
/// error with it. `kubectl` is the local cluster's, and `kubectl das` finds the debug build of
/// `kubectl-das`.
pub fn run(root: &Path, kubeconfig: &Path, script: &str) -> Result<String> {
    let path = format!(
        "{}:{}:{}",
        root.join(".local/bin").display(),
        crate::paths::target_dir().join("debug").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(root)
        .env("KUBECONFIG", kubeconfig)
        .env("PATH", path)
        .output()
        .context("run bash")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("exit {}:\n{script}\n--- output ---\n{text}", out.status);
    }
    Ok(text)
}

/// What of `kubectl das gpus` and `kubectl das free` (what `make demo` prints, in `output`) the
/// README's demo block must show: their table headers (the same words; their padding follows the
/// widest cell of the table), and a memory-slice picture row
/// for every GPU with as many cells (which pod lands where depends on scheduling order, so the
/// cells' letters and the free counts are not compared). Returns what is missing from
/// `readme_block`.
pub fn missing_from_readme(output: &str, readme_block: &str) -> Vec<String> {
    let readme: Vec<&str> = readme_block.lines().map(str::trim).collect();
    let readme_rows: Vec<String> = readme.iter().filter_map(|l| picture_row(l)).collect();
    // A header's padding follows the widest cell of its table, which other rows decide.
    let readme_headers: Vec<String> = readme.iter().map(|l| collapsed(l)).collect();
    let mut missing = Vec::new();
    for line in output.lines().map(str::trim) {
        let header = line.chars().filter(char::is_ascii_alphabetic).count() > 1
            && line == line.to_uppercase();
        if header && !readme_headers.contains(&collapsed(line)) {
            missing.push(line.to_string());
        } else if let Some(row) = picture_row(line)
            && !readme_rows.contains(&row)
        {
            missing.push(line.to_string());
        }
    }
    missing
}

/// `line` with every run of spaces one space.
fn collapsed(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A picture row (`n0   gpu-0   NVIDIA H100 80GB HBM3   [. A B B]`) as its label, spaces
/// collapsed, and cell count (`n0 gpu-0 NVIDIA H100 80GB HBM3 [4]`).
fn picture_row(line: &str) -> Option<String> {
    let (label, cells) = line.split_once('[')?;
    let cells = cells.strip_suffix(']')?;
    Some(format!(
        "{} [{}]",
        label.split_whitespace().collect::<Vec<_>>().join(" "),
        cells.split_whitespace().count()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "text\n```sh doctest\nkubectl get pods -n <ns>\n```\n```sh\nnot run\n```\n```text\n```sh doctest\n```\n  ```sh doctest\necho two\n  ```\n";

    #[test]
    fn only_marked_blocks_are_found_and_fences_inside_other_blocks_are_text() {
        let b = blocks("d.md", DOC, MARKER);
        assert_eq!(b.len(), 2, "{b:?}");
        assert_eq!(b[0].line, 2);
        assert_eq!(b[0].text, "kubectl get pods -n <ns>\n");
        assert_eq!(b[1].text, "echo two\n");
    }

    #[test]
    fn placeholders_are_filled_and_unknown_ones_refused() {
        let p = Placeholders(vec![("<ns>", "default".into())]);
        let b = &blocks("d.md", DOC, MARKER)[0];
        assert_eq!(p.fill(b).unwrap(), "kubectl get pods -n default\n");
        let unknown = Block {
            text: "kubectl logs <plugin pod> 2>/dev/null\n".into(),
            ..b.clone()
        };
        let err = p.fill(&unknown).unwrap_err().to_string();
        assert!(
            err.contains("<plugin pod>") && err.contains("d.md:2"),
            "{err}"
        );
        let redirect = Block {
            text: "echo a <<EOF\nx\nEOF\ncat < /dev/null\n".into(),
            ..b.clone()
        };
        assert!(p.fill(&redirect).is_ok());
    }

    #[test]
    fn the_readme_must_show_the_headers_and_a_row_per_gpu() {
        let output = "NODE   GPU     PRODUCT   MEMORY SLICES\nn0     gpu-0   X 40GB    [A .]\n\n    NAMESPACE   POD\nA   default     x-abcde\nNODE   PROFILE   FREE\nn0     1g.10gb   1\n";
        let readme = "NODE   GPU     PRODUCT   MEMORY SLICES\nn0     gpu-0   X 40GB    [. A]\n    NAMESPACE   POD\nA   default     x-zzzzz\nNODE   PROFILE   FREE\nn0     1g.10gb   0\n";
        assert!(missing_from_readme(output, readme).is_empty());
        // A wider column in the README (a longer pod there) pads its header otherwise.
        let padded = readme.replace("    NAMESPACE   POD", "    NAMESPACE          POD");
        assert!(missing_from_readme(output, &padded).is_empty());
        let stale = "NODE GPU PRODUCT SLICES\nn0     gpu-0   X 40GB    [A . .]\n";
        assert_eq!(
            missing_from_readme(output, stale),
            [
                "NODE   GPU     PRODUCT   MEMORY SLICES",
                "n0     gpu-0   X 40GB    [A .]",
                "NAMESPACE   POD",
                "NODE   PROFILE   FREE"
            ]
        );
    }
}
