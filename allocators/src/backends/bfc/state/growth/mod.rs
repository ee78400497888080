//! How a BFC takes memory and gives it back.
//!
//! - **Regions** (TensorFlow): each growth step asks a [`SubAllocator`] for a new region, the
//!   first of min(limit, 2 MiB) and each next one twice as large (or one region of the whole
//!   limit without `allow_growth`); whole free regions go back.
//! - **Expandable** (PyTorch's expandable segments): the limit is reserved once as address space
//!   with nothing behind it; each growth step commits just what the request needs (rounded to
//!   the growth granule) at the end of the committed part, so the new piece joins the region
//!   and its free tail; giving memory back decommits free pieces at the end.
//! - **Holes** (expandable memory that decommits any granule, i.e. host pages): `release_cached`
//!   also decommits whole free granules inside free chunks before live blocks (PyTorch's
//!   `empty_cache` on expandable segments); a hole is committed again when a block is placed
//!   over it. Only on request: done on every growth or free it costs page faults and `mprotect`
//!   each time a hole is reused, many times the allocator's time (`docs/peak-headroom.md`).
//! - **Peak headroom** ([`peak_headroom`](crate::BfcBuilder::peak_headroom); by default 4% over
//!   memory that relocates, none elsewhere): a commit
//!   that would lift reserved past the peak in use plus the headroom (and past its high-water
//!   mark) first takes free memory from elsewhere: large free spans from the highest address
//!   down (a chunk trapped between live blocks), and the free tail. Memory that
//!   [relocates](crate::ExpandableMemory::relocates) moves their pages to the addresses being
//!   committed (nothing is faulted in again; reserved does not change); other memory, when a
//!   headroom is set for it, decommits them (the free tail first) and commits fresh pages.

mod interior;

use core::ptr::NonNull;
use std::collections::BTreeMap;

use super::{Chunk, MIN_ALLOCATION_SIZE, NONE, REGION_ALIGNMENT, Region, State, rounded_bytes};
use crate::observe::{self, Action};
use crate::{ExpandableMemory, SubAllocator};

/// How the allocator grows.
#[derive(Debug)]
pub(crate) enum Growth {
    /// Regions from the sub-allocator.
    Regions {
        /// The most bytes of chunks (the limit rounded down to 256).
        usable_limit: usize,
        /// Bytes the next region asks for.
        next_region: usize,
        /// Whether a refused region was already retried smaller (TensorFlow does it once).
        backpedal: bool,
    },
    /// One reservation committed at its end.
    Expandable(Expanse),
}

/// The reservation of an expandable BFC.
#[derive(Debug)]
pub(crate) struct Expanse {
    base: usize,
    /// Bytes of address space reserved at `base`.
    reserved: usize,
    /// The most bytes committed at once (the limit rounded down to the granule).
    usable_limit: usize,
    /// Bytes committed from `base`.
    committed: usize,
    /// The committed pieces, in address order (their sizes sum to `committed`).
    pieces: Vec<usize>,
    granule: usize,
    growth_granule: usize,
    /// Decommitted granule ranges inside the committed part, `start -> end`, each inside a free
    /// chunk, disjoint and not adjacent.
    holes: BTreeMap<usize, usize>,
    /// Bytes in `holes`.
    hole_bytes: usize,
}

impl Expanse {
    /// The holes that overlap `lo..hi`, as `(start, end)`.
    fn holes_in(&self, lo: usize, hi: usize) -> Vec<(usize, usize)> {
        let mut v: Vec<(usize, usize)> =
            self.holes.range(..hi).rev().take_while(|h| *h.1 > lo).map(|(&a, &b)| (a, b)).collect();
        v.reverse();
        v
    }

    /// The committed parts of `lo..hi` (`lo..hi` less the holes), in address order.
    fn committed_in(&self, lo: usize, hi: usize) -> Vec<(usize, usize)> {
        let mut at = lo;
        let mut parts = Vec::new();
        for (a, b) in self.holes_in(lo, hi) {
            if a > at {
                parts.push((at, a));
            }
            at = at.max(b);
        }
        if at < hi {
            parts.push((at, hi));
        }
        parts
    }

    /// `x` (an address in the reservation, or past it) rounded down to a multiple of `unit`
    /// from the base.
    fn unit_floor(&self, x: usize, unit: usize) -> usize {
        x - x.saturating_sub(self.base) % unit
    }

    /// `x` (an address in the reservation, or past it) rounded up to a multiple of `unit` from
    /// the base (at most `usize::MAX`).
    fn unit_ceil(&self, x: usize, unit: usize) -> usize {
        let floor = self.unit_floor(x, unit);
        if floor == x { x } else { floor.saturating_add(unit) }
    }

    /// Records `a..b` (decommitted) as a hole, merged with holes it touches.
    fn add_hole(&mut self, mut a: usize, mut b: usize) {
        self.hole_bytes += b - a;
        if let Some((&pa, &pb)) = self.holes.range(..a).next_back()
            && pb == a
        {
            self.holes.remove(&pa);
            a = pa;
        }
        if let Some(nb) = self.holes.remove(&b) {
            b = nb;
        }
        self.holes.insert(a, b);
    }

    /// Takes `a..b` (inside one hole) out of the holes.
    fn remove_hole_part(&mut self, a: usize, b: usize) {
        let Some((&ha, &hb)) = self.holes.range(..=a).next_back() else { return };
        debug_assert!(ha <= a && b <= hb, "{a:#x}..{b:#x} is not inside one hole");
        self.holes.remove(&ha);
        if ha < a {
            self.holes.insert(ha, a);
        }
        if b < hb {
            self.holes.insert(b, hb);
        }
        self.hole_bytes -= b - a;
    }
}

/// The options that decide how the allocator grows.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GrowthOptions {
    pub(crate) memory_limit: usize,
    pub(crate) allow_growth: bool,
    pub(crate) growth_granule: usize,
}

impl Growth {
    /// TensorFlow's regions.
    pub(crate) fn regions(o: GrowthOptions) -> Self {
        let usable_limit = o.memory_limit & !(MIN_ALLOCATION_SIZE - 1);
        let first = if o.allow_growth { usable_limit.min(2 << 20) } else { usable_limit };
        Growth::Regions { usable_limit, next_region: first.max(MIN_ALLOCATION_SIZE), backpedal: false }
    }

    /// An expandable reservation of `reserved` bytes at `base`, made by the caller on `memory`.
    pub(crate) fn expandable(
        o: GrowthOptions,
        base: NonNull<u8>,
        reserved: usize,
        memory: &dyn ExpandableMemory,
    ) -> Self {
        let granule = memory.granule();
        Growth::Expandable(Expanse {
            base: base.as_ptr() as usize,
            reserved,
            usable_limit: (o.memory_limit / granule * granule).min(reserved),
            committed: 0,
            pieces: Vec::new(),
            granule,
            // At most the reservation (a larger step could never be taken whole), so rounding it up to
            // a granule cannot overflow.
            growth_granule: o.growth_granule.min(reserved).max(granule).next_multiple_of(granule),
            holes: BTreeMap::new(),
            hole_bytes: 0,
        })
    }

    /// The most bytes of chunks the allocator can ever have.
    pub(crate) fn usable_limit(&self) -> usize {
        match self {
            Growth::Regions { usable_limit, .. } => *usable_limit,
            Growth::Expandable(e) => e.usable_limit,
        }
    }

    /// `(reserved address space, committed, pieces, granule)` of an expandable allocator
    /// (committed: without the holes).
    pub(crate) fn info(&self) -> Option<(usize, usize, usize, usize)> {
        match self {
            Growth::Regions { .. } => None,
            Growth::Expandable(e) => Some((e.reserved, e.committed - e.hole_bytes, e.pieces.len(), e.granule)),
        }
    }

    /// Bytes of the usable regions that are decommitted holes.
    pub(crate) fn hole_bytes(&self) -> usize {
        match self {
            Growth::Regions { .. } => 0,
            Growth::Expandable(e) => e.hole_bytes,
        }
    }

    /// Whether any hole overlaps `start..end`.
    pub(super) fn has_hole_in(&self, start: usize, end: usize) -> bool {
        match self {
            Growth::Regions { .. } => false,
            Growth::Expandable(e) => e.holes.range(..end).next_back().is_some_and(|h| *h.1 > start),
        }
    }

    /// Checks the growth bookkeeping against the regions and the reserved total.
    pub(super) fn check(&self, regions: &[Region], reserved: usize) -> Result<(), String> {
        match self {
            Growth::Regions { .. } => {
                let pieces: usize = regions.iter().flat_map(|r| r.pieces.iter().map(|p| p.1)).sum();
                if pieces != reserved {
                    return Err(format!("reserved {reserved} but the regions' pieces sum to {pieces}"));
                }
            }
            Growth::Expandable(e) => {
                let pieces: usize = e.pieces.iter().sum();
                let committed_region = match regions {
                    [] => 0,
                    [r] if r.base == e.base => r.size,
                    _ => return Err(format!("an expandable allocator has {} regions", regions.len())),
                };
                if pieces != e.committed || e.committed - e.hole_bytes != reserved || committed_region != e.committed {
                    return Err(format!(
                        "committed {} less holes {} but pieces sum to {pieces}, reserved is {reserved}, the region holds {committed_region}",
                        e.committed, e.hole_bytes
                    ));
                }
                let mut last_end = None;
                let mut hole_bytes = 0;
                for (&a, &b) in &e.holes {
                    let aligned = a.is_multiple_of(e.granule) && b.is_multiple_of(e.granule);
                    if b <= a || !aligned || a < e.base || b > e.base + e.committed || last_end.is_some_and(|l| l >= a)
                    {
                        return Err(format!("hole {a:#x}..{b:#x} is misplaced"));
                    }
                    last_end = Some(b);
                    hole_bytes += b - a;
                }
                if hole_bytes != e.hole_bytes {
                    return Err(format!("holes sum to {hole_bytes}, not {}", e.hole_bytes));
                }
                if e.committed > e.usable_limit || e.usable_limit > e.reserved {
                    return Err(format!("committed {} over the limit {}", e.committed, e.usable_limit));
                }
                if e.pieces.iter().any(|p| *p == 0 || p % e.granule != 0) {
                    return Err("a committed piece is not a whole number of granules".to_owned());
                }
            }
        }
        Ok(())
    }
}

impl State {
    /// Takes more memory so that `rounded` bytes at an `align`-aligned address fit, within the
    /// limit. Returns whether anything was added.
    pub(super) fn extend(&mut self, rounded: usize, align: usize, sub: &dyn SubAllocator) -> bool {
        match self.growth {
            Growth::Regions { .. } => self.extend_regions(rounded, align, sub),
            Growth::Expandable(_) => match sub.expandable() {
                Some(memory) => self.grow(rounded, align, memory),
                None => false,
            },
        }
    }

    /// TensorFlow's `Extend`: a region of the current size (doubled until it holds the request),
    /// retried smaller once if refused.
    fn extend_regions(&mut self, rounded: usize, align: usize, sub: &dyn SubAllocator) -> bool {
        let Growth::Regions { usable_limit, next_region, backpedal } = &mut self.growth else { return false };
        let available = usable_limit.saturating_sub(self.usable) & !(MIN_ALLOCATION_SIZE - 1);
        if rounded > available {
            return false;
        }
        let mut increased = false;
        while rounded > *next_region {
            *next_region = next_region.saturating_mul(2);
            increased = true;
        }
        let alignment = align.max(REGION_ALIGNMENT);
        let mut bytes = (*next_region).min(available);
        let mut got = sub.alloc_region(bytes, alignment);
        if got.is_none() && !*backpedal {
            // Ask for less, once, as TensorFlow does; unlike TensorFlow, always shrink by at
            // least 256 bytes so that small sizes cannot loop forever.
            *backpedal = true;
            while got.is_none() {
                let smaller = rounded_bytes(bytes / 10 * 9).unwrap_or(bytes);
                bytes = if smaller < bytes { smaller } else { bytes - MIN_ALLOCATION_SIZE };
                if bytes < rounded {
                    break;
                }
                got = sub.alloc_region(bytes, alignment);
            }
        }
        let Some((ptr, reported)) = got else { return false };
        if !increased {
            *next_region = next_region.saturating_mul(2);
        }
        let base = ptr.as_ptr() as usize;
        let size = reported.min(available) & !(MIN_ALLOCATION_SIZE - 1);
        self.took(reported);
        tracing::debug!(base, bytes = reported, reserved = self.reserved, "bfc: took a region");
        observe::segment(Action::SegmentAlloc, &self.name, base, reported);
        self.add_region(base, size, Some((base, reported)), sub.supports_coalescing());
        true
    }

    /// Commits what the request needs at the end of the committed part: the request less the
    /// free tail it will merge with, rounded up to the growth granule (or, near the limit, to
    /// the granule).
    fn grow(&mut self, rounded: usize, align: usize, memory: &dyn ExpandableMemory) -> bool {
        let tail = self.free_tail().map(|h| self.chunks[h as usize]);
        let Growth::Expandable(e) = &self.growth else { return false };
        let end = e.base + e.committed;
        let start = match tail {
            Some(c) if c.ptr + c.size == end => c.ptr,
            _ => end,
        };
        let extra = (start.next_multiple_of(align) + rounded).saturating_sub(end).max(1);
        let available = e.usable_limit - e.committed;
        let least = extra.next_multiple_of(e.granule);
        if least > available {
            return false;
        }
        let bytes = extra.next_multiple_of(e.growth_granule).min(available).max(least);
        // Past the headroom, free pages move to `end..end + bytes` (uncommitted, granule-aligned,
        // inside the reservation: see the commit below) or are given back first. The block takes
        // the free tail (`start`), which must stay.
        let over = self.over_headroom(bytes, self.in_use + rounded).min(bytes);
        let mut moved = 0;
        if over > 0 {
            if Self::moves_pages(memory) {
                moved = self.relocate_into(memory, end, over, bytes, start..usize::MAX);
            }
            if moved < over {
                self.give_back(memory, over - moved, start..usize::MAX);
            }
        }
        let Growth::Expandable(e) = &mut self.growth else { return false };
        // Fresh memory after what was moved: all of it, or on a refusal the least that fits.
        let (mut fresh, least_fresh) = (bytes - moved, least.saturating_sub(moved));
        while fresh > 0 {
            let Some(at) = NonNull::new((end + moved) as *mut u8) else { return false };
            // SAFETY: `end + moved..end + moved + fresh` lies inside the reservation (committed +
            // bytes <= usable_limit <= reserved), starts at a granule boundary (the committed end
            // is one, every piece being whole granules, and `moved` is whole granules) and is not
            // committed yet.
            match unsafe { memory.commit(at, fresh) } {
                Ok(()) => break,
                Err(error) if fresh > least_fresh => {
                    tracing::debug!(bytes, %error, "bfc: commit refused; asking for the least that fits");
                    fresh = least_fresh;
                }
                Err(error) => {
                    tracing::warn!(memory = memory.name(), bytes, committed = e.committed, %error, "bfc: commit refused");
                    if moved == 0 {
                        return false;
                    }
                    // What was moved here stays: it is committed at the end.
                    fresh = 0;
                }
            }
        }
        let bytes = moved + fresh;
        e.committed += bytes;
        e.pieces.push(bytes);
        self.took(bytes - moved);
        tracing::debug!(at = end, bytes, committed = self.reserved, "bfc: committed");
        if fresh > 0 {
            // The moved part was reported by the move.
            observe::segment(Action::SegmentAlloc, &self.name, end + moved, fresh);
        }
        self.add_region(end, bytes, None, true);
        true
    }

    /// Free bytes that are committed (holes are not).
    pub(super) fn free_committed(&self) -> usize {
        self.usable - self.in_use - self.growth.hole_bytes()
    }

    /// Commits the holes under `start..end` (a block about to be handed out), granule by
    /// granule. Returns false, with what could be committed kept, when the memory refuses.
    pub(super) fn commit_holes(&mut self, start: usize, end: usize, sub: &dyn SubAllocator) -> bool {
        let Growth::Expandable(e) = &self.growth else { return true };
        if e.holes.is_empty() {
            return true;
        }
        let (lo, hi) = (start / e.granule * e.granule, end.next_multiple_of(e.granule));
        // Most blocks lie over no hole: one lookup, nothing allocated.
        if !self.growth.has_hole_in(lo, hi) {
            return true;
        }
        let Some(memory) = sub.expandable() else { return false };
        let holes = e.holes_in(lo, hi);
        // With a peak headroom, the parts of the holes committed widen to whole page-table spans
        // (within each hole, so within the free chunk that holds the block): no sliver of a hole
        // is left for the next block to need a move (and a memory mapping) of its own.
        let unit = if self.options.peak_headroom.is_some() { self.page_table_unit() } else { e.granule };
        let (wide_lo, wide_hi) = (e.unit_floor(lo, unit), e.unit_ceil(hi, unit));
        let mut parts: Vec<(usize, usize)> = holes.iter().map(|&(a, b)| (a.max(wide_lo), b.min(wide_hi))).collect();
        let bytes = parts.iter().map(|&(a, b)| b - a).sum();
        let mut over = self.over_headroom(bytes, self.in_use + (end - start)).min(bytes);
        if over > 0 && Self::moves_pages(memory) {
            // Past the headroom, free pages from elsewhere move into the holes first.
            for part in &mut parts {
                let need = over.min(part.1 - part.0);
                let moved = self.relocate_into(memory, part.0, need, part.1 - part.0, wide_lo..wide_hi);
                let Growth::Expandable(e) = &mut self.growth else { return true };
                // Reserved stays: the holes the move left make up for this one's part.
                e.remove_hole_part(part.0, part.0 + moved);
                part.0 += moved;
                over = over.saturating_sub(moved);
                if moved < need || over == 0 {
                    break;
                }
            }
        }
        if over > 0 {
            self.give_back(memory, over, wide_lo..wide_hi);
        }
        let Growth::Expandable(e) = &mut self.growth else { return true };
        let (mut got, mut all) = (0, true);
        for (a, b) in parts.into_iter().filter(|p| p.0 < p.1) {
            let Some(p) = NonNull::new(a as *mut u8) else {
                all = false;
                break;
            };
            // SAFETY: `a..b` is part of a hole: inside the reservation, granule-aligned, and
            // decommitted.
            if let Err(error) = unsafe { memory.commit(p, b - a) } {
                tracing::warn!(memory = memory.name(), bytes = b - a, %error, "bfc: recommitting a hole refused");
                all = false;
                break;
            }
            e.remove_hole_part(a, b);
            got += b - a;
            observe::segment(Action::SegmentAlloc, &self.name, a, b - a);
        }
        self.took(got);
        all
    }

    /// Counts `bytes` more taken from the backing memory: reserved, its peak (a stat) and its
    /// high-water mark (not reset with the stats).
    fn took(&mut self, bytes: usize) {
        self.reserved += bytes;
        self.peak_reserved = self.peak_reserved.max(self.reserved);
        self.high_water = self.high_water.max(self.reserved);
    }

    /// Gives free memory back until at most `keep` free bytes stay committed (or nothing more
    /// can go): whole free regions; for an expandable region its free tail and, with `interior`
    /// (an explicit `release_cached`, not the release threshold's frees: a block placed over a
    /// hole commits it again, which a threshold would repeat on every free), whole free
    /// granules inside other free chunks. Returns the bytes given back.
    pub(crate) fn release(&mut self, sub: &dyn SubAllocator, keep: usize, interior: bool) -> usize {
        let free = self.free_committed();
        if free <= keep {
            return 0;
        }
        let before = self.reserved;
        match self.growth {
            Growth::Regions { .. } => {
                self.free_unused_regions(sub, keep);
            }
            Growth::Expandable(_) => {
                if let Some(memory) = sub.expandable() {
                    let gone = self.decommit_tail(memory, free - keep);
                    if interior && memory.decommits_partially() && free - keep > gone {
                        self.punch(memory, free - keep - gone, 0, memory.granule(), 0..0);
                    }
                }
            }
        }
        let released = before - self.reserved;
        if released > 0 {
            tracing::debug!(released, reserved = self.reserved, "bfc: gave memory back");
        }
        released
    }

    /// Cuts the end off the free chunk at the end of the expandable region so that about `want`
    /// committed bytes go (rounded up to the granule; the cut is widened over holes, which were
    /// given back already), at most down to the chunk's first whole granule. Returns the
    /// committed bytes given back.
    fn decommit_tail(&mut self, memory: &dyn ExpandableMemory, want: usize) -> usize {
        let Some(h) = self.free_tail() else { return 0 };
        let c: Chunk = self.chunks[h as usize];
        let Growth::Expandable(e) = &mut self.growth else { return 0 };
        let end = e.base + e.committed;
        if c.ptr + c.size != end {
            return 0;
        }
        let cut = if memory.decommits_partially() {
            // Enough granules that, less the holes among them, `want` committed bytes go.
            let span = end.saturating_sub(c.ptr.next_multiple_of(e.granule));
            let mut cut = want.next_multiple_of(e.granule).min(span);
            loop {
                let committed: usize = e.committed_in(end - cut, end).iter().map(|&(a, b)| b - a).sum();
                let wider = (want + cut - committed).next_multiple_of(e.granule).min(span);
                if wider == cut {
                    break cut;
                }
                cut = wider;
            }
        } else {
            // Whole pieces only, from the end, as long as they lie in the free chunk.
            let mut cut = 0;
            for &p in e.pieces.iter().rev() {
                if cut >= want || cut + p > c.size {
                    break;
                }
                cut += p;
            }
            cut
        };
        if cut == 0 {
            return 0;
        }
        // Holes under the cut are decommitted already: only the gaps between them go now.
        let mut gone = 0;
        if memory.decommits_partially() {
            let gaps = e.committed_in(end - cut, end);
            for (a, b) in e.holes_in(end - cut, end) {
                e.remove_hole_part(a.max(end - cut), b.min(end));
            }
            for (a, b) in gaps {
                if let Some(from) = NonNull::new(a as *mut u8) {
                    // SAFETY: `a..b` is committed (below the committed end, in no hole),
                    // granule-aligned (the cut starts at a multiple of the granule below a
                    // granule-aligned end, at or above the chunk's start rounded up to the
                    // granule; holes are granule-aligned), and inside the free tail chunk, so
                    // nothing uses it.
                    unsafe { memory.decommit(from, b - a) };
                }
                observe::segment(Action::SegmentFree, &self.name, a, b - a);
                gone += b - a;
            }
        } else {
            gone = cut;
            observe::segment(Action::SegmentFree, &self.name, end - cut, cut);
        }
        let mut left = cut;
        let mut piece_end = end;
        while left > 0 {
            let Some(last) = e.pieces.last_mut() else { break };
            let taken = (*last).min(left);
            if !memory.decommits_partially()
                && let Some(from) = NonNull::new((piece_end - taken) as *mut u8)
            {
                // SAFETY: the backend unmaps whole pieces only, and `cut` was made of whole
                // last pieces (so `taken` is the whole piece `piece_end - taken..piece_end`,
                // committed by one call), inside the free tail chunk: nothing uses it.
                unsafe { memory.decommit(from, taken) };
            }
            piece_end -= taken;
            left -= taken;
            if taken == *last {
                e.pieces.pop();
            } else {
                *last -= taken;
            }
        }
        e.committed -= cut;
        self.reserved -= gone;
        self.usable -= cut;
        self.remove_free(h);
        let ri = self.regions.len() - 1;
        if c.size == cut {
            // The whole chunk goes; its previous neighbour is in use (free neighbours merge).
            self.free_handles.push(h);
            if c.prev == NONE {
                self.regions.pop();
                return gone;
            }
            self.chunks[c.prev as usize].next = NONE;
            self.regions[ri].last = c.prev;
        } else {
            self.chunks[h as usize].size -= cut;
            self.insert_free(h);
        }
        self.regions[ri].size -= cut;
        gone
    }

    /// Returns regions that hold no allocation to the sub-allocator while more than `keep` free
    /// bytes are committed. Returns how many went back. Nothing for an expandable allocator
    /// (its free tail goes back through [`release`](Self::release)).
    pub(crate) fn free_unused_regions(&mut self, sub: &dyn SubAllocator, keep: usize) -> usize {
        if !matches!(self.growth, Growth::Regions { .. }) {
            return 0;
        }
        let mut freed = 0;
        let mut i = 0;
        while i < self.regions.len() && self.usable - self.in_use > keep {
            let h = self.regions[i].first;
            let c = self.chunks[h as usize];
            if c.in_use() || c.size != self.regions[i].size {
                i += 1;
                continue;
            }
            self.remove_free(h);
            self.free_handles.push(h);
            let region = self.regions.remove(i);
            self.usable -= region.size;
            for (p, bytes) in region.pieces {
                self.reserved -= bytes;
                observe::segment(Action::SegmentFree, &self.name, p, bytes);
                if let Some(p) = NonNull::new(p as *mut u8) {
                    // SAFETY: the piece came from this sub-allocator's `alloc_region` with this
                    // reported size, and its only chunk is free, so nothing uses its memory.
                    unsafe { sub.free_region(p, bytes) };
                }
                tracing::debug!(base = p, bytes, reserved = self.reserved, "bfc: returned a region");
            }
            freed += 1;
        }
        freed
    }

    /// Returns every region, or the whole reservation, to where it came from (on drop).
    pub(crate) fn release_all(&mut self, sub: &dyn SubAllocator) {
        for region in self.regions.drain(..) {
            for (p, bytes) in region.pieces {
                observe::segment(Action::SegmentFree, &self.name, p, bytes);
                if let Some(p) = NonNull::new(p as *mut u8) {
                    // SAFETY: the piece came from this sub-allocator with this reported size;
                    // the allocator is being dropped, so no block of it may be used any more.
                    unsafe { sub.free_region(p, bytes) };
                }
            }
        }
        if let (Growth::Expandable(e), Some(memory)) = (&mut self.growth, sub.expandable()) {
            if e.committed > 0 {
                observe::segment(Action::SegmentFree, &self.name, e.base, e.committed);
            }
            if let Some(base) = NonNull::new(e.base as *mut u8) {
                // SAFETY: `base`/`reserved` is the reservation this allocator made on `memory`
                // at construction and never released; the allocator is being dropped, so no
                // block of it may be used any more.
                unsafe { memory.release(base, e.reserved) };
            }
            e.committed = 0;
            e.pieces.clear();
        }
        self.live.clear();
        self.reserved = 0;
        self.usable = 0;
    }
}
