//! [`memory_summary`]: a table of every allocator's figures, in the spirit of
//! `torch.cuda.memory_summary()`.

use std::fmt::Write as _;

use crate::AllocatorRegistry;
use crate::allocators::ByteSize;
use crate::telemetry::{AllocatorSnapshot, MemorySnapshot, snapshot_of};

/// A table of `registry`'s allocators: per allocator the bytes in use now and at peak, bytes
/// ever allocated and freed, the bytes reserved from the source (now and peak) and cached (reserved but not in use) where the
/// allocator knows them, allocation and free counts, OOMs and retries; then the process heap
/// and mapped files when known, and per-tag figures when [scopes](crate::scope()) were used.
///
/// ```
/// use std::sync::Arc;
/// use tensormem::{AllocatorExt, AllocatorRegistry, SystemAllocator};
///
/// let registry = AllocatorRegistry::new();
/// let cpu = Arc::new(SystemAllocator::new());
/// registry.register("cpu", 10, cpu.clone())?;
/// let p = cpu.allocate::<u8>(3 << 20)?;
/// let table = tensormem::telemetry::memory_summary(&registry);
/// assert!(table.contains("cpu"));
/// assert!(table.contains("3.0 MiB"));
/// // SAFETY: `p` came from `allocate::<u8>(3 << 20)` on `cpu`.
/// unsafe { cpu.deallocate(p, 3 << 20) };
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn memory_summary(registry: &AllocatorRegistry) -> String {
    summary_of(&snapshot_of(registry), &crate::tag_stats())
}

/// The same table for a saved [`MemorySnapshot`] (e.g. the `tensormem summary` command), with
/// the given per-tag figures.
pub fn summary_of(snapshot: &MemorySnapshot, tags: &[crate::TagStats]) -> String {
    let mut out = String::new();
    let header = [
        "allocator",
        "in use",
        "peak",
        "allocated",
        "freed",
        "reserved",
        "peak reserved",
        "cached",
        "allocs",
        "frees",
        "ooms",
        "retries",
    ];
    let mut rows: Vec<Vec<String>> = Vec::new();
    for a in &snapshot.allocators {
        rows.push(row(a));
    }
    if let Some(g) = &snapshot.global {
        rows.push(vec![
            "process heap (global)".into(),
            ByteSize(g.bytes_in_use).to_string(),
            ByteSize(g.peak_bytes_in_use).to_string(),
            g.total_bytes_allocated.map_or("-".into(), |t| ByteSize(t).to_string()),
            g.total_bytes_allocated.map_or("-".into(), |t| ByteSize(t.saturating_sub(g.bytes_in_use)).to_string()),
            "-".into(),
            "-".into(),
            "-".into(),
            g.num_allocs.to_string(),
            g.num_frees.to_string(),
            "-".into(),
            "-".into(),
        ]);
    }
    let _ = writeln!(out, "tensormem memory summary");
    table(&mut out, &header, &rows);
    out.push_str(LEGEND);
    if snapshot.mapped.bytes > 0 {
        let _ = writeln!(
            out,
            "\nmapped files: {} in {} file(s)",
            ByteSize(snapshot.mapped.bytes),
            snapshot.mapped.files.len()
        );
    }
    if !tags.is_empty() {
        let _ = writeln!(out, "\nper scope:");
        let rows: Vec<Vec<String>> = tags
            .iter()
            .map(|t| {
                vec![
                    t.tag.clone(),
                    ByteSize(t.bytes_in_use).to_string(),
                    ByteSize(t.peak_bytes_in_use).to_string(),
                    ByteSize(t.bytes_allocated).to_string(),
                    t.num_allocs.to_string(),
                    t.num_frees.to_string(),
                ]
            })
            .collect();
        table(&mut out, &["scope", "in use", "peak", "allocated", "allocs", "frees"], &rows);
    }
    out
}

fn row(a: &AllocatorSnapshot) -> Vec<String> {
    let name = if a.name == a.allocator || a.allocator.is_empty() {
        a.name.clone()
    } else {
        format!("{} ({})", a.name, a.allocator)
    };
    let Some(s) = &a.stats else {
        let why = a.error.as_deref().unwrap_or("keeps no statistics");
        return vec![name, why.to_owned()];
    };
    let known = |v: u64| if v > 0 { ByteSize(v).to_string() } else { "-".into() };
    vec![
        name,
        ByteSize(s.bytes_in_use).to_string(),
        ByteSize(s.peak_bytes_in_use).to_string(),
        s.total_bytes_allocated.map_or("-".into(), |t| ByteSize(t).to_string()),
        s.total_bytes_allocated.map_or("-".into(), |t| ByteSize(t.saturating_sub(s.bytes_in_use)).to_string()),
        known(s.bytes_reserved),
        known(s.peak_bytes_reserved),
        if s.bytes_reserved > 0 {
            ByteSize(s.bytes_reserved.saturating_sub(s.bytes_in_use)).to_string()
        } else {
            "-".into()
        },
        s.num_allocs.to_string(),
        s.num_frees.to_string(),
        s.num_ooms.to_string(),
        s.num_alloc_retries.to_string(),
    ]
}

/// What the columns mean, under the allocators' table.
const LEGEND: &str = "  in use: bytes handed out now; peak: the most at once; allocated / freed: bytes ever handed \
out / given back;\n  reserved: bytes held from the allocator's source (in use + cached); cached: reserved but not in \
use, kept for reuse\n  (release_cached() gives it back); '-': the allocator does not know. An allocator under another \
(jemalloc under\n  pool) counts the other's reserved bytes as its own in use: that is cached memory, not a leak.\n";

/// A table with a rule under its header: the first column left-aligned, the figures right.
fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let lines = crate::text_table::lines(header, rows, &[true]);
    let rule = format!("  {}", "-".repeat(crate::text_table::width(&lines).saturating_sub(2)));
    for (i, l) in lines.iter().enumerate() {
        let _ = writeln!(out, "{l}");
        if i == 0 {
            let _ = writeln!(out, "{rule}");
        }
    }
}
