//! `kubectl das gpus`: every GPU's memory slices as a row of cells, a letter for each slice a
//! pod holds (a whole GPU held by one pod: its letter on every cell), and a legend of who holds
//! what.
//!
//! ```text
//! NODE   GPU     PRODUCT                  MEMORY SLICES
//! n0     gpu-0   NVIDIA A100-SXM4-40GB    [. A B B B B B B]
//!
//!      NAMESPACE   POD            PROFILE   GPU        START   MIG UUID
//! A    default     legacy-slice   1g.5gb    n0 gpu-0   1       MIG-…
//! ```

use anstyle::{AnsiColor, Style};
use serde::Serialize;

use crate::inventory::{GpuInfo, Held, Inventory};
use crate::table::{Cell, render};

/// One GPU and the slices held on it: the `-o json|yaml` shape of `kubectl das gpus`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuPicture {
    #[serde(flatten)]
    pub gpu: GpuInfo,
    /// Memory slices not held by any slice.
    pub free_memory_slices: u32,
    pub held: Vec<Held>,
}

/// What to show.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Only this node's GPUs.
    pub node: Option<String>,
    /// Slices of claims in other namespaces are drawn as `#` and left out of the legend.
    pub namespace: Option<String>,
    /// Also the GPU UUID and the device names.
    pub wide: bool,
    /// Terminal colours.
    pub color: bool,
}

/// The GPUs to show, each with the slices held on it (all namespaces: occupancy is per node).
pub fn pictures(inv: &Inventory, node: Option<&str>) -> Vec<GpuPicture> {
    inv.gpus
        .iter()
        .filter(|g| node.is_none_or(|n| g.node == n))
        .map(|g| {
            let held: Vec<Held> = inv
                .held
                .iter()
                .filter(|h| h.node == g.node && h.gpu == g.index)
                .cloned()
                .collect();
            let used: u32 = held.iter().map(|h| h.size).sum();
            GpuPicture {
                gpu: g.clone(),
                free_memory_slices: g.memory_slices.saturating_sub(used),
                held,
            }
        })
        .collect()
}

/// The symbol of the `i`-th holder: `A`–`Z`, `a`–`z`, `0`–`9`, then `+` for every later one
/// (the legend still names them).
pub fn symbol(i: usize) -> char {
    const SYMBOLS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    SYMBOLS.get(i).map_or('+', |&b| char::from(b))
}

/// Who holds a slice, as the legend names it: the pod (every pod, comma-separated, when several
/// share the claim), or the claim while no pod has it reserved.
fn holder(h: &Held) -> (String, String) {
    let who = if h.pods.len() > 1 {
        h.pods.join(", ")
    } else {
        h.pod
            .clone()
            .unwrap_or_else(|| format!("(claim {})", h.claim))
    };
    (h.namespace.clone(), who)
}

const PALETTE: [AnsiColor; 6] = [
    AnsiColor::Cyan,
    AnsiColor::Yellow,
    AnsiColor::Magenta,
    AnsiColor::Green,
    AnsiColor::Blue,
    AnsiColor::Red,
];

fn holder_style(i: usize) -> Style {
    Style::new()
        .bold()
        .fg_color(Some(PALETTE[i % PALETTE.len()].into()))
}

/// The picture and its legend as text. Holders get their symbols in the order they first
/// appear (node, GPU, memory slice), so the same occupancy always draws the same.
pub fn render_text(pics: &[GpuPicture], opts: &Options) -> String {
    let mut holders: Vec<(String, String)> = Vec::new();
    let mut legend: Vec<(usize, &Held)> = Vec::new();
    let mut foreign = false;
    let mut rows: Vec<Vec<Cell>> = vec![{
        let mut h = vec!["NODE", "GPU", "PRODUCT", "MEMORY SLICES"];
        if opts.wide {
            h.insert(3, "UUID");
        }
        h.into_iter().map(Cell::from).collect()
    }];
    for p in pics {
        let mut cells: Vec<Cell> =
            vec![Cell::styled(".", Style::new().dimmed()); p.gpu.memory_slices as usize];
        for h in &p.held {
            let cell = if opts.namespace.as_ref().is_some_and(|ns| *ns != h.namespace) {
                foreign = true;
                Cell::styled("#", Style::new().dimmed())
            } else {
                let who = holder(h);
                let i = holders.iter().position(|x| *x == who).unwrap_or_else(|| {
                    holders.push(who);
                    holders.len() - 1
                });
                legend.push((i, h));
                Cell::styled(symbol(i).to_string(), holder_style(i))
            };
            for s in h.start..h.start + h.size {
                if let Some(c) = cells.get_mut(s as usize) {
                    *c = cell.clone();
                }
            }
        }
        let mut row: Vec<Cell> = vec![
            p.gpu.node.clone().into(),
            format!("gpu-{}", p.gpu.index).into(),
            p.gpu.product.clone().into(),
        ];
        if opts.wide {
            row.push(p.gpu.uuid.clone().into());
        }
        row.push(picture_cell(&cells, opts.color));
        rows.push(row);
    }
    let mut out = render(&rows, opts.color);
    if foreign {
        out.push_str("(# = held by a claim of another namespace)\n");
    }
    if legend.is_empty() {
        out.push_str("\nNo slices are held");
        out.push_str(if foreign {
            " in this namespace.\n"
        } else {
            ".\n"
        });
        return out;
    }
    legend.sort_by_key(|(i, h)| (*i, h.node.clone(), h.gpu, h.start));
    let mut rows: Vec<Vec<Cell>> = vec![{
        let mut h = vec![
            "",
            "NAMESPACE",
            "POD",
            "PROFILE",
            "GPU",
            "START",
            "MIG UUID",
        ];
        if opts.wide {
            h.extend(["CLAIM", "DEVICE"]);
        }
        h.into_iter().map(Cell::from).collect()
    }];
    for (i, h) in legend {
        let (ns, who) = &holders[i];
        let mut row: Vec<Cell> = vec![
            Cell::styled(symbol(i).to_string(), holder_style(i)),
            ns.clone().into(),
            who.clone().into(),
            h.profile.clone().into(),
            format!("{} gpu-{}", h.node, h.gpu).into(),
            h.start.to_string().into(),
            h.mig_uuid
                .clone()
                .unwrap_or_else(|| {
                    if h.is_whole_gpu() {
                        "(whole GPU)".into()
                    } else {
                        "(not carved yet)".into()
                    }
                })
                .into(),
        ];
        if opts.wide {
            row.push(h.claim.clone().into());
            row.push(h.device.clone().into());
        }
        rows.push(row);
    }
    out.push('\n');
    out.push_str(&render(&rows, opts.color));
    out
}

/// `[. A B B]`: the cells in brackets, one space apart, each in its own style.
fn picture_cell(cells: &[Cell], color: bool) -> Cell {
    let mut parts = vec![Cell::from("[")];
    for (i, c) in cells.iter().enumerate() {
        if i > 0 {
            parts.push(Cell::from(" "));
        }
        parts.push(c.clone());
    }
    parts.push(Cell::from("]"));
    // The picture is the last column: its width, styles' codes included, does not matter.
    Cell::concat(&parts, color)
}
