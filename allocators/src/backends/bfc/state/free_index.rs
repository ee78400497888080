//! [`FreeIndex`]: free chunks in key order, by size (best fit) or by address (first fit).
//!
//! A BFC has few free chunks at a time (tens on PyTorch's recorded streams), so an index is a
//! sorted array cut into blocks of at most [`BLOCK_MAX`] entries, each block knowing its largest
//! chunk: "the first chunk in key order of at least `n` bytes" skips every block too small and
//! scans one. With one block (the usual case) that is one short scan of contiguous memory; with
//! many free chunks, insertion and removal move at most a block's entries, and a search looks at
//! the block maxima first. Nothing is allocated once the blocks exist.
//!
//! What it replaced: TensorFlow's 21 bins and 128 address classes, each a `BTreeSet`. With so few
//! free chunks the sets kept going from empty to one element and back, allocating and freeing a
//! B-tree node each time. An intrusive treap (links in the chunks, no allocation) was tried too
//! and was slower still at these sizes: a dependent load per level.

use core::cell::Cell;

use super::Handle;

/// A block splits in two above this many entries.
const BLOCK_MAX: usize = 64;

/// Size classes: four per power of two from 256 bytes, the last holding everything from 2^39.
const SIZE_CLASSES: usize = 128;

/// The size class of a chunk of `n` bytes: every chunk of a higher class is larger than any
/// chunk of a lower one.
fn size_class(n: usize) -> usize {
    let units = (n.max(256) >> 8) as u64;
    let lg = 63 - units.leading_zeros() as usize;
    // The two bits below the leading one (zeros shifted in below 4 units); `units < 2^56`, so the
    // shift by 2 keeps every bit. Without a branch: this runs for every chunk a search looks at.
    let quarter = ((units << 2) >> lg) as usize & 3;
    (lg * 4 + quarter).min(SIZE_CLASSES - 1)
}

/// How an index orders its chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Order {
    /// By `(size, address)`: the first chunk of at least `n` bytes is the smallest fit, the
    /// lowest address on a tie.
    BySize,
    /// By address: the first chunk of at least `n` bytes is the lowest-address fit.
    ByAddress,
}

/// One free chunk. Entries are ordered by `(key, ptr)`; the key is the size or the address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    key: usize,
    ptr: usize,
    size: usize,
    handle: Handle,
}

impl Entry {
    fn order(&self) -> (usize, usize) {
        (self.key, self.ptr)
    }
}

#[derive(Debug, Default)]
struct Block {
    /// Sorted by [`Entry::order`].
    entries: Vec<Entry>,
    /// The largest size in `entries` (0 when empty).
    max: usize,
}

impl Block {
    fn recompute_max(&mut self) {
        self.max = self.entries.iter().map(|e| e.size).max().unwrap_or(0);
    }
}

/// Free chunks in key order, in blocks that each know their largest chunk; by address, with a
/// count of chunks per size class (a quarter of a power of two).
#[derive(Debug)]
pub(super) struct FreeIndex {
    order: Order,
    /// In key order, every block non-empty except a lone first one.
    blocks: Vec<Block>,
    len: usize,
    /// Chunks per [`size_class`] (by address only; zeros by size).
    class_counts: [u32; SIZE_CLASSES],
    /// Bit `c` set when `class_counts[c] > 0`.
    classes: u128,
    /// `(block, position)` of the entry [`first`](Self::first) found last: the allocation path
    /// replaces or removes that entry next, and finds it here without a search.
    found: Cell<(usize, usize)>,
}

impl FreeIndex {
    pub(super) fn new(order: Order) -> Self {
        Self {
            order,
            blocks: vec![Block::default()],
            len: 0,
            class_counts: [0; SIZE_CLASSES],
            classes: 0,
            found: Cell::new((usize::MAX, 0)),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    fn entry(&self, ptr: usize, size: usize, handle: Handle) -> Entry {
        let key = match self.order {
            Order::BySize => size,
            Order::ByAddress => ptr,
        };
        Entry { key, ptr, size, handle }
    }

    /// The block that holds, or would hold, an entry ordered at `at`.
    fn block_for(&self, at: (usize, usize)) -> usize {
        let i = self.blocks.partition_point(|b| b.entries.last().is_some_and(|e| e.order() < at));
        i.min(self.blocks.len() - 1)
    }

    /// `(block, position)` of entry `e`: where [`first`](Self::first) found it last, else
    /// searched for.
    fn locate(&self, e: &Entry) -> Option<(usize, usize)> {
        let (bi, at) = self.found.get();
        if self.blocks.get(bi).and_then(|b| b.entries.get(at)) == Some(e) {
            return Some((bi, at));
        }
        let bi = self.block_for(e.order());
        let at = self.blocks[bi].entries.binary_search_by(|x| x.order().cmp(&e.order())).ok()?;
        (self.blocks[bi].entries[at] == *e).then_some((bi, at))
    }

    /// Adds free chunk `handle` at `ptr` of `size` bytes (not indexed yet).
    pub(super) fn insert(&mut self, ptr: usize, size: usize, handle: Handle) {
        let e = self.entry(ptr, size, handle);
        let bi = self.block_for(e.order());
        let b = &mut self.blocks[bi];
        let at = b.entries.partition_point(|x| x.order() < e.order());
        b.entries.insert(at, e);
        b.max = b.max.max(size);
        if b.entries.len() > BLOCK_MAX {
            let upper = b.entries.split_off(BLOCK_MAX / 2);
            b.recompute_max();
            let mut next = Block { entries: upper, max: 0 };
            next.recompute_max();
            self.blocks.insert(bi + 1, next);
        }
        self.len += 1;
        self.class_added(size);
    }

    /// Counts a chunk of `size` bytes more in its size class. Only the address index keeps the
    /// counts ([`smallest_class_first`](Self::smallest_class_first) searches by address); by
    /// size, the order itself is by class.
    fn class_added(&mut self, size: usize) {
        if self.order == Order::ByAddress {
            let class = size_class(size);
            self.class_counts[class] += 1;
            self.classes |= 1 << class;
        }
    }

    /// Counts a chunk of `size` bytes less in its size class (see [`class_added`](Self::class_added)).
    fn class_removed(&mut self, size: usize) {
        if self.order == Order::ByAddress {
            let class = size_class(size);
            self.class_counts[class] -= 1;
            if self.class_counts[class] == 0 {
                self.classes &= !(1 << class);
            }
        }
    }

    /// Removes the entry of chunk `handle` at `ptr` of `size` bytes (as it was inserted);
    /// returns whether it was there.
    pub(super) fn remove(&mut self, ptr: usize, size: usize, handle: Handle) -> bool {
        let e = self.entry(ptr, size, handle);
        let Some((bi, at)) = self.locate(&e) else { return false };
        self.remove_at(bi, at);
        true
    }

    /// Removes the entry at `(block, position)`, as [`locate`](Self::locate) found it.
    fn remove_at(&mut self, bi: usize, at: usize) {
        let b = &mut self.blocks[bi];
        let size = b.entries.remove(at).size;
        if size == b.max {
            b.recompute_max();
        }
        if b.entries.is_empty() && self.blocks.len() > 1 {
            self.blocks.remove(bi);
        }
        self.len -= 1;
        self.class_removed(size);
    }

    /// Replaces the entry `old` (`(address, size, handle)` as inserted) by `new`: in place when
    /// `new` sorts at the same position (a chunk that grew or shrank without passing another
    /// in key order), else by a removal and an insertion. Returns whether `old` was there.
    pub(super) fn replace(&mut self, old: (usize, usize, Handle), new: (usize, usize, Handle)) -> bool {
        let o = self.entry(old.0, old.1, old.2);
        let n = self.entry(new.0, new.1, new.2);
        let Some((bi, at)) = self.locate(&o) else { return false };
        let b = &self.blocks[bi];
        let before = match at {
            0 => bi.checked_sub(1).and_then(|p| self.blocks[p].entries.last()),
            _ => b.entries.get(at - 1),
        };
        let after = match b.entries.get(at + 1) {
            Some(e) => Some(e),
            None => self.blocks.get(bi + 1).and_then(|b| b.entries.first()),
        };
        if before.is_some_and(|e| e.order() >= n.order()) || after.is_some_and(|e| e.order() <= n.order()) {
            self.remove_at(bi, at);
            self.insert(new.0, new.1, new.2);
            return true;
        }
        let b = &mut self.blocks[bi];
        b.entries[at] = n;
        if n.size >= b.max {
            b.max = n.size;
        } else if o.size == b.max {
            b.recompute_max();
        }
        if self.order == Order::ByAddress && size_class(o.size) != size_class(n.size) {
            self.class_removed(o.size);
            self.class_added(n.size);
        }
        true
    }

    /// The first chunk in key order of at least `min` bytes for which `fits(size, address)`
    /// holds: the smallest fit (lowest address on a tie) by size, the lowest-address fit by
    /// address.
    pub(super) fn first(&self, min: usize, fits: impl Fn(usize, usize) -> bool) -> Option<Handle> {
        let from = match self.order {
            // Blocks below the first one holding sizes of `min` hold only smaller chunks.
            Order::BySize => self.block_for((min, 0)),
            Order::ByAddress => 0,
        };
        let (bi, at) = self.blocks[from..].iter().enumerate().filter(|(_, b)| b.max >= min).find_map(|(i, b)| {
            b.entries.iter().position(|e| e.size >= min && fits(e.size, e.ptr)).map(|at| (from + i, at))
        })?;
        self.found.set((bi, at));
        Some(self.blocks[bi].entries[at].handle)
    }

    /// The first chunk in key order of at least `min` bytes for which `fits(size, address)`
    /// holds in the smallest size class (a quarter of a power of two) that has one. By address
    /// that is close to best fit, without leaving address order within a class.
    pub(super) fn smallest_class_first(&self, min: usize, fits: impl Fn(usize, usize) -> bool) -> Option<Handle> {
        debug_assert_eq!(self.order, Order::ByAddress, "only the address index counts size classes");
        let lowest = size_class(min);
        let mut classes = self.classes >> lowest << lowest;
        while classes != 0 {
            let c = classes.trailing_zeros() as usize;
            classes &= classes - 1;
            let found = self.first(min, |size, ptr| size_class(size) == c && fits(size, ptr));
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// The largest chunk (0 when empty).
    pub(super) fn largest(&self) -> usize {
        match self.order {
            Order::BySize => self.blocks.last().and_then(|b| b.entries.last()).map_or(0, |e| e.size),
            Order::ByAddress => self.blocks.iter().map(|b| b.max).max().unwrap_or(0),
        }
    }

    /// Whether chunk `handle` is indexed at `ptr` with `size`.
    pub(super) fn contains(&self, ptr: usize, size: usize, handle: Handle) -> bool {
        let e = self.entry(ptr, size, handle);
        self.blocks[self.block_for(e.order())].entries.contains(&e)
    }

    /// Every entry in key order, as `(address, size, handle)`.
    pub(super) fn iter(&self) -> impl DoubleEndedIterator<Item = (usize, usize, Handle)> + '_ {
        self.blocks.iter().flat_map(|b| b.entries.iter().map(|e| (e.ptr, e.size, e.handle)))
    }

    /// Checks the blocks: entries strictly increasing across them, keys right, maxima right, no
    /// empty block but a lone one, the counts right.
    pub(super) fn check(&self) -> Result<(), String> {
        let mut last = None;
        let mut counts = [0; SIZE_CLASSES];
        for b in &self.blocks {
            if b.entries.is_empty() && self.blocks.len() > 1 {
                return Err(format!("the {:?} index has an empty block", self.order));
            }
            if b.entries.len() > BLOCK_MAX {
                return Err(format!("a {:?} index block holds {} entries", self.order, b.entries.len()));
            }
            if b.max != b.entries.iter().map(|e| e.size).max().unwrap_or(0) {
                return Err(format!("a {:?} index block's maximum is out of date", self.order));
            }
            for e in &b.entries {
                if last.is_some_and(|l| l >= e.order()) || *e != self.entry(e.ptr, e.size, e.handle) {
                    return Err(format!("the {:?} index is out of order at {:#x}", self.order, e.ptr));
                }
                last = Some(e.order());
                if self.order == Order::ByAddress {
                    counts[size_class(e.size)] += 1;
                }
            }
        }
        let mask = (0..SIZE_CLASSES).filter(|&c| counts[c] > 0).fold(0u128, |m, c| m | 1 << c);
        if counts != self.class_counts || mask != self.classes {
            return Err(format!("the {:?} index's size-class counts are out of date", self.order));
        }
        let count: usize = self.blocks.iter().map(|b| b.entries.len()).sum();
        if count != self.len {
            return Err(format!("the {:?} index counts {} entries but holds {count}", self.order, self.len));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 300 chunks: address i * 4096, size 256 * (1 + i % 7): blocks split several times.
    fn filled(order: Order) -> FreeIndex {
        let mut index = FreeIndex::new(order);
        for i in 0..300u32 {
            index.insert(i as usize * 4096, 256 * (1 + i as usize % 7), i);
        }
        assert!(index.blocks.len() > 4);
        index.check().unwrap();
        index
    }

    #[test]
    fn by_address_first_fit_across_blocks() {
        let mut index = filled(Order::ByAddress);
        assert_eq!((index.len(), index.largest()), (300, 256 * 7));
        // The first chunk of 7 * 256 bytes is number 6; of 6 * 256, number 5.
        assert_eq!(index.first(256 * 7, |_, _| true), Some(6));
        assert_eq!(index.first(256 * 6, |_, _| true), Some(5));
        // Not at an address below 100 * 4096: the first one from there.
        assert_eq!(index.first(256 * 7, |_, p| p >= 100 * 4096), Some(104));
        assert_eq!(index.first(256 * 8, |_, _| true), None);
        // For 3 * 256 + 1 bytes the smallest class with a fit is that of 4 * 256: number 3.
        assert_eq!(index.smallest_class_first(3 * 256 + 1, |_, _| true), Some(3));
        // Removing every chunk of 7 * 256 bytes leaves 6 * 256 the largest.
        for i in (6..300u32).step_by(7) {
            assert!(index.remove(i as usize * 4096, 256 * 7, i));
        }
        assert!(!index.remove(6 * 4096, 256 * 7, 6), "already removed");
        assert!(!index.remove(5 * 4096, 256 * 6, 99), "another chunk's handle");
        index.check().unwrap();
        assert_eq!(index.largest(), 256 * 6);
        assert_eq!(index.first(256 * 7, |_, _| true), None);
        assert!(index.contains(5 * 4096, 256 * 6, 5));
        assert!(!index.contains(5 * 4096, 256 * 5, 5));
        for i in 0..300u32 {
            index.remove(i as usize * 4096, 256 * (1 + i as usize % 7), i);
        }
        index.check().unwrap();
        assert_eq!((index.len(), index.blocks.len(), index.largest(), index.iter().count()), (0, 1, 0, 0));
    }

    #[test]
    fn by_size_best_fit_across_blocks() {
        let mut index = filled(Order::BySize);
        assert_eq!(index.largest(), 256 * 7);
        // Best fit for 3 * 256 + 1 bytes: the lowest-address chunk of 4 * 256 (number 3).
        assert_eq!(index.first(3 * 256 + 1, |_, _| true), Some(3));
        // The smallest fit at or above address 200 * 4096: 206 has 4 * 256 bytes.
        assert_eq!(index.first(3 * 256 + 1, |_, p| p >= 200 * 4096), Some(206));
        assert!(index.remove(3 * 4096, 4 * 256, 3));
        assert_eq!(index.first(4 * 256, |_, _| true), Some(10));
        let sizes: Vec<usize> = index.iter().map(|e| e.1).collect();
        assert!(sizes.is_sorted());
        index.check().unwrap();
        // Chunk 10 grows to 7 * 256 bytes: it moves to the end of its size's run.
        assert!(index.replace((10 * 4096, 4 * 256, 10), (10 * 4096, 7 * 256, 10)));
        assert!(!index.replace((10 * 4096, 4 * 256, 10), (10 * 4096, 7 * 256, 10)), "not there any more");
        index.check().unwrap();
        assert_eq!(index.first(4 * 256, |_, _| true), Some(17));
        assert_eq!(index.first(7 * 256, |_, p| p < 13 * 4096), Some(6));
        assert_eq!(index.first(7 * 256, |_, p| p > 6 * 4096 && p < 13 * 4096), Some(10));
    }

    #[test]
    fn replace_in_place_and_across_blocks() {
        let mut index = filled(Order::ByAddress);
        // Chunk 8 (2 * 256 bytes) grows forwards to 8 * 256 bytes: same place by address.
        assert!(index.replace((8 * 4096, 2 * 256, 8), (8 * 4096, 8 * 256, 8)));
        index.check().unwrap();
        assert_eq!((index.largest(), index.first(8 * 256, |_, _| true)), (8 * 256, Some(8)));
        // Chunk 8's place taken by handle 1000 starting 256 bytes later.
        assert!(index.replace((8 * 4096, 8 * 256, 8), (8 * 4096 + 256, 7 * 256, 1000)));
        index.check().unwrap();
        assert_eq!(index.largest(), 7 * 256);
        // Chunk 0 moved past chunk 1 by address: a removal and an insertion, still in order.
        assert!(index.replace((0, 256, 0), (4096 + 256, 256, 0)));
        index.check().unwrap();
        assert_eq!(index.iter().nth(1).map(|e| e.2), Some(0));
        assert_eq!(index.len(), 300);
    }

    #[test]
    fn where_first_found_an_entry_is_checked_before_use() {
        for order in [Order::ByAddress, Order::BySize] {
            let mut index = filled(order);
            // Found at its place: replaced without a search.
            let h = index.first(256 * 7, |_, p| p >= 50 * 4096).unwrap();
            assert_eq!(h, 55);
            assert!(index.replace((55 * 4096, 7 * 256, 55), (55 * 4096 + 256, 6 * 256, 55)));
            index.check().unwrap();
            // Found, then everything after it shifted by an insertion in front: the remembered
            // position now holds another entry, which must not be taken for it.
            let h = index.first(256 * 7, |_, p| p >= 100 * 4096).unwrap();
            assert_eq!(h, 104);
            index.insert(103 * 4096 + 2048, 7 * 256, 1000);
            let (bi, at) = index.found.get();
            assert_eq!(index.blocks[bi].entries[at].handle, 1000, "the remembered place is stale");
            assert!(!index.remove(104 * 4096, 6 * 256, 104), "no such entry (wrong size)");
            assert!(index.remove(104 * 4096, 7 * 256, 104));
            assert!(!index.contains(104 * 4096, 7 * 256, 104));
            assert!(index.contains(103 * 4096 + 2048, 7 * 256, 1000), "the entry in its place stays");
            index.check().unwrap();
            assert_eq!(index.len(), 300);
        }
    }

    /// `smallest_class_first` against its definition, on chunks of pseudo-random sizes (many in
    /// each class, so that a class can hold chunks too small for a request) and a `fits` that
    /// turns some chunks down by address.
    #[test]
    fn smallest_class_first_is_the_first_fit_of_the_smallest_class_with_one() {
        let mut index = FreeIndex::new(Order::ByAddress);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut chunks = Vec::new();
        for i in 0..400u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let size = 256 * (1 + (x % 3000) as usize);
            let ptr = (i as usize) << 24;
            index.insert(ptr, size, i);
            chunks.push((ptr, size, i));
        }
        index.check().unwrap();
        let fits = |_: usize, ptr: usize| (ptr >> 24) % 5 != 3;
        for min in (256..3200 * 256).step_by(4 * 256 + 256) {
            let want = chunks
                .iter()
                .filter(|&&(p, s, _)| s >= min && fits(s, p))
                .min_by_key(|&&(p, s, _)| (size_class(s), p))
                .map(|c| c.2);
            assert_eq!(index.smallest_class_first(min, fits), want, "min {min}");
        }
        assert_eq!(index.smallest_class_first(3001 * 256, fits), None);
    }

    /// The branch-free quarter against the two cases written out.
    #[test]
    fn size_class_is_the_quarter_octave_of_256_byte_units() {
        let reference = |n: usize| {
            let units = (n.max(256) >> 8) as u64;
            let lg = 63 - units.leading_zeros() as usize;
            let quarter = if lg >= 2 { (units >> (lg - 2)) as usize & 3 } else { (units << (2 - lg)) as usize & 3 };
            (lg * 4 + quarter).min(SIZE_CLASSES - 1)
        };
        let mut sizes: Vec<usize> = (0..1 << 16).step_by(37).collect();
        for shift in 0..usize::BITS {
            let p = 1usize << shift;
            sizes.extend([p - 1, p, p + 1, p | p >> 1, p | p >> 2, (p | p >> 1 | p >> 2) - 1]);
        }
        sizes.push(usize::MAX);
        for n in sizes {
            assert_eq!(size_class(n), reference(n), "{n} bytes");
        }
        assert_eq!([size_class(256), size_class(512), size_class(1024), size_class(1280)], [0, 4, 8, 9]);
    }

    #[test]
    fn size_classes_are_ordered() {
        let classes: Vec<usize> = (1..4096usize).map(|k| size_class(k * 256)).collect();
        assert!(classes.is_sorted());
        assert_eq!(size_class(256), size_class(1));
        assert_eq!(size_class(usize::MAX), SIZE_CLASSES - 1);
    }
}
