//! Plain-text tables for people (memory summaries, leak reports): columns padded to their
//! widest cell, two spaces apart, indented by two.

use std::fmt::Write as _;

/// The lines of a table: the header, then one line per row (no trailing spaces). Column `i` is
/// left-aligned when `left[i]` (missing entries: right-aligned).
pub(crate) fn lines(header: &[&str], rows: &[Vec<String>], left: &[bool]) -> Vec<String> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, c) in cells.enumerate() {
            let w = widths.get(i).copied().unwrap_or(0);
            if left.get(i).copied().unwrap_or(false) {
                let _ = write!(s, "  {c:<w$}");
            } else {
                let _ = write!(s, "  {c:>w$}");
            }
        }
        s.trim_end().to_owned()
    };
    let mut out = vec![line(&mut header.iter().copied())];
    out.extend(rows.iter().map(|r| line(&mut r.iter().map(String::as_str))));
    out
}

/// The width of a table's widest line, for a rule under the header.
pub(crate) fn width(lines: &[String]) -> usize {
    lines.iter().map(|l| l.len()).max().unwrap_or(0)
}
