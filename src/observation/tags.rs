//! Per-tag totals: what each scope allocated, holds and held at most.

use dashmap::DashMap;

use crate::allocators::observe::Tag;

/// What the allocations made under one scope tag add up to (see [`crate::scope()`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct TagStats {
    /// The scope path.
    pub tag: String,
    /// Bytes of its allocations alive now (as set aside by the allocator).
    pub bytes_in_use: u64,
    /// The most bytes alive at once.
    pub peak_bytes_in_use: u64,
    /// Bytes ever allocated under it.
    pub bytes_allocated: u64,
    /// Allocations made under it.
    pub num_allocs: u64,
    /// Of those, how many were freed.
    pub num_frees: u64,
}

#[derive(Clone, Default)]
struct Counts {
    in_use: u64,
    peak: u64,
    allocated: u64,
    allocs: u64,
    frees: u64,
    /// Bytes and allocations alive now, per allocator (a scope uses few): what an OOM report
    /// ranks scopes by, kept in the same entry so that an event costs one map operation.
    by_allocator: Vec<(Tag, u64, u64)>,
}

#[derive(Default)]
pub(crate) struct TagLedger {
    counts: DashMap<Tag, Counts>,
}

impl TagLedger {
    pub(crate) fn alloc(&self, tag: Tag, allocator: Tag, bytes: usize) {
        let mut c = self.counts.entry(tag).or_default();
        c.in_use += bytes as u64;
        c.peak = c.peak.max(c.in_use);
        c.allocated += bytes as u64;
        c.allocs += 1;
        match c.by_allocator.iter_mut().find(|a| a.0 == allocator) {
            Some(a) => {
                a.1 += bytes as u64;
                a.2 += 1;
            }
            None => c.by_allocator.push((allocator, bytes as u64, 1)),
        }
    }

    pub(crate) fn free(&self, tag: Tag, allocator: Tag, bytes: usize) {
        if let Some(mut c) = self.counts.get_mut(&tag) {
            c.in_use = c.in_use.saturating_sub(bytes as u64);
            c.frees += 1;
            if let Some(a) = c.by_allocator.iter_mut().find(|a| a.0 == allocator) {
                a.1 = a.1.saturating_sub(bytes as u64);
                a.2 = a.2.saturating_sub(1);
            }
        }
    }

    /// `(scope, bytes, allocations)` alive now in `allocator`, for every scope holding any.
    pub(crate) fn live_in(&self, allocator: Tag) -> Vec<(Tag, u64, u64)> {
        self.counts
            .iter()
            .filter_map(|e| {
                let a = e.value().by_allocator.iter().find(|a| a.0 == allocator)?;
                (a.2 > 0).then_some((*e.key(), a.1, a.2))
            })
            .collect()
    }

    /// Every tag seen, largest peak first.
    pub(crate) fn stats(&self) -> Vec<TagStats> {
        let mut v: Vec<TagStats> = self
            .counts
            .iter()
            .map(|e| {
                let c = e.value();
                TagStats {
                    tag: e.key().as_str().to_owned(),
                    bytes_in_use: c.in_use,
                    peak_bytes_in_use: c.peak,
                    bytes_allocated: c.allocated,
                    num_allocs: c.allocs,
                    num_frees: c.frees,
                }
            })
            .collect();
        v.sort_by(|a, b| b.peak_bytes_in_use.cmp(&a.peak_bytes_in_use).then_with(|| a.tag.cmp(&b.tag)));
        v
    }
}

/// Per-tag totals of every scope used so far in this process, largest peak first.
///
/// ```
/// use tensormem::{AllocatorExt, SystemAllocator};
///
/// let cpu = SystemAllocator::new();
/// let p = {
///     let _s = tensormem::scope("doc.tag_stats");
///     cpu.allocate::<u8>(4096)?
/// };
/// let s = tensormem::tag_stats().into_iter().find(|t| t.tag == "doc.tag_stats").unwrap();
/// assert_eq!((s.bytes_in_use, s.num_allocs), (4096, 1));
/// // SAFETY: `p` came from `allocate::<u8>(4096)` on `cpu`.
/// unsafe { cpu.deallocate(p, 4096) };
/// # Ok::<(), tensormem::AllocError>(())
/// ```
pub fn tag_stats() -> Vec<TagStats> {
    crate::allocators::observe::unobserved(|| super::hub::hub().tags.stats())
}
