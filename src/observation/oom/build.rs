//! Building an [`OomReport`] from what the refusing allocator, the hub and the history know.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use super::{OomAllocation, OomReport, OomScope};
use crate::allocators::observe::{self, LargestBlocks, LiveBlock, Refusal, Tag};
use crate::observation::backtrace::trimmed;
use crate::observation::history;
use crate::observation::hub::Hub;

/// Adds `bytes` of one allocation to `tag`'s total.
fn count(scopes: &mut HashMap<Tag, (u64, u64)>, tag: Tag, bytes: usize) {
    let entry = scopes.entry(tag).or_default();
    entry.0 += bytes as u64;
    entry.1 += 1;
}

pub(super) fn build(hub: &Hub, r: &Refusal<'_>, sequence: u64) -> OomReport {
    let n = observe::report_entries();
    let me = Tag::intern(r.allocator);
    let mut sources = Vec::new();
    let mut largest = LargestBlocks::new(n);
    if let Some(table) = r.largest_live {
        sources.push("allocator".to_owned());
        table.iter().for_each(|&b| largest.push(b));
    }
    // The scopes holding this allocator's memory, from the hub's per-scope totals.
    let mut scopes: HashMap<Tag, (u64, u64)> =
        hub.tags.live_in(me).into_iter().map(|(tag, bytes, n)| (tag, (bytes, n))).collect();
    // Without the allocator's own table, its live blocks are the hub's records of it (its
    // scoped and leak-checked allocations): one pass over them.
    let mut from_records = !scopes.is_empty();
    if r.largest_live.is_none() {
        for rec in hub.records.iter().filter(|rec| rec.allocator == me) {
            from_records = true;
            largest.push(LiveBlock { address: *rec.key(), requested: rec.requested, allocated: rec.allocated });
        }
    }
    // The history's live blocks of this allocator, while recording.
    let ring = if observe::recording() { history::live_blocks(r.allocator) } else { HashMap::new() };
    if !ring.is_empty() {
        sources.push("history".to_owned());
        if r.largest_live.is_none() {
            for (&address, b) in &ring {
                if !hub.records.contains_key(&address) {
                    largest.push(LiveBlock { address, requested: b.requested, allocated: b.requested });
                }
            }
        }
        if scopes.is_empty() {
            for b in ring.values() {
                if let Some(tag) = b.tag {
                    count(&mut scopes, tag, b.requested);
                }
            }
        }
    }
    let largest_allocations: Vec<OomAllocation> = largest
        .into_sorted()
        .into_iter()
        .map(|b| {
            let (scope, description, backtrace) = match hub.records.get(&b.address) {
                Some(rec) => {
                    from_records = true;
                    (rec.tag, rec.description.clone(), rec.backtrace.clone())
                }
                None => match ring.get(&b.address) {
                    Some(h) => (h.tag, h.description.clone(), h.backtrace.clone()),
                    None => (None, None, None),
                },
            };
            OomAllocation {
                address: b.address as u64,
                requested_bytes: b.requested as u64,
                allocated_bytes: b.allocated as u64,
                scope: scope.map(|t| t.as_str().to_owned()),
                description: description.map(String::from),
                backtrace: backtrace.as_deref().map(trimmed),
            }
        })
        .collect();
    if from_records {
        let at = usize::from(r.largest_live.is_some());
        sources.insert(at, "observer".to_owned());
    }
    let mut top_scopes: Vec<OomScope> = scopes
        .into_iter()
        .map(|(tag, (bytes, allocations))| OomScope { scope: tag.as_str().to_owned(), bytes, allocations })
        .collect();
    top_scopes.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.scope.cmp(&b.scope)));
    top_scopes.truncate(n);

    let e = r.error;
    let (in_use, reserved, largest_free) = (e.in_use(), e.reserved(), e.largest_free_block());
    let fragmentation = match (in_use, reserved, largest_free) {
        (Some(used), Some(reserved), Some(largest)) => {
            let free = reserved.saturating_sub(used);
            Some(if free == 0 { 0.0 } else { 1.0 - (largest.min(free) as f64 / free as f64) })
        }
        _ => None,
    };
    let device = e.device_memory();
    OomReport {
        sequence,
        time_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        allocator: r.allocator.to_owned(),
        kind: e.kind().to_string(),
        message: e.to_string(),
        requested_bytes: e.requested_size().map_or(0, |s| s as u64),
        align: e.layout().map_or(1, |l| l.align() as u64),
        rounded_bytes: e.rounded_size(),
        in_use_bytes: in_use,
        reserved_bytes: reserved,
        limit_bytes: e.limit(),
        largest_free_bytes: largest_free,
        fragmentation,
        device_free_bytes: device.map(|d| d.1),
        device_total_bytes: device.map(|d| d.2),
        scope: r.tag.map(|t| t.as_str().to_owned()),
        thread: std::thread::current().name().map(str::to_owned),
        largest_allocations,
        top_scopes,
        sources,
    }
}
