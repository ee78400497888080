//! The memory timeline page: a [`History`] drawn as PyTorch's `memory_viz` draws one.
//!
//! [`render_html`] returns one self-contained HTML file (no network, no external script or
//! font): memory in use over time as stacked bands, one per allocation (the largest
//! 2000; smaller ones are summed into one grey "other" band on top), the bytes the allocators
//! reserved from their sources as a dashed dark-red line (band colours keep away from red and
//! pink, so no band reads as it), OOMs as pink marks, the peak in use as a dashed vertical line;
//! the y axis runs to the larger of peak in use and peak reserved (a checkbox fits it to in use);
//! both axes are titled. Hover a band for its size, scope, allocator, tensor, lifetime and
//! backtrace; scroll to zoom the time axis (event index), drag to pan. Below: what was live at
//! the peak, by scope and by description ([`History::peak`]), with a flame graph of where it was
//! allocated (recorded backtraces, else scope paths), and a per-tag table.
//!
//! The page's layout work is done here, in Rust, so a history of 100 000 events or more becomes
//! a page of bounded size that the browser lays out quickly (`tests/timeline_browser.rs` lays
//! out 100 000 events in headless Chromium).
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

mod bands;
mod flame;

use crate::allocators::ByteSize;
use crate::history::{History, LiveSet};

const PAGE: &str = include_str!("page.html");

/// The page's markers, in the order they stand in [`PAGE`]; each is replaced exactly once.
const MARKERS: [&str; 4] = ["<!--SUMMARY-->", "<!--PEAK-->", "<!--TABLE-->", "/*DATA*/"];

/// Rows of each table of the peak's composition; the rest are summed in one row.
const PEAK_ROWS: usize = 12;

/// Renders `history` as one self-contained HTML page (see the [module docs](self)).
///
/// A history is untrusted input (users share them): every string from it is escaped for where
/// it goes (HTML text in the table, JSON inside the page's data `<script>`), and the template is
/// filled by position, so no string from the history can be taken for one of its markers.
pub fn render_html(history: &History) -> String {
    let (mut data, tags) = bands::page_data(history);
    let peak = history.peak();
    data.peak_event = peak.as_ref().map(|p| p.event as u64);
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
    let composition = peak.as_ref().map_or_else(String::new, composition);
    fill(PAGE, [&escape(&summary), &composition, &table, &script_json(&data)])
}

/// The "live at the peak" section: the peak's allocations grouped by scope and by description.
fn composition(peak: &LiveSet) -> String {
    let mut out = format!(
        "<div id=\"peak\"><h2>Live at the peak: {} in {} allocations, after event {} ({:.3} ms)</h2>",
        ByteSize(peak.bytes),
        peak.allocations.len(),
        peak.event,
        peak.time_ns as f64 / 1e6
    );
    for (id, what, groups) in
        [("peak-scopes", "scope", peak.by_scope()), ("peak-descriptions", "description", peak.by_description())]
    {
        out.push_str(&format!(
            "<table id=\"{id}\" class=\"peak\"><thead><tr><th>{what}</th><th>bytes</th><th>share</th>\
             <th>allocations</th></tr></thead><tbody>"
        ));
        let row = |out: &mut String, key: &str, bytes: u64, count: usize| {
            let share = if peak.bytes == 0 { 0.0 } else { bytes as f64 * 100.0 / peak.bytes as f64 };
            out.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{share:.1}%</td><td>{count}</td></tr>",
                escape(key),
                ByteSize(bytes)
            ));
        };
        for g in groups.iter().take(PEAK_ROWS) {
            row(&mut out, g.key.as_deref().unwrap_or("(none)"), g.bytes, g.count);
        }
        if groups.len() > PEAK_ROWS {
            let rest = &groups[PEAK_ROWS..];
            let bytes = rest.iter().fold(0u64, |s, g| s.saturating_add(g.bytes));
            let count = rest.iter().map(|g| g.count).sum();
            row(&mut out, &format!("({} more)", rest.len()), bytes, count);
        }
        out.push_str("</tbody></table>");
    }
    out.push_str(&flame::flame_graph(peak, escape));
    out.push_str("</div>");
    out
}

/// `template` with each of [`MARKERS`] replaced by its value. The markers are found in the
/// template alone, before anything is inserted, so inserted text is never searched.
fn fill(template: &str, values: [&str; 4]) -> String {
    let mut out = String::with_capacity(template.len() + values.iter().map(|v| v.len()).sum::<usize>());
    let mut rest = template;
    for (marker, value) in MARKERS.iter().zip(values) {
        // The template is a constant that holds each marker once, in order (a unit test checks).
        let Some(at) = rest.find(marker) else { continue };
        out.push_str(&rest[..at]);
        out.push_str(value);
        rest = &rest[at + marker.len()..];
    }
    out.push_str(rest);
    out
}

/// `data` as JSON that is inert inside a `<script>` element: `<`, `>` and `&` (which JSON only
/// holds inside strings) become `\u003c`, `\u003e` and `\u0026`, so neither `</script>` nor
/// `<!--` can end or hide the script, and the line separators U+2028 and U+2029 are escaped too.
fn script_json(data: &impl serde::Serialize) -> String {
    // Serialising plain structs of numbers and strings into memory cannot fail.
    let json = serde_json::to_string(data).unwrap_or_else(|_| "{}".to_owned());
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// `s` escaped for HTML text and double- or single-quoted attribute values.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_holds_each_marker_once_in_order() {
        let at: Vec<usize> = MARKERS
            .iter()
            .map(|m| {
                assert_eq!(PAGE.matches(m).count(), 1, "{m} in page.html");
                PAGE.find(m).unwrap_or(0)
            })
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "markers out of order: {at:?}");
    }

    #[test]
    fn inserted_text_is_never_taken_for_a_marker() {
        let out = fill("a<!--SUMMARY-->b<!--PEAK-->c<!--TABLE-->d/*DATA*/e", ["/*DATA*/<!--TABLE-->", "P", "T", "J"]);
        assert_eq!(out, "a/*DATA*/<!--TABLE-->bPcTdJe");
    }

    #[test]
    fn a_hostile_tag_stays_data_in_the_rendered_page() {
        use crate::allocators::observe::Action;
        use crate::history::HistoryEvent;
        let tag = "/*DATA*/<img src=x onerror=alert(1)><!--<script></script>";
        let ev = |t, action, address| HistoryEvent {
            time_ns: t,
            action,
            address,
            size: 64,
            allocator: "cpu".into(),
            tag: Some(tag.into()),
            description: Some(tag.into()),
            backtrace: None,
        };
        let h = History {
            version: 1,
            start_unix_ms: 0,
            capacity: 8,
            dropped: 0,
            events: vec![ev(0, Action::Alloc, 4096), ev(1, Action::Free, 4096)],
        };
        let html = render_html(&h);
        assert!(!html.contains("<img"), "{html}");
        let open = "<script id=\"data\" type=\"application/json\">";
        let start = html.find(open).expect("the data script") + open.len();
        let end = start + html[start..].find("</script>").expect("its end");
        let data: serde_json::Value = serde_json::from_str(&html[start..end]).expect("the data is JSON");
        assert_eq!(data["strings"][0], tag);
        assert!(html.contains("<td>/*DATA*/&lt;img src=x onerror=alert(1)&gt;&lt;!--&lt;script&gt;"), "{html}");
    }

    #[test]
    fn script_json_has_no_angle_brackets_and_parses_back() {
        let s = "</script><!--<script>&\u{2028}";
        let json = script_json(&s);
        assert!(!json.contains('<') && !json.contains('>') && !json.contains('&'), "{json}");
        assert_eq!(serde_json::from_str::<String>(&json).unwrap(), s);
    }
}
