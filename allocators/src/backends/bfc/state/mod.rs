//! The best-fit-with-coalescing algorithm, as TensorFlow's `BFCAllocator` runs it: chunks of
//! 256-byte multiples carved from regions, split on allocation, merged with free neighbours on
//! free. Free chunks wait in two indexes ([`free_index`]): those below `first_fit_above` bytes
//! by size (TensorFlow's best fit), the others by address (first fit). A free finds its block in
//! a map of live blocks ([`live`]; TensorFlow indexes a handle per 256 bytes of every region).
//! All of it runs under the allocator's lock. How regions are taken and given back
//! (TensorFlow's regions, or one expandable reservation) is in [`growth`].

mod free_index;
mod growth;
mod live;

use free_index::{FreeIndex, Order};
pub(crate) use growth::{Growth, GrowthOptions};
use live::LiveBlocks;

use super::SplitPolicy;
use super::dump::{BinSummary, ChunkInfo, ExpandableInfo, MemoryDump, RegionInfo};
use crate::observe::{LargestBlocks, LiveBlock};
use crate::{AllocatorStats, SubAllocator};

/// log2 of the minimum chunk size.
pub(crate) const MIN_ALLOCATION_BITS: u32 = 8;
/// Every chunk is a multiple of this, and every chunk address is aligned to it.
pub const MIN_ALLOCATION_SIZE: usize = 1 << MIN_ALLOCATION_BITS;
/// Bin `i` holds free chunks of at least `256 << i` bytes (the last one, everything larger).
pub const NUM_BINS: usize = 21;
/// Regions are asked for with at least this alignment, so chunk addresses are 256-byte aligned.
pub(crate) const REGION_ALIGNMENT: usize = MIN_ALLOCATION_SIZE;

type Handle = u32;
const NONE: Handle = Handle::MAX;

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
    /// The region's first chunk (at `base`).
    first: Handle,
    /// The sub-allocator's pieces behind this region (more than one when adjacent regions were
    /// coalesced), as `(address, bytes it reported)`; empty for an expandable region, whose
    /// pieces the [`Growth`] keeps.
    pieces: Vec<(usize, usize)>,
    /// The region's last chunk.
    last: Handle,
}

impl Region {
    fn end(&self) -> usize {
        self.base + self.size
    }
}

/// Why a free was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FreeError {
    /// No region of this allocator contains the address.
    Foreign,
    /// The address is inside a region but no chunk starts there, and it is not inside a free
    /// chunk either.
    NotAChunk,
    /// A chunk starts there but is free, or the address lies inside a free chunk (the freed
    /// block was merged into a free neighbour): a double free.
    AlreadyFree,
}

/// Why an allocation failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AllocFailure {
    /// The rounded request is larger than the memory limit.
    OverLimit,
    /// No free chunk fits and no memory could be added within the limit.
    OutOfMemory,
}

/// The allocator's options, fixed at construction.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Options {
    /// The limit as configured (reported in the stats).
    pub(crate) memory_limit: usize,
    pub(crate) split: SplitPolicy,
    pub(crate) max_internal_fragmentation: usize,
    /// Free bytes kept committed before frees give memory back; `None`: keep everything.
    pub(crate) release_threshold: Option<usize>,
    /// Requests of at least this many bytes take the lowest-address free chunk that fits.
    pub(crate) first_fit_above: usize,
    /// How far above the peak in use reserved may rise before a commit gives free memory back
    /// first (a fraction of the peak); `None`: never.
    pub(crate) peak_headroom: Option<f64>,
}

/// The allocator's whole state.
#[derive(Debug)]
pub(crate) struct State {
    /// The allocator's name, for the segment events it reports.
    name: Box<str>,
    chunks: Vec<Chunk>,
    free_handles: Vec<Handle>,
    /// The chunk of every block handed out, by its address, for frees.
    live: LiveBlocks,
    /// Sorted by base address.
    regions: Vec<Region>,
    /// The free chunks below `first_fit_above` bytes by `(size, address)`: the first one
    /// fitting is the smallest fit with the lowest address.
    by_size: FreeIndex,
    /// The free chunks of at least `first_fit_above` bytes by address, for address-ordered
    /// first fit. Every free chunk is in `by_size` or here.
    by_address: FreeIndex,
    options: Options,
    growth: Growth,
    /// Bytes taken from the backing memory (as it reported them; committed bytes when
    /// expandable).
    reserved: usize,
    peak_reserved: usize,
    /// The most bytes ever reserved (not reset with the stats): commits below it never give
    /// memory back first.
    high_water: usize,
    /// Bytes of regions usable for chunks.
    usable: usize,
    next_id: u64,
    /// Bytes (chunk sizes) ever handed out.
    total_allocated: u64,
    pub(crate) num_allocs: u64,
    pub(crate) num_frees: u64,
    in_use: usize,
    peak_in_use: usize,
    largest_alloc: usize,
    pub(crate) num_ooms: u64,
}

impl State {
    pub(crate) fn new(name: &str, options: Options, growth: Growth) -> Self {
        Self {
            name: name.into(),
            chunks: Vec::new(),
            free_handles: Vec::new(),
            live: LiveBlocks::default(),
            regions: Vec::new(),
            by_size: FreeIndex::new(Order::BySize),
            by_address: FreeIndex::new(Order::ByAddress),
            options,
            growth,
            reserved: 0,
            peak_reserved: 0,
            high_water: 0,
            usable: 0,
            next_id: 1,
            total_allocated: 0,
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

    /// The limit as configured.
    pub(crate) fn memory_limit(&self) -> usize {
        self.options.memory_limit
    }

    /// The peak headroom in effect.
    pub(crate) fn peak_headroom(&self) -> Option<f64> {
        self.options.peak_headroom
    }

    /// Whether the allocator grows one expandable region.
    pub(crate) fn is_expandable(&self) -> bool {
        matches!(self.growth, Growth::Expandable(_))
    }

    /// Bytes taken from the backing memory now.
    pub(crate) fn reserved(&self) -> usize {
        self.reserved
    }

    /// Allocates `rounded` bytes (already a multiple of 256) at an `align`-aligned address for a
    /// request of `requested`.
    pub(crate) fn allocate(
        &mut self,
        requested: usize,
        rounded: usize,
        align: usize,
        sub: &dyn SubAllocator,
        garbage_collection: bool,
    ) -> Result<usize, AllocFailure> {
        if rounded > self.growth.usable_limit() {
            return Err(AllocFailure::OverLimit);
        }
        if let Some(p) = self.find_chunk(rounded, align, requested, sub) {
            return Ok(p);
        }
        if self.extend(rounded, align, sub)
            && let Some(p) = self.find_chunk(rounded, align, requested, sub)
        {
            return Ok(p);
        }
        if garbage_collection
            && self.free_unused_regions(sub, 0) > 0
            && self.extend(rounded, align, sub)
            && let Some(p) = self.find_chunk(rounded, align, requested, sub)
        {
            return Ok(p);
        }
        Err(AllocFailure::OutOfMemory)
    }

    /// Takes a free chunk that holds `rounded` bytes at an `align`-aligned address and hands
    /// those bytes out: the lowest-address one for requests of at least `first_fit_above`
    /// bytes (address-ordered first fit keeps large free space together), else the smallest
    /// one (the lowest address on a tie). For alignments up to 256 every chunk of at least
    /// `rounded` bytes fits; for larger ones each candidate is checked with its real padding,
    /// so a chunk that happens to be aligned is not passed over.
    fn find_chunk(&mut self, rounded: usize, align: usize, requested: usize, sub: &dyn SubAllocator) -> Option<usize> {
        // The padding before the first aligned address is below `align`; a chunk fits when what
        // is left after it still holds `rounded` bytes.
        let fits = |size: usize, ptr: usize| {
            size >= rounded
                && (align <= MIN_ALLOCATION_SIZE
                    || size.checked_sub(ptr.next_multiple_of(align) - ptr).is_some_and(|s| s >= rounded))
        };
        let found = if rounded >= self.options.first_fit_above {
            self.by_address.first(rounded, fits)
        } else {
            // The smallest small chunk that fits, else the lowest-address large one of the
            // smallest size class that has one.
            self.by_size.first(rounded, fits).or_else(|| self.by_address.smallest_class_first(rounded, fits))
        };
        let mut h = found?;
        let found = self.chunks[h as usize];
        let prefix = found.ptr.next_multiple_of(align) - found.ptr;
        let splits = self.options.split.splits(found.size - prefix, rounded, self.options.max_internal_fragmentation);
        // The block's memory must be committed before anything changes (an expandable region
        // may have decommitted holes under it).
        let end = if splits { found.ptr + prefix + rounded } else { found.ptr + found.size };
        if !self.commit_holes(found.ptr + prefix, end, sub) {
            return None;
        }
        if prefix > 0 {
            // Keep the misaligned prefix as a free chunk of its own (its previous neighbour is in
            // use, or it would have been merged with this chunk already), in the found chunk's
            // place in the index.
            let kept = h;
            h = self.split(kept, prefix);
            self.reindex((found.ptr, found.size, kept), kept);
            if splits {
                let rest = self.split(h, rounded);
                self.insert_free(rest);
            }
        } else if splits {
            // The rest takes the found chunk's place in the index.
            let rest = self.split(h, rounded);
            self.reindex((found.ptr, found.size, h), rest);
        } else {
            self.remove_free(h);
        }
        let c = &mut self.chunks[h as usize];
        c.requested = requested;
        c.id = self.next_id;
        self.next_id += 1;
        let (ptr, size) = (c.ptr, c.size);
        self.live.insert(ptr, h);
        self.num_allocs += 1;
        self.total_allocated += size as u64;
        self.in_use += size;
        self.peak_in_use = self.peak_in_use.max(self.in_use);
        self.largest_alloc = self.largest_alloc.max(requested);
        Some(ptr)
    }

    /// Splits chunk `h` so that it keeps `size` bytes; the rest becomes a free chunk, in no
    /// index yet. Returns the rest.
    fn split(&mut self, h: Handle, size: usize) -> Handle {
        let c = self.chunks[h as usize];
        let rest = self.new_chunk(Chunk {
            ptr: c.ptr + size,
            size: c.size - size,
            requested: 0,
            id: 0,
            prev: h,
            next: c.next,
        });
        self.chunks[h as usize].size = size;
        self.chunks[h as usize].next = rest;
        if c.next != NONE {
            self.chunks[c.next as usize].prev = rest;
        } else {
            self.set_last(c.ptr, rest);
        }
        rest
    }

    /// Frees the chunk at `ptr` and merges it with free neighbours; with a release threshold,
    /// gives free memory back past it. Returns the chunk's size.
    pub(crate) fn deallocate(&mut self, ptr: usize, sub: &dyn SubAllocator) -> Result<usize, FreeError> {
        let Some(h) = self.live.take(ptr) else { return Err(self.why_not_a_chunk(ptr)) };
        debug_assert!(self.chunks[h as usize].in_use(), "a live block's chunk at {ptr:#x} is free");
        let size = self.chunks[h as usize].size;
        self.chunks[h as usize].id = 0;
        self.chunks[h as usize].requested = 0;
        self.in_use -= size;
        self.num_frees += 1;
        // The merged chunk takes a free neighbour's place in the index: by address, in place.
        let next = self.chunks[h as usize].next;
        let prev = self.chunks[h as usize].prev;
        let next_free = next != NONE && !self.chunks[next as usize].in_use();
        let prev_free = prev != NONE && !self.chunks[prev as usize].in_use();
        match (prev_free, next_free) {
            (false, false) => self.insert_free(h),
            (false, true) => {
                let old = self.entry(next);
                self.merge(h, next);
                self.reindex(old, h);
            }
            (true, next_free) => {
                if next_free {
                    self.remove_free(next);
                    self.merge(h, next);
                }
                let old = self.entry(prev);
                self.merge(prev, h);
                self.reindex(old, prev);
            }
        }
        if let Some(keep) = self.options.release_threshold
            && self.free_committed() > keep
        {
            self.release(sub, keep, false);
        }
        Ok(size)
    }

    /// Why no block starts at `ptr`: outside every region, at or inside a free chunk (a block
    /// freed twice, perhaps merged with a neighbour in between), or inside a live block.
    #[cold]
    fn why_not_a_chunk(&self, ptr: usize) -> FreeError {
        let Some(r) = self.region_of(ptr).map(|i| &self.regions[i]) else { return FreeError::Foreign };
        // The chunk holding `ptr`: a walk along the region (an error path only).
        let mut h = r.first;
        while h != NONE {
            let c = &self.chunks[h as usize];
            if ptr < c.ptr + c.size {
                return if c.in_use() || !ptr.is_multiple_of(MIN_ALLOCATION_SIZE) {
                    FreeError::NotAChunk
                } else {
                    FreeError::AlreadyFree
                };
            }
            h = c.next;
        }
        FreeError::NotAChunk
    }

    /// Absorbs `b` (which directly follows `a`) into `a`. Neither may be in a bin.
    fn merge(&mut self, a: Handle, b: Handle) {
        let cb = self.chunks[b as usize];
        self.chunks[a as usize].size += cb.size;
        self.chunks[a as usize].next = cb.next;
        if cb.next != NONE {
            self.chunks[cb.next as usize].prev = a;
        } else {
            self.set_last(cb.ptr, a);
        }
        self.free_handles.push(b);
    }

    /// Adds `size` usable bytes at `base`, `reported` of them taken from the backing memory,
    /// after the region ending at `base` when there is one and `coalesce` allows it (the new
    /// chunk merges with that region's free tail), else as a region of its own.
    fn add_region(&mut self, base: usize, size: usize, piece: Option<(usize, usize)>, coalesce: bool) {
        self.usable += size;
        let at = self.regions.partition_point(|r| r.base < base);
        if coalesce && at > 0 && self.regions[at - 1].end() == base {
            let last = self.regions[at - 1].last;
            let h = self.new_chunk(Chunk { ptr: base, size, requested: 0, id: 0, prev: last, next: NONE });
            self.chunks[last as usize].next = h;
            let r = &mut self.regions[at - 1];
            r.size += size;
            r.pieces.extend(piece);
            r.last = h;
            if !self.chunks[last as usize].in_use() {
                let old = self.entry(last);
                self.merge(last, h);
                self.reindex(old, last);
            } else {
                self.insert_free(h);
            }
            return;
        }
        let h = self.new_chunk(Chunk { ptr: base, size, requested: 0, id: 0, prev: NONE, next: NONE });
        self.regions.insert(at, Region { base, size, first: h, pieces: piece.into_iter().collect(), last: h });
        self.insert_free(h);
    }

    /// The free chunk at the very end of the last region, if the region ends with one.
    fn free_tail(&self) -> Option<Handle> {
        let h = self.regions.last()?.last;
        (!self.chunks[h as usize].in_use()).then_some(h)
    }

    /// Records `h` as the last chunk of the region holding `ptr`.
    fn set_last(&mut self, ptr: usize, h: Handle) {
        if let Some(i) = self.region_of(ptr) {
            self.regions[i].last = h;
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

    /// The index a free chunk of `size` bytes waits in.
    fn index_for(&mut self, size: usize) -> &mut FreeIndex {
        if size < self.options.first_fit_above { &mut self.by_size } else { &mut self.by_address }
    }

    /// How free chunk `h` is indexed now: `(address, size, handle)`.
    fn entry(&self, h: Handle) -> (usize, usize, Handle) {
        let c = &self.chunks[h as usize];
        (c.ptr, c.size, h)
    }

    /// Indexes free chunk `new` in place of the entry `old` (a free chunk's `(address, size,
    /// handle)` as indexed): in place when it sorts at the same position, as when a chunk grows
    /// or shrinks without changing its address order.
    fn reindex(&mut self, old: (usize, usize, Handle), new: Handle) {
        let (ptr, size, _) = self.entry(new);
        let large = |n: usize| n >= self.options.first_fit_above;
        if large(old.1) == large(size) {
            let replaced = self.index_for(size).replace(old, (ptr, size, new));
            debug_assert!(replaced, "free chunk at {:#x} was not indexed", old.0);
        } else {
            let removed = self.index_for(old.1).remove(old.0, old.1, old.2);
            debug_assert!(removed, "free chunk at {:#x} was not indexed", old.0);
            self.index_for(size).insert(ptr, size, new);
        }
    }

    fn insert_free(&mut self, h: Handle) {
        let c = self.chunks[h as usize];
        self.index_for(c.size).insert(c.ptr, c.size, h);
    }

    /// Takes free chunk `h` out of its index (its size and address as when it went in).
    fn remove_free(&mut self, h: Handle) {
        let c = self.chunks[h as usize];
        let removed = self.index_for(c.size).remove(c.ptr, c.size, h);
        debug_assert!(removed, "free chunk at {:#x} was not indexed", c.ptr);
    }

    fn region_of(&self, ptr: usize) -> Option<usize> {
        let i = self.regions.partition_point(|r| r.end() <= ptr);
        (i < self.regions.len() && self.regions[i].base <= ptr).then_some(i)
    }

    /// `release_cached`: every free byte that can go (see [`release`](Self::release)), and the
    /// live-block map's spare capacity (host memory of the allocator's own, left by an earlier
    /// peak of live blocks). Returns the bytes of managed memory given back.
    pub(crate) fn release_cached(&mut self, sub: &dyn SubAllocator) -> usize {
        self.live.shrink();
        self.release(sub, 0, true)
    }

    /// `(requested, allocated, id)` of the live chunk at `ptr`.
    pub(crate) fn live_chunk(&self, ptr: usize) -> Option<(usize, usize, u64)> {
        let c = &self.chunks[self.live.get(ptr)? as usize];
        Some((c.requested, c.size, c.id))
    }

    /// The `n` largest live blocks (by bytes asked for), largest first; of equal sizes, the
    /// lowest addresses. The chunk table is scanned in memory order: the slots of merged chunks
    /// are free (`check` verifies it), and in-use chunks are exactly the live blocks.
    pub(crate) fn largest_live(&self, n: usize) -> Vec<LiveBlock> {
        let mut largest = LargestBlocks::new(n);
        for c in self.chunks.iter().filter(|c| c.in_use()) {
            largest.push(LiveBlock { address: c.ptr, requested: c.requested, allocated: c.size });
        }
        largest.into_sorted()
    }

    /// The largest free chunk.
    pub(crate) fn largest_free(&self) -> usize {
        self.by_address.largest().max(self.by_size.largest())
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
            bytes_limit: Some(self.options.memory_limit as u64),
            bytes_reserved: self.reserved as u64,
            peak_bytes_reserved: self.peak_reserved as u64,
            largest_free_block_bytes: Some(largest_free as u64),
            fragmentation: Some(if free == 0 { 0.0 } else { (free - largest_free) as f64 / free as f64 }),
            num_alloc_retries: 0,
            num_ooms: self.num_ooms,
            total_bytes_allocated: Some(self.total_allocated),
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
            let mut h = r.first;
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
                    bin: (!c.in_use()).then(|| bin_for_size(c.size)),
                    in_use: c.in_use(),
                    allocation_id: c.in_use().then_some(c.id),
                });
                h = c.next;
            }
        }
        let expandable = self.growth.info().map(|(reserved, committed, pieces, granule)| ExpandableInfo {
            reserved_address_space: reserved as u64,
            committed: committed as u64,
            pieces,
            granule: granule as u64,
        });
        MemoryDump::new(name.to_owned(), self.stats(), bins, regions, chunks).with_expandable(expandable)
    }

    /// Checks every invariant; for tests. Returns a description of the first violation.
    pub(crate) fn check(&self) -> Result<(), String> {
        // `largest_live` scans the chunk table: a slot out of every region must read as free.
        if let Some(&h) = self.free_handles.iter().find(|&&h| self.chunks[h as usize].in_use()) {
            return Err(format!("the unused chunk slot {h} reads as in use"));
        }
        let mut in_use = 0;
        let mut free_chunks = 0;
        let mut usable = 0;
        let mut live = 0;
        for r in &self.regions {
            usable += r.size;
            let mut h = r.first;
            let mut expect = r.base;
            let mut prev = NONE;
            while h != NONE {
                let c = &self.chunks[h as usize];
                if c.ptr != expect || c.prev != prev {
                    return Err(format!("chunk list broken at {:#x}", c.ptr));
                }
                if c.size == 0 || !c.size.is_multiple_of(MIN_ALLOCATION_SIZE) {
                    return Err(format!("chunk at {:#x} has size {}", c.ptr, c.size));
                }
                if c.in_use() {
                    in_use += c.size;
                    live += 1;
                    if self.live.get(c.ptr) != Some(h) {
                        return Err(format!("the block at {:#x} is not in the live map", c.ptr));
                    }
                    if self.growth.has_hole_in(c.ptr, c.ptr + c.size) {
                        return Err(format!("the block at {:#x} lies over decommitted memory", c.ptr));
                    }
                } else {
                    free_chunks += 1;
                    if prev != NONE && !self.chunks[prev as usize].in_use() {
                        return Err(format!("two free neighbours at {:#x}", c.ptr));
                    }
                    let index = if c.size < self.options.first_fit_above { &self.by_size } else { &self.by_address };
                    if !index.contains(c.ptr, c.size, h) {
                        return Err(format!("free chunk at {:#x} is not in its index", c.ptr));
                    }
                }
                expect = c.ptr + c.size;
                prev = h;
                h = c.next;
            }
            if expect != r.end() {
                return Err(format!("region {:#x} not covered by its chunks", r.base));
            }
            if prev != r.last {
                return Err(format!("region {:#x}: wrong last chunk", r.base));
            }
        }
        if self.live.len() != live {
            return Err(format!("{} blocks in the live map for {live} chunks in use", self.live.len()));
        }
        self.by_size.check()?;
        self.by_address.check()?;
        if self.by_size.iter().any(|e| e.1 >= self.options.first_fit_above) {
            return Err("a large free chunk is in the best-fit index".to_owned());
        }
        if self.by_address.iter().any(|e| e.1 < self.options.first_fit_above) {
            return Err("a small free chunk is in the first-fit index".to_owned());
        }
        let indexed = self.by_size.len() + self.by_address.len();
        if indexed != free_chunks {
            return Err(format!("{indexed} chunks indexed, {free_chunks} free chunks in regions"));
        }
        if in_use != self.in_use {
            return Err(format!("in use {} but chunks in use sum to {in_use}", self.in_use));
        }
        if usable != self.usable {
            return Err(format!("usable {} but regions sum to {usable}", self.usable));
        }
        self.growth.check(&self.regions, self.reserved)
    }
}
