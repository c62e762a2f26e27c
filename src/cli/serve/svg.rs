//! Inline SVG drawings: the fork tree (one box per session linking to its page, one edge
//! per fork labelled with its fork point) and horizontal bar charts. Presentation lives in
//! the stylesheet (classes), so no inline style is needed under the CSP; every label is
//! escaped by maud. SVG elements are always closed (`<rect …></rect>`): an HTML parser
//! does not treat `<rect …>` as self-closing inside `<svg>`.

use std::collections::BTreeMap;

use maud::{Markup, html};
use session_store::{KindStats, SessionId};

use super::links;
use super::templates::{clip, title_or_id};
use super::tree::{ForkTree, Relation};
use crate::cli::{human_bytes, shown};

/// Fork tree geometry (px).
const NODE_W: f64 = 230.0;
const NODE_H: f64 = 50.0;
const COLUMN: f64 = 320.0;
const ROW: f64 = 70.0;
const MARGIN: f64 = 16.0;

/// Bar chart geometry (px).
const LABEL_W: f64 = 190.0;
const BAR_W: f64 = 460.0;
const VALUE_W: f64 = 110.0;
const BAR_ROW: f64 = 26.0;
const BAR_H: f64 = 18.0;

/// Children of each node, in edge order.
type Children<'a> = BTreeMap<&'a SessionId, Vec<&'a SessionId>>;

/// Places `id` and its subtree: a leaf takes the next free row, a parent the middle of its
/// children's rows (a tidy layered tree). A node is placed once, so a cycle cannot loop.
fn place<'a>(
    id: &'a SessionId,
    children: &Children<'a>,
    placed: &mut BTreeMap<&'a SessionId, f64>,
    next: &mut f64,
) -> f64 {
    placed.insert(id, *next);
    let mut own = Vec::new();
    for kid in children.get(id).into_iter().flatten() {
        if !placed.contains_key(kid) {
            own.push(place(kid, children, placed, next));
        }
    }
    let row = match (own.first(), own.last()) {
        (Some(a), Some(b)) => (a + b) / 2.0,
        _ => {
            *next += 1.0;
            *next - 1.0
        }
    };
    placed.insert(id, row);
    row
}

/// The row of each node of the tree.
fn rows(tree: &ForkTree) -> BTreeMap<&SessionId, f64> {
    let mut children: Children<'_> = BTreeMap::new();
    for e in &tree.edges {
        children.entry(&e.parent).or_default().push(&e.child);
    }
    let mut placed = BTreeMap::new();
    let mut next = 0.0;
    for node in &tree.nodes {
        if !tree.edges.iter().any(|e| e.child == node.session_id) {
            place(&node.session_id, &children, &mut placed, &mut next);
        }
    }
    placed
}

/// The fork tree as an SVG graph.
pub fn fork_tree(tree: &ForkTree) -> Markup {
    let rows = rows(tree);
    let at = |id: &SessionId| -> Option<(f64, f64)> {
        let node = tree.nodes.iter().find(|n| n.session_id == *id)?;
        let row = rows.get(id)?;
        Some((MARGIN + node.generation as f64 * COLUMN, MARGIN + row * ROW))
    };
    let columns = tree.nodes.iter().map(|n| n.generation).max().unwrap_or(0) as f64 + 1.0;
    let height = rows.values().fold(0.0_f64, |m, r| m.max(*r)) + 1.0;
    let (w, h) = (
        2.0 * MARGIN + (columns - 1.0) * COLUMN + NODE_W,
        2.0 * MARGIN + (height - 1.0) * ROW + NODE_H,
    );
    html! {
        svg.tree xmlns="http://www.w3.org/2000/svg" width=(w) height=(h)
            viewBox=(format!("0 0 {w} {h}")) role="group" aria-label="Fork tree" {
            @for e in &tree.edges {
                @if let (Some((px, py)), Some((cx, cy))) = (at(&e.parent), at(&e.child)) {
                    @let (x1, y1, x2, y2) = (px + NODE_W, py + NODE_H / 2.0, cx, cy + NODE_H / 2.0);
                    @let mid = (x1 + x2) / 2.0;
                    g.edge data-parent=(e.parent.as_str()) data-child=(e.child.as_str()) {
                        title { (shown(&e.parent)) " → " (shown(&e.child)) ": " (e.label) }
                        path d=(format!("M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}")) {}
                        text x=(x2 - 8.0) y=(y2 - 6.0) text-anchor="end" { (clip(&e.label, 14)) }
                    }
                }
            }
            @for n in &tree.nodes {
                @if let Some((x, y)) = at(&n.session_id) {
                    @let relation = match n.relation {
                        Relation::Ancestor => "ancestor",
                        Relation::Focus => "focus",
                        Relation::Sibling => "sibling",
                        Relation::Descendant => "descendant",
                    };
                    a href=(links::session(&n.session_id)) {
                        g class=(format!("node {relation}{}", if n.live { " live" } else { "" }))
                            data-id=(n.session_id.as_str()) {
                            title { (shown(&n.session_id)) " (" (n.origin.as_str()) ", " (relation) ")" }
                            rect x=(x) y=(y) width=(NODE_W) height=(NODE_H) rx="6" {}
                            text.node-title x=(x + 10.0) y=(y + 21.0) {
                                (clip(&title_or_id(&n.title, &n.session_id), 30))
                            }
                            text.node-id x=(x + 10.0) y=(y + 39.0) {
                                (clip(&shown(&n.session_id), 24)) " · " (n.origin.as_str())
                                @if n.live { " · live" }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A horizontal bar chart: one row per label, its segments stacked (classes `seg0`,
/// `seg1`, …), the total printed after the bar by `show`.
fn stacked(rows: &[(&str, Vec<u64>)], legend: &[&str], show: fn(u64) -> String) -> Markup {
    let max = rows
        .iter()
        .map(|(_, s)| s.iter().sum::<u64>())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let legend_h = if legend.is_empty() { 0.0 } else { BAR_ROW };
    let w = LABEL_W + BAR_W + VALUE_W;
    let h = legend_h + rows.len() as f64 * BAR_ROW + 4.0;
    // An image's parts are hidden from assistive technology: its name says what it shows.
    let described: Vec<String> = rows
        .iter()
        .map(|(label, segments)| {
            let total = show(segments.iter().sum());
            let parts: Vec<String> = legend
                .iter()
                .zip(segments)
                .map(|(name, v)| format!("{name} {}", show(*v)))
                .collect();
            match parts.is_empty() {
                true => format!("{label}: {total}"),
                false => format!("{label}: {total} ({})", parts.join(", ")),
            }
        })
        .collect();
    html! {
        svg.bars xmlns="http://www.w3.org/2000/svg" width=(w) height=(h)
            viewBox=(format!("0 0 {w} {h}")) role="img"
            aria-label=(format!("Bar chart: {}", described.join("; "))) {
            @for (i, name) in legend.iter().enumerate() {
                @let x = LABEL_W + i as f64 * 140.0;
                rect class=(format!("seg{i}")) x=(x) y="4" width="14" height="14" {}
                text.legend x=(x + 20.0) y="16" { (name) }
            }
            @for (i, (label, segments)) in rows.iter().enumerate() {
                @let y = legend_h + i as f64 * BAR_ROW;
                g.bar {
                    text.label x=(LABEL_W - 8.0) y=(y + 14.0) text-anchor="end" { (clip(label, 26)) }
                    @for (k, x, width) in segments.iter().enumerate().scan(LABEL_W, |x, (k, v)| {
                        let width = *v as f64 / max * BAR_W;
                        let start = *x;
                        *x += width;
                        Some((k, start, width))
                    }) {
                        rect class=(format!("seg{k}")) x=(x) y=(y + 1.0) width=(width) height=(BAR_H) {}
                    }
                    text.value x=(LABEL_W + BAR_W + 6.0) y=(y + 14.0) { (show(segments.iter().sum())) }
                }
            }
        }
    }
}

/// Bytes by event kind: inline payload bytes and blob bytes, stacked.
pub fn kind_chart(kinds: &[KindStats]) -> Markup {
    let rows: Vec<(&str, Vec<u64>)> = kinds
        .iter()
        .map(|k| (k.kind.as_str(), vec![k.inline_bytes, k.blob_bytes]))
        .collect();
    stacked(&rows, &["inline", "in blobs (raw)"], human_bytes)
}

/// One bar per `(label, bytes)`.
pub fn bars(rows: &[(&str, u64)]) -> Markup {
    single(rows, human_bytes)
}

/// One bar per `(label, count)`.
pub fn count_bars(rows: &[(&str, u64)]) -> Markup {
    single(rows, |n| n.to_string())
}

/// One bar per `(label, value)`, the value printed by `show`.
fn single(rows: &[(&str, u64)], show: fn(u64) -> String) -> Markup {
    let rows: Vec<(&str, Vec<u64>)> = rows.iter().map(|(l, v)| (*l, vec![*v])).collect();
    stacked(&rows, &[], show)
}
