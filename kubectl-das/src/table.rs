//! Column-aligned text tables as kubectl prints them (upper-case headers, columns three spaces
//! apart), with optional terminal styles that do not count towards the width.

use anstyle::Style;

/// One cell: its text and the style to print it in (plain when colour is off).
#[derive(Debug, Clone, Default)]
pub struct Cell {
    pub text: String,
    pub style: Style,
}

impl From<String> for Cell {
    fn from(text: String) -> Self {
        Self {
            text,
            style: Style::new(),
        }
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Self {
        text.to_string().into()
    }
}

impl Cell {
    pub fn styled(text: impl Into<String>, style: Style) -> Self {
        Self {
            text: text.into(),
            style,
        }
    }
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
            if color {
                line.push_str(&format!("{}{}{:#}", cell.style, cell.text, cell.style));
            } else {
                line.push_str(&cell.text);
            }
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
}
