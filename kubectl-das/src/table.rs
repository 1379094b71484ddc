//! Column-aligned text tables as kubectl prints them (upper-case headers, columns three spaces
//! apart), with optional terminal styles that do not count towards the width.
//!
//! Cell texts come from the API server (names, namespaces, product names, UUIDs) and anyone who
//! can write those objects chooses them: every cell is escaped ([`escape`]) when it is made, so
//! a terminal escape sequence or a line break in a name can neither restyle the terminal nor
//! forge a table row.

use anstyle::Style;

/// One cell: its text, escaped, and the style to print it in (plain when colour is off).
#[derive(Debug, Clone, Default)]
pub struct Cell {
    text: String,
    style: Style,
}

impl From<String> for Cell {
    fn from(text: String) -> Self {
        Self::styled(text, Style::new())
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Self {
        Self::styled(text, Style::new())
    }
}

impl Cell {
    /// A cell of `text` (escaped) in `style`.
    pub fn styled(text: impl AsRef<str>, style: Style) -> Self {
        Self {
            text: escape(text.as_ref()),
            style,
        }
    }

    /// `parts` side by side, each in its own style when `color`: one cell of several styles.
    /// Its width counts the styles' codes, so it belongs in the last column.
    pub fn concat(parts: &[Cell], color: bool) -> Self {
        let text = parts.iter().map(|p| p.painted(color)).collect();
        Self {
            text,
            style: Style::new(),
        }
    }

    /// The (escaped) text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The text, wrapped in its style's codes when `color`.
    fn painted(&self, color: bool) -> String {
        if color {
            format!("{}{}{:#}", self.style, self.text, self.style)
        } else {
            self.text.clone()
        }
    }
}

/// `s` with every character a terminal would not just print escaped as Rust writes it in a
/// string (`\n`, `\u{1b}`): control characters (line breaks, ESC, the C1 set) and the invisible
/// ones that reorder or hide text (bidirectional overrides, zero-width characters). Quotes and
/// backslashes stay as they are: a terminal only prints them.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\\' | '"' | '\'') || c.escape_debug().eq([c]) {
            out.push(c);
        } else {
            out.extend(c.escape_debug());
        }
    }
    out
}

/// Rows (the first is the header) as aligned text; styles only when `color`. Trailing
/// spaces are trimmed, so the last column is never padded.
pub fn render(rows: &[Vec<Cell>], color: bool) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.text.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            let pad = widths[c] - cell.text.chars().count();
            line.push_str(&cell.painted(color));
            if c + 1 < row.len() {
                line.push_str(&" ".repeat(pad + 3));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_on_plain_width_and_styles_wrap_only_the_text() {
        let bold = Style::new().bold();
        let rows = vec![
            vec![Cell::from("NAME"), Cell::from("X")],
            vec![Cell::styled("a", bold), Cell::from("long")],
        ];
        assert_eq!(render(&rows, false), "NAME   X\na      long\n");
        let colored = render(&rows, true);
        assert!(colored.starts_with("NAME   X\n"), "{colored:?}");
        assert!(
            colored.contains(&format!("{bold}a{bold:#}      long")),
            "{colored:?}"
        );
    }

    #[test]
    fn what_a_terminal_acts_on_is_escaped_and_the_rest_kept() {
        assert_eq!(escape("a\x1b[31mb\nc\rd\te"), r"a\u{1b}[31mb\nc\rd\te");
        assert_eq!(escape("\u{9b}\u{7f}"), r"\u{9b}\u{7f}", "C1 CSI, DEL");
        assert_eq!(escape("ab\u{202e}cd\u{200b}"), r"ab\u{202e}cd\u{200b}");
        let kept = r#"NVIDIA H100 80GB HBM3 "x" \ 'y' é 日本"#;
        assert_eq!(escape(kept), kept);
    }

    #[test]
    fn cells_are_escaped_so_each_row_stays_one_line() {
        let rows = vec![
            vec![Cell::from("NAME"), Cell::from("POD")],
            vec![
                Cell::from("a\nFORGED   row"),
                Cell::styled("\x1b[31mp", Style::new()),
            ],
        ];
        for color in [false, true] {
            let out = render(&rows, color);
            assert_eq!(out.lines().count(), 2, "{out:?}");
            assert!(out.contains(r"a\nFORGED   row   \u{1b}[31mp"), "{out:?}");
            assert!(!out.contains("\x1b[31m"), "{out:?}");
        }
    }
}
