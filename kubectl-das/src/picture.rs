//! `kubectl das gpus`: every GPU's memory slices as a row of cells, a letter for each slice a
//! pod holds (a whole GPU held by one pod: its letter on every cell; a GPU without MIG, a T4 or
//! an L4, is one cell), and a legend of who holds what. A shared slice (docs/design.md §7, "Shared slices") is one letter whose legend names
//! every claim holding a share and its shares (`shared: s1 (1 of 4 shares), s2 (2 of 4 shares)`).
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
            // The shares of one shareable device hold its memory slices once.
            let used: u32 = slots(&held).iter().map(|s| s[0].size).sum();
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
    (h.namespace.clone(), who(h))
}

fn who(h: &Held) -> String {
    if h.pods.len() > 1 {
        h.pods.join(", ")
    } else {
        h.pod
            .clone()
            .unwrap_or_else(|| format!("(claim {})", h.claim))
    }
}

/// `held` (sorted by start) cut into what holds each slice: one [`Held`] for a slice or GPU
/// one claim holds, every share for a shareable device (docs/design.md §7, "Shared slices"),
/// whose claims hold one slice together.
pub fn slots(held: &[Held]) -> Vec<Vec<&Held>> {
    let mut out: Vec<Vec<&Held>> = Vec::new();
    for h in held {
        match out.last_mut() {
            Some(last)
                if h.share.is_some()
                    && last[0].share.is_some()
                    && (&last[0].node, last[0].gpu, &last[0].device)
                        == (&h.node, h.gpu, &h.device) =>
            {
                last.push(h)
            }
            _ => out.push(vec![h]),
        }
    }
    out
}

/// The legend's holder of a shared slice: the namespace (`-` when the shares' differ) and
/// `shared: <who> (<k> of <n> shares), …`, each share's holder qualified with its namespace when
/// they differ; `hidden` shares of other namespaces are counted, not named.
fn share_holder(shares: &[&Held], hidden: usize) -> (String, String) {
    let one_ns = shares.iter().all(|h| h.namespace == shares[0].namespace);
    let mut parts: Vec<String> = shares
        .iter()
        .map(|h| {
            let who = if one_ns {
                who(h)
            } else {
                format!("{}/{}", h.namespace, who(h))
            };
            match &h.share {
                Some(s) => match s.of {
                    Some(of) => format!("{who} ({} of {of} shares)", s.shares),
                    None => format!("{who} ({} shares)", s.shares),
                },
                None => who,
            }
        })
        .collect();
    if hidden > 0 {
        parts.push(format!("{hidden} of another namespace"));
    }
    let ns = if one_ns {
        shares[0].namespace.clone()
    } else {
        "-".into()
    };
    (ns, format!("shared: {}", parts.join(", ")))
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
    let mut legend = Legend::default();
    let mut rows: Vec<Vec<Cell>> = vec![gpu_header(opts)];
    for p in pics {
        let cells = legend.paint(p, opts);
        rows.push(gpu_row(p, &cells, opts));
    }
    let mut out = render(&rows, opts.color);
    if legend.foreign {
        out.push_str("(# = held by a claim of another namespace)\n");
    }
    if legend.entries.is_empty() {
        out.push_str("\nNo slices are held");
        out.push_str(if legend.foreign {
            " in this namespace.\n"
        } else {
            ".\n"
        });
        return out;
    }
    out.push('\n');
    out.push_str(&legend.render(opts));
    out
}

/// The picture's header: `NODE GPU PRODUCT [UUID] MEMORY SLICES`.
fn gpu_header(opts: &Options) -> Vec<Cell> {
    let mut h = vec!["NODE", "GPU", "PRODUCT", "MEMORY SLICES"];
    if opts.wide {
        h.insert(3, "UUID");
    }
    h.into_iter().map(Cell::from).collect()
}

/// GPU `p`'s row of the picture, its memory slices drawn as `cells`.
fn gpu_row(p: &GpuPicture, cells: &[Cell], opts: &Options) -> Vec<Cell> {
    let mut row: Vec<Cell> = vec![
        p.gpu.node.clone().into(),
        format!("gpu-{}", p.gpu.index).into(),
        p.gpu.product.clone().into(),
    ];
    if opts.wide {
        row.push(p.gpu.uuid.clone().into());
    }
    row.push(picture_cell(cells, opts.color));
    row
}

/// Who holds what, gathered while the GPUs are painted in order.
#[derive(Default)]
struct Legend<'a> {
    /// Each holder (namespace, who) once, in order of first appearance: its index is its
    /// [`symbol`].
    holders: Vec<(String, String)>,
    /// A holder's index and what it holds: one Held, or the shares of one shared slice.
    entries: Vec<(usize, Vec<&'a Held>)>,
    /// A slot held only by claims of other namespaces was drawn as `#`.
    foreign: bool,
}

impl<'a> Legend<'a> {
    /// GPU `p`'s memory slices as cells: `.` free, the holder's symbol, `#` for a slot of
    /// another namespace (`-n`); each holder drawn is entered in the legend.
    fn paint(&mut self, p: &'a GpuPicture, opts: &Options) -> Vec<Cell> {
        let mut cells: Vec<Cell> =
            vec![Cell::styled(".", Style::new().dimmed()); p.gpu.memory_slices as usize];
        for slot in slots(&p.held) {
            let h = slot[0];
            let cell = self.slot_cell(&slot, opts);
            for s in h.start..h.start + h.size {
                if let Some(c) = cells.get_mut(s as usize) {
                    *c = cell.clone();
                }
            }
        }
        cells
    }

    /// The cell of one slot (a slice, a GPU, or the shares of one shared slice).
    fn slot_cell(&mut self, slot: &[&'a Held], opts: &Options) -> Cell {
        let h = slot[0];
        // Of a shared slice, the shares of the namespace shown (`-n`); `#` if none is.
        let mine: Vec<&Held> = slot
            .iter()
            .copied()
            .filter(|h| opts.namespace.as_ref().is_none_or(|ns| *ns == h.namespace))
            .collect();
        if mine.is_empty() {
            self.foreign = true;
            return Cell::styled("#", Style::new().dimmed());
        }
        let who = if h.share.is_some() {
            share_holder(&mine, slot.len() - mine.len())
        } else {
            holder(h)
        };
        let i = self
            .holders
            .iter()
            .position(|x| *x == who)
            .unwrap_or_else(|| {
                self.holders.push(who);
                self.holders.len() - 1
            });
        self.entries.push((i, mine));
        Cell::styled(symbol(i).to_string(), holder_style(i))
    }

    /// The legend table: a row per entry, by symbol, then node, GPU and start.
    fn render(mut self, opts: &Options) -> String {
        self.entries
            .sort_by_key(|(i, h)| (*i, h[0].node.clone(), h[0].gpu, h[0].start));
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
        let mut rows: Vec<Vec<Cell>> = vec![h.into_iter().map(Cell::from).collect()];
        for (i, held) in &self.entries {
            rows.push(legend_row(*i, held, &self.holders[*i], opts));
        }
        render(&rows, opts.color)
    }
}

/// The legend's row of holder `i` (`holder`: namespace, who) holding `held`.
fn legend_row(i: usize, held: &[&Held], holder: &(String, String), opts: &Options) -> Vec<Cell> {
    let h = held[0];
    let (ns, who) = holder;
    let mig_uuid = h.mig_uuid.clone().unwrap_or_else(|| {
        if h.is_whole_gpu() {
            "(whole GPU)".into()
        } else {
            "(not carved yet)".into()
        }
    });
    let mut row: Vec<Cell> = vec![
        Cell::styled(symbol(i).to_string(), holder_style(i)),
        ns.clone().into(),
        who.clone().into(),
        h.profile.clone().into(),
        format!("{} gpu-{}", h.node, h.gpu).into(),
        h.start.to_string().into(),
        mig_uuid.into(),
    ];
    if opts.wide {
        let claims: Vec<&str> = held.iter().map(|h| h.claim.as_str()).collect();
        row.push(claims.join(", ").into());
        row.push(h.device.clone().into());
    }
    row
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
