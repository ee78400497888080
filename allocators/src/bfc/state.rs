//! The best-fit-with-coalescing algorithm, as TensorFlow's `BFCAllocator` runs it: chunks of
//! 256-byte multiples carved from regions, free chunks kept in 21 size-ordered bins, split on
//! allocation, merged with free neighbours on free. All of it runs under the allocator's lock.

use std::collections::BTreeSet;

use super::dump::{BinSummary, ChunkInfo, MemoryDump, RegionInfo};
use crate::{AllocatorStats, SubAllocator};

/// log2 of the minimum chunk size.
pub(crate) const MIN_ALLOCATION_BITS: u32 = 8;
/// Every chunk is a multiple of this, and every chunk address is aligned to it.
pub const MIN_ALLOCATION_SIZE: usize = 1 << MIN_ALLOCATION_BITS;
/// Bin `i` holds free chunks of at least `256 << i` bytes (the last one, everything larger).
pub const NUM_BINS: usize = 21;
/// Regions are asked for with this alignment, so chunk addresses are 256-byte aligned.
pub(crate) const REGION_ALIGNMENT: usize = MIN_ALLOCATION_SIZE;

type Handle = u32;
const NONE: Handle = Handle::MAX;
const NO_BIN: u8 = u8::MAX;

/// `n` rounded up to a multiple of 256 (at least 256), or `None` if that overflows.
pub(crate) fn rounded_bytes(n: usize) -> Option<usize> {
    n.max(1).checked_add(MIN_ALLOCATION_SIZE - 1).map(|v| v & !(MIN_ALLOCATION_SIZE - 1))
}

/// TensorFlow's `BinNumForSize`: `min(20, floor(log2(max(n, 256) >> 8)))`.
pub(crate) fn bin_for_size(n: usize) -> usize {
    let units = (n.max(MIN_ALLOCATION_SIZE) >> MIN_ALLOCATION_BITS) as u64;
    (63 - units.leading_zeros() as usize).min(NUM_BINS - 1)
}

#[derive(Clone, Copy, Debug)]
struct Chunk {
    ptr: usize,
    size: usize,
    requested: usize,
    /// 0 while free.
    id: u64,
    prev: Handle,
    next: Handle,
    bin: u8,
}

impl Chunk {
    fn in_use(&self) -> bool {
        self.id != 0
    }
}

#[derive(Debug)]
struct Region {
    base: usize,
    /// Usable bytes (a multiple of 256).
    size: usize,
    /// The chunk starting at `base + (i << 8)`, or `NONE`.
    handles: Vec<Handle>,
    /// The sub-allocator's pieces behind this region (more than one when adjacent regions were
    /// coalesced), as `(address, bytes it reported)`.
    pieces: Vec<(usize, usize)>,
}

impl Region {
    fn end(&self) -> usize {
        self.base + self.size
    }
}

/// Why a free was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FreeError {
    /// No region of this allocator contains the address, or no chunk starts there.
    Foreign,
    /// A chunk starts there but is free.
    AlreadyFree,
}

/// Why an allocation failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AllocFailure {
    /// The rounded request is larger than the memory limit.
    OverLimit,
    /// No free chunk fits and no region could be added within the limit.
    OutOfMemory,
}

/// The allocator's whole state.
#[derive(Debug)]
pub(crate) struct State {
    chunks: Vec<Chunk>,
    free_handles: Vec<Handle>,
    /// Sorted by base address.
    regions: Vec<Region>,
    /// Free chunks by `(size, address, handle)`: the first one fitting is the smallest fit with
    /// the lowest address.
    bins: Vec<BTreeSet<(usize, usize, Handle)>>,
    memory_limit: usize,
    max_internal_fragmentation: usize,
    curr_region_bytes: usize,
    started_backpedal: bool,
    /// Bytes taken from the sub-allocator (as it reported them).
    reserved: usize,
    peak_reserved: usize,
    /// Bytes of regions usable for chunks.
    usable: usize,
    next_id: u64,
    pub(crate) num_allocs: u64,
    pub(crate) num_frees: u64,
    in_use: usize,
    peak_in_use: usize,
    largest_alloc: usize,
    pub(crate) num_ooms: u64,
}

impl State {
    pub(crate) fn new(memory_limit: usize, allow_growth: bool, max_internal_fragmentation: usize) -> Self {
        let limit = memory_limit & !(MIN_ALLOCATION_SIZE - 1);
        let first_region = if allow_growth { limit.min(2 << 20) } else { limit };
        Self {
            chunks: Vec::new(),
            free_handles: Vec::new(),
            regions: Vec::new(),
            bins: (0..NUM_BINS).map(|_| BTreeSet::new()).collect(),
            memory_limit: limit,
            max_internal_fragmentation,
            curr_region_bytes: first_region.max(MIN_ALLOCATION_SIZE),
            started_backpedal: false,
            reserved: 0,
            peak_reserved: 0,
            usable: 0,
            next_id: 1,
            num_allocs: 0,
            num_frees: 0,
            in_use: 0,
            peak_in_use: 0,
            largest_alloc: 0,
            num_ooms: 0,
        }
    }

    pub(crate) fn in_use(&self) -> usize {
        self.in_use
    }

    pub(crate) fn memory_limit(&self) -> usize {
        self.memory_limit
    }

    /// Allocates `rounded` bytes (already a multiple of 256) for a request of `requested`.
    /// `align` may exceed 256: the chunk is then searched with room for the worst-case padding,
    /// and the misaligned prefix is split off as a free chunk.
    pub(crate) fn allocate(
        &mut self,
        requested: usize,
        rounded: usize,
        align: usize,
        sub: &dyn SubAllocator,
        garbage_collection: bool,
    ) -> Result<usize, AllocFailure> {
        let padding = align.saturating_sub(MIN_ALLOCATION_SIZE);
        let needed = rounded.saturating_add(padding);
        if needed > self.memory_limit {
            return Err(AllocFailure::OverLimit);
        }
        if let Some(p) = self.find_chunk(needed, rounded, align, requested) {
            return Ok(p);
        }
        if self.extend(needed, sub) {
            if let Some(p) = self.find_chunk(needed, rounded, align, requested) {
                return Ok(p);
            }
        }
        if garbage_collection && self.free_unused_regions(sub) > 0 && self.extend(needed, sub) {
            if let Some(p) = self.find_chunk(needed, rounded, align, requested) {
                return Ok(p);
            }
        }
        Err(AllocFailure::OutOfMemory)
    }

    /// Takes the smallest free chunk of at least `needed` bytes (lowest address on a tie) and
    /// hands out `rounded` bytes of it at an `align`-aligned address.
    fn find_chunk(&mut self, needed: usize, rounded: usize, align: usize, requested: usize) -> Option<usize> {
        let (bin, entry) = (bin_for_size(needed)..NUM_BINS)
            .find_map(|b| self.bins[b].range((needed, 0, 0)..).next().map(|&e| (b, e)))?;
        self.bins[bin].remove(&entry);
        let mut h = entry.2;
        self.chunks[h as usize].bin = NO_BIN;
        let ptr = self.chunks[h as usize].ptr;
        let prefix = ptr.next_multiple_of(align) - ptr;
        if prefix > 0 {
            // Keep the misaligned prefix as a free chunk of its own (its previous neighbour is in
            // use, or it would have been merged with this chunk already).
            self.split(h, prefix);
            let aligned = self.chunks[h as usize].next;
            self.remove_free(aligned);
            self.insert_free(h);
            h = aligned;
        }
        let size = self.chunks[h as usize].size;
        if size >= rounded * 2 || size - rounded >= self.max_internal_fragmentation {
            self.split(h, rounded);
        }
        let c = &mut self.chunks[h as usize];
        c.requested = requested;
        c.id = self.next_id;
        self.next_id += 1;
        let (ptr, size) = (c.ptr, c.size);
        self.num_allocs += 1;
        self.in_use += size;
        self.peak_in_use = self.peak_in_use.max(self.in_use);
        self.largest_alloc = self.largest_alloc.max(requested);
        Some(ptr)
    }

    /// Splits chunk `h` (not in a bin) so that it keeps `size` bytes; the rest becomes a free chunk.
    fn split(&mut self, h: Handle, size: usize) {
        let c = self.chunks[h as usize];
        let rest = self.new_chunk(Chunk {
            ptr: c.ptr + size,
            size: c.size - size,
            requested: 0,
            id: 0,
            prev: h,
            next: c.next,
            bin: NO_BIN,
        });
        self.chunks[h as usize].size = size;
        self.chunks[h as usize].next = rest;
        if c.next != NONE {
            self.chunks[c.next as usize].prev = rest;
        }
        self.set_handle(c.ptr + size, rest);
        self.insert_free(rest);
    }

    /// Frees the chunk at `ptr` and merges it with free neighbours. Returns its size.
    pub(crate) fn deallocate(&mut self, ptr: usize) -> Result<usize, FreeError> {
        let h = self.handle_at(ptr).ok_or(FreeError::Foreign)?;
        if !self.chunks[h as usize].in_use() {
            return Err(FreeError::AlreadyFree);
        }
        let size = self.chunks[h as usize].size;
        self.chunks[h as usize].id = 0;
        self.chunks[h as usize].requested = 0;
        self.in_use -= size;
        self.num_frees += 1;
        let mut h = h;
        let next = self.chunks[h as usize].next;
        if next != NONE && !self.chunks[next as usize].in_use() {
            self.remove_free(next);
            self.merge(h, next);
        }
        let prev = self.chunks[h as usize].prev;
        if prev != NONE && !self.chunks[prev as usize].in_use() {
            self.remove_free(prev);
            self.merge(prev, h);
            h = prev;
        }
        self.insert_free(h);
        Ok(size)
    }

    /// Absorbs `b` (which directly follows `a`) into `a`. Neither may be in a bin.
    fn merge(&mut self, a: Handle, b: Handle) {
        let cb = self.chunks[b as usize];
        self.chunks[a as usize].size += cb.size;
        self.chunks[a as usize].next = cb.next;
        if cb.next != NONE {
            self.chunks[cb.next as usize].prev = a;
        }
        self.set_handle(cb.ptr, NONE);
        self.free_handles.push(b);
    }

    /// Takes a new region able to hold `rounded` bytes from the sub-allocator, within the limit.
    fn extend(&mut self, rounded: usize, sub: &dyn SubAllocator) -> bool {
        let available = self.memory_limit.saturating_sub(self.usable) & !(MIN_ALLOCATION_SIZE - 1);
        if rounded > available {
            return false;
        }
        let mut increased = false;
        while rounded > self.curr_region_bytes {
            self.curr_region_bytes = self.curr_region_bytes.saturating_mul(2);
            increased = true;
        }
        let mut bytes = self.curr_region_bytes.min(available);
        let mut got = sub.alloc_region(bytes, REGION_ALIGNMENT);
        if got.is_none() && !self.started_backpedal {
            // Ask for less, once, as TensorFlow does; unlike TensorFlow, always shrink by at
            // least 256 bytes so that small sizes cannot loop forever.
            self.started_backpedal = true;
            while got.is_none() {
                let smaller = rounded_bytes(bytes / 10 * 9).unwrap_or(bytes);
                bytes = if smaller < bytes { smaller } else { bytes - MIN_ALLOCATION_SIZE };
                if bytes < rounded {
                    break;
                }
                got = sub.alloc_region(bytes, REGION_ALIGNMENT);
            }
        }
        let Some((ptr, reported)) = got else { return false };
        if !increased {
            self.curr_region_bytes = self.curr_region_bytes.saturating_mul(2);
        }
        let base = ptr.as_ptr() as usize;
        let size = reported.min(available) & !(MIN_ALLOCATION_SIZE - 1);
        self.reserved += reported;
        self.peak_reserved = self.peak_reserved.max(self.reserved);
        self.usable += size;
        self.add_region(base, size, reported, sub.supports_coalescing());
        true
    }

    fn add_region(&mut self, base: usize, size: usize, reported: usize, coalesce: bool) {
        let at = self.regions.partition_point(|r| r.base < base);
        if coalesce && at > 0 && self.regions[at - 1].end() == base {
            // Grow the previous region and append a chunk after its last one.
            let last = self.last_chunk(at - 1);
            let h = self.new_chunk(Chunk { ptr: base, size, requested: 0, id: 0, prev: last, next: NONE, bin: NO_BIN });
            self.chunks[last as usize].next = h;
            let r = &mut self.regions[at - 1];
            r.size += size;
            r.handles.resize(r.size >> MIN_ALLOCATION_BITS, NONE);
            r.pieces.push((base, reported));
            self.set_handle(base, h);
            if !self.chunks[last as usize].in_use() {
                self.remove_free(last);
                self.merge(last, h);
                self.insert_free(last);
            } else {
                self.insert_free(h);
            }
            return;
        }
        let h = self.new_chunk(Chunk { ptr: base, size, requested: 0, id: 0, prev: NONE, next: NONE, bin: NO_BIN });
        let mut handles = vec![NONE; size >> MIN_ALLOCATION_BITS];
        handles[0] = h;
        self.regions.insert(at, Region { base, size, handles, pieces: vec![(base, reported)] });
        self.insert_free(h);
    }

    fn last_chunk(&self, region: usize) -> Handle {
        let mut h = self.regions[region].handles[0];
        while self.chunks[h as usize].next != NONE {
            h = self.chunks[h as usize].next;
        }
        h
    }

    /// Returns every region that is one free chunk to the sub-allocator. Returns how many.
    pub(crate) fn free_unused_regions(&mut self, sub: &dyn SubAllocator) -> usize {
        let mut freed = 0;
        let mut i = 0;
        while i < self.regions.len() {
            let h = self.regions[i].handles[0];
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
                if let Some(p) = core::ptr::NonNull::new(p as *mut u8) {
                    // SAFETY: the piece came from this sub-allocator's `alloc_region` with this
                    // reported size, and its only chunk is free, so nothing uses its memory.
                    unsafe { sub.free_region(p, bytes) };
                }
            }
            freed += 1;
        }
        freed
    }

    /// Returns every region to the sub-allocator (on drop).
    pub(crate) fn release_all(&mut self, sub: &dyn SubAllocator) {
        for region in self.regions.drain(..) {
            for (p, bytes) in region.pieces {
                if let Some(p) = core::ptr::NonNull::new(p as *mut u8) {
                    // SAFETY: the piece came from this sub-allocator with this reported size;
                    // the allocator is being dropped, so no block of it may be used any more.
                    unsafe { sub.free_region(p, bytes) };
                }
            }
        }
    }

    fn new_chunk(&mut self, c: Chunk) -> Handle {
        match self.free_handles.pop() {
            Some(h) => {
                self.chunks[h as usize] = c;
                h
            }
            None => {
                self.chunks.push(c);
                (self.chunks.len() - 1) as Handle
            }
        }
    }

    fn insert_free(&mut self, h: Handle) {
        let c = &mut self.chunks[h as usize];
        let bin = bin_for_size(c.size);
        c.bin = bin as u8;
        self.bins[bin].insert((c.size, c.ptr, h));
    }

    fn remove_free(&mut self, h: Handle) {
        let c = &mut self.chunks[h as usize];
        let bin = c.bin as usize;
        c.bin = NO_BIN;
        self.bins[bin].remove(&(c.size, c.ptr, h));
    }

    fn region_of(&self, ptr: usize) -> Option<usize> {
        let i = self.regions.partition_point(|r| r.end() <= ptr);
        (i < self.regions.len() && self.regions[i].base <= ptr).then_some(i)
    }

    fn set_handle(&mut self, ptr: usize, h: Handle) {
        if let Some(i) = self.region_of(ptr) {
            let r = &mut self.regions[i];
            r.handles[(ptr - r.base) >> MIN_ALLOCATION_BITS] = h;
        }
    }

    /// The chunk starting exactly at `ptr`, in O(log regions).
    fn handle_at(&self, ptr: usize) -> Option<Handle> {
        let r = &self.regions[self.region_of(ptr)?];
        let offset = ptr - r.base;
        if offset % MIN_ALLOCATION_SIZE != 0 {
            return None;
        }
        let h = r.handles[offset >> MIN_ALLOCATION_BITS];
        (h != NONE).then_some(h)
    }

    /// `(requested, allocated, id)` of the live chunk at `ptr`.
    pub(crate) fn live_chunk(&self, ptr: usize) -> Option<(usize, usize, u64)> {
        let c = &self.chunks[self.handle_at(ptr)? as usize];
        c.in_use().then_some((c.requested, c.size, c.id))
    }

    /// The largest free chunk.
    pub(crate) fn largest_free(&self) -> usize {
        self.bins.iter().rev().find_map(|b| b.last().map(|e| e.0)).unwrap_or(0)
    }

    pub(crate) fn stats(&self) -> AllocatorStats {
        let largest_free = self.largest_free();
        let free = self.usable - self.in_use;
        AllocatorStats {
            num_allocs: self.num_allocs,
            num_frees: self.num_frees,
            bytes_in_use: self.in_use as u64,
            peak_bytes_in_use: self.peak_in_use as u64,
            largest_alloc_size: self.largest_alloc as u64,
            bytes_limit: Some(self.memory_limit as u64),
            bytes_reserved: self.reserved as u64,
            peak_bytes_reserved: self.peak_reserved as u64,
            largest_free_block_bytes: Some(largest_free as u64),
            fragmentation: Some(if free == 0 { 0.0 } else { (free - largest_free) as f64 / free as f64 }),
            num_alloc_retries: 0,
            num_ooms: self.num_ooms,
        }
    }

    /// TensorFlow's `ClearStats`.
    pub(crate) fn clear_stats(&mut self) {
        self.num_allocs = 0;
        self.num_frees = 0;
        self.peak_in_use = self.in_use;
        self.largest_alloc = 0;
        self.peak_reserved = self.reserved;
    }

    pub(crate) fn dump(&self, name: &str) -> MemoryDump {
        let mut bins: Vec<BinSummary> = (0..NUM_BINS).map(|bin| BinSummary { bin, ..BinSummary::default() }).collect();
        let mut chunks = Vec::new();
        let mut regions = Vec::new();
        for (ri, r) in self.regions.iter().enumerate() {
            regions.push(RegionInfo { base: r.base, size: r.size });
            let mut h = r.handles[0];
            while h != NONE {
                let c = &self.chunks[h as usize];
                let b = &mut bins[bin_for_size(c.size)];
                b.bytes_in_bin += c.size as u64;
                b.chunks_in_bin += 1;
                if c.in_use() {
                    b.bytes_in_use += c.size as u64;
                    b.chunks_in_use += 1;
                }
                chunks.push(ChunkInfo {
                    region: ri,
                    offset: c.ptr - r.base,
                    size: c.size,
                    requested_size: c.requested,
                    bin: (!c.in_use()).then_some(c.bin as usize),
                    in_use: c.in_use(),
                    allocation_id: c.in_use().then_some(c.id),
                });
                h = c.next;
            }
        }
        MemoryDump::new(name.to_owned(), self.stats(), bins, regions, chunks)
    }

    /// Checks every invariant; for tests. Returns a description of the first violation.
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut in_use = 0;
        let mut free_chunks = 0;
        for r in &self.regions {
            let mut h = r.handles[0];
            let mut expect = r.base;
            let mut prev = NONE;
            while h != NONE {
                let c = &self.chunks[h as usize];
                if c.ptr != expect || c.prev != prev {
                    return Err(format!("chunk list broken at {:#x}", c.ptr));
                }
                if r.handles[(c.ptr - r.base) >> MIN_ALLOCATION_BITS] != h {
                    return Err(format!("handle map wrong at {:#x}", c.ptr));
                }
                if c.in_use() {
                    in_use += c.size;
                } else {
                    free_chunks += 1;
                    if prev != NONE && !self.chunks[prev as usize].in_use() {
                        return Err(format!("two free neighbours at {:#x}", c.ptr));
                    }
                    if !self.bins[c.bin as usize].contains(&(c.size, c.ptr, h))
                        || c.bin as usize != bin_for_size(c.size)
                    {
                        return Err(format!("free chunk at {:#x} is not in its bin", c.ptr));
                    }
                }
                expect = c.ptr + c.size;
                prev = h;
                h = c.next;
            }
            if expect != r.end() {
                return Err(format!("region {:#x} not covered by its chunks", r.base));
            }
        }
        let binned: usize = self.bins.iter().map(BTreeSet::len).sum();
        if binned != free_chunks {
            return Err(format!("{binned} chunks in bins, {free_chunks} free chunks in regions"));
        }
        if in_use != self.in_use {
            return Err(format!("in use {} but chunks in use sum to {in_use}", self.in_use));
        }
        Ok(())
    }
}
