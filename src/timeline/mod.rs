//! The memory timeline page (placeholder until the renderer lands).

use crate::history::History;

/// Renders `history` as one self-contained HTML page.
pub fn render_html(history: &History) -> String {
    format!("<html><body>{}</body></html>", history.events.len())
}
