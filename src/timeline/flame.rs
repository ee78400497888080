//! The flame graph of the peak: what was live there, by allocation site (recorded backtraces,
//! outermost frame on top) or, for allocations recorded without one, by scope path. Drawn as
//! nested boxes in plain HTML and CSS (an icicle: callers above callees), each box as wide as
//! the bytes allocated under it; hover one for its name, bytes and share.

use std::collections::BTreeMap;

use crate::allocators::ByteSize;
use crate::history::LiveSet;
use crate::observation::history::pprof::stack_of;

/// Deeper frames are folded into their caller's box.
const MAX_DEPTH: usize = 40;
/// Boxes below this share of the peak are summed into one "(small)" box per parent.
const MIN_SHARE: f64 = 0.002;

#[derive(Default)]
struct Node {
    bytes: u64,
    children: BTreeMap<String, Node>,
}

/// The flame graph of `peak`'s allocations, as an HTML fragment (empty when nothing was live).
pub(crate) fn flame_graph(peak: &LiveSet, escape: impl Fn(&str) -> String) -> String {
    let mut root = Node::default();
    for a in &peak.allocations {
        root.bytes = root.bytes.saturating_add(a.size);
        let stack = stack_of(a.backtrace.as_deref(), a.tag.as_deref());
        let mut node = &mut root;
        for frame in stack.iter().rev().take(MAX_DEPTH) {
            node = node.children.entry(frame.function.clone()).or_default();
            node.bytes = node.bytes.saturating_add(a.size);
        }
    }
    if root.bytes == 0 {
        return String::new();
    }
    let mut out = String::from(
        "<h2>Where the memory live at the peak was allocated</h2><div id=\"flame\" class=\"flame\">\
         <div class=\"kids\">",
    );
    let total = root.bytes;
    children(&root, total, 0, &escape, &mut out);
    out.push_str("</div></div>");
    out
}

fn children(node: &Node, total: u64, depth: usize, escape: &impl Fn(&str) -> String, out: &mut String) {
    let mut small = 0u64;
    let mut kids: Vec<(&String, &Node)> = node.children.iter().collect();
    kids.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then_with(|| a.0.cmp(b.0)));
    for (name, child) in kids {
        if (child.bytes as f64) < total as f64 * MIN_SHARE {
            small += child.bytes;
            continue;
        }
        boxed(name, child.bytes, total, depth, escape, out, |out| {
            if !child.children.is_empty() {
                out.push_str("<div class=\"kids\">");
                children(child, total, depth + 1, escape, out);
                out.push_str("</div>");
            }
        });
    }
    if small > 0 {
        boxed("(small)", small, total, depth, escape, out, |_| {});
    }
    // The bytes allocated in this frame itself leave the rest of its width empty.
    let own = node.bytes.saturating_sub(node.children.values().map(|c| c.bytes).sum());
    if own > 0 && depth > 0 {
        out.push_str(&format!("<div class=\"own\" style=\"flex-grow:{own}\"></div>"));
    }
}

fn boxed(
    name: &str,
    bytes: u64,
    total: u64,
    depth: usize,
    escape: &impl Fn(&str) -> String,
    out: &mut String,
    inner: impl FnOnce(&mut String),
) {
    let share = bytes as f64 * 100.0 / total as f64;
    let hue = 45 + (name.bytes().fold(depth as u32 * 31, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b))) % 240);
    let label = escape(name);
    out.push_str(&format!(
        "<div class=\"fn\" style=\"flex-grow:{bytes}\"><div class=\"name\" style=\"background:hsl({hue},62%,72%)\" \
         title=\"{label}: {} ({share:.1}%)\">{label}</div>",
        ByteSize(bytes)
    ));
    inner(out);
    out.push_str("</div>");
}
