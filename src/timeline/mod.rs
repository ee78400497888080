//! The memory timeline page: a [`History`] drawn as PyTorch's `memory_viz` draws one.
//!
//! [`render_html`] returns one self-contained HTML file (no network, no external script or
//! font): memory in use over time as stacked bands, one per allocation (the largest
//! 2000; smaller ones are summed into one grey "other" band on top), the bytes the allocators
//! reserved from their sources as a red line, OOMs as pink marks; hover a band for its size,
//! scope, allocator, tensor, lifetime and backtrace; scroll to zoom the time axis (event index),
//! drag to pan; a per-tag table below.
//!
//! The page's layout work is done here, in Rust, so a history of 100 000 events or more becomes
//! a page of bounded size that the browser lays out in milliseconds (figures in
//! `BENCHMARKS.md`).
//!
//! ```
//! use tensormem::history::{History, HistoryEvent};
//! use tensormem::allocators::observe::Action;
//!
//! let ev = |t, action, address, size| HistoryEvent {
//!     time_ns: t, action, address, size, allocator: "cpu".into(),
//!     tag: Some("layer0".into()), description: None, backtrace: None,
//! };
//! let h = History {
//!     version: 1, start_unix_ms: 0, capacity: 8, dropped: 0,
//!     events: vec![ev(0, Action::Alloc, 4096, 100), ev(5, Action::Alloc, 8192, 50), ev(9, Action::Free, 4096, 100)],
//! };
//! let html = tensormem::timeline::render_html(&h);
//! assert!(html.starts_with("<!DOCTYPE html>"));
//! assert!(html.contains("<td>layer0</td>"));
//! assert!(!html.contains("http://") && !html.contains("https://"));
//! ```

mod layout;

use crate::allocators::ByteSize;
use crate::history::History;

const PAGE: &str = include_str!("page.html");

/// Renders `history` as one self-contained HTML page (see the [module docs](self)).
pub fn render_html(history: &History) -> String {
    let (data, tags) = layout::layout(history);
    // Inside a <script> element only "</" can end it early: escape it (JSON allows "<\/").
    let json = serde_json::to_string(&data).unwrap_or_else(|_| "{}".to_owned()).replace("</", "<\\/");
    let summary = format!(
        "{} events ({} dropped before the buffer's start), {} allocations drawn as bands, {} summed as other; \
         peak in use {}",
        history.events.len(),
        history.dropped,
        data.bands.len(),
        data.other_count,
        ByteSize(data.peak)
    );
    let mut table = String::from(
        "<table id=\"tags\"><thead><tr><th>scope</th><th>allocations</th><th>bytes allocated</th>\
         <th>peak in use</th><th>live at end</th></tr></thead><tbody>",
    );
    for t in &tags {
        table.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&t.tag),
            t.allocations,
            ByteSize(t.bytes),
            ByteSize(t.peak),
            ByteSize(t.live_at_end)
        ));
    }
    table.push_str("</tbody></table>");
    PAGE.replacen("<!--SUMMARY-->", &escape(&summary), 1)
        .replacen("<!--TABLE-->", &table, 1)
        .replacen("/*DATA*/", &json, 1)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}
