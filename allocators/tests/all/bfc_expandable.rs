//! BfcAllocator over expandable memory: reservation, need-sized growth, coalescing across growth
//! steps, giving memory back, the release threshold, split policies, and the faults: a refused
//! reservation (RLIMIT_AS), a refused commit, a limit below one granule.

use std::alloc::Layout;
use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

use parking_lot::Mutex;
use tensormem_allocators::{
    AllocErrorKind, AllocationAttributes, Allocator, AllocatorExt, BfcAllocator, BuildError, ExpandableMemory,
    OsMemory, OsSubAllocator, SplitPolicy, SubAllocator,
};

const KIB: usize = 1024;
const MIB: usize = 1 << 20;

fn alloc(bfc: &BfcAllocator, size: usize) -> NonNull<u8> {
    bfc.allocate_raw(Layout::from_size_align(size, 8).unwrap(), &AllocationAttributes::default()).unwrap()
}

fn free(bfc: &BfcAllocator, p: NonNull<u8>, size: usize) {
    // SAFETY: tests free each block once with the size it was allocated with.
    unsafe { bfc.deallocate_raw(p, Layout::from_size_align(size, 8).unwrap()) };
}

fn reserved(bfc: &BfcAllocator) -> usize {
    bfc.check_invariants().unwrap();
    bfc.stats().unwrap().bytes_reserved as usize
}

/// Host memory that counts what is committed, can refuse commits, and (when it cannot decommit
/// partially, like a GPU mapping) checks that every decommit is exactly one earlier commit.
#[derive(Debug)]
struct Counting {
    committed: AtomicUsize,
    refuse: AtomicBool,
    partial: bool,
    pieces: Mutex<Vec<(usize, usize)>>,
    bad_decommits: AtomicUsize,
    /// Whether it moves pages (`OsMemory::relocate`), the bytes it moved, and in how many calls.
    relocating: bool,
    moved: AtomicUsize,
    moves: AtomicUsize,
    refuse_moves: AtomicBool,
    /// Whether it says which pages are resident (`OsMemory::resident`); if not, the BFC moves
    /// free pages without asking.
    reports_residency: AtomicBool,
}

impl Counting {
    fn new(partial: bool) -> Arc<Self> {
        Self::with(partial, false)
    }

    fn with(partial: bool, relocating: bool) -> Arc<Self> {
        Arc::new(Self {
            committed: AtomicUsize::new(0),
            refuse: AtomicBool::new(false),
            partial,
            pieces: Mutex::new(Vec::new()),
            bad_decommits: AtomicUsize::new(0),
            relocating,
            moved: AtomicUsize::new(0),
            moves: AtomicUsize::new(0),
            refuse_moves: AtomicBool::new(false),
            reports_residency: AtomicBool::new(false),
        })
    }
}

// SAFETY: every call is forwarded to `OsMemory`, which keeps the contract; this type only counts.
unsafe impl ExpandableMemory for Counting {
    fn granule(&self) -> usize {
        OsMemory.granule()
    }
    fn reserve(&self, bytes: usize) -> io::Result<NonNull<u8>> {
        OsMemory.reserve(bytes)
    }
    unsafe fn commit(&self, ptr: NonNull<u8>, bytes: usize) -> io::Result<()> {
        if self.refuse.load(SeqCst) {
            return Err(io::Error::new(io::ErrorKind::OutOfMemory, "refused by the test"));
        }
        // SAFETY: forwarded with the caller's promise.
        unsafe { OsMemory.commit(ptr, bytes) }?;
        self.committed.fetch_add(bytes, SeqCst);
        self.pieces.lock().push((ptr.as_ptr() as usize, bytes));
        Ok(())
    }
    unsafe fn decommit(&self, ptr: NonNull<u8>, bytes: usize) {
        let mut pieces = self.pieces.lock();
        match pieces.iter().position(|&p| p == (ptr.as_ptr() as usize, bytes)) {
            Some(i) => {
                pieces.remove(i);
            }
            None if !self.partial => {
                self.bad_decommits.fetch_add(1, SeqCst);
            }
            None => {}
        }
        self.committed.fetch_sub(bytes, SeqCst);
        // SAFETY: forwarded with the caller's promise.
        unsafe { OsMemory.decommit(ptr, bytes) }
    }
    unsafe fn release(&self, ptr: NonNull<u8>, bytes: usize) {
        self.committed.store(0, SeqCst);
        // SAFETY: forwarded with the caller's promise.
        unsafe { OsMemory.release(ptr, bytes) }
    }
    fn decommits_partially(&self) -> bool {
        self.partial
    }
    fn relocates(&self) -> bool {
        self.relocating
    }
    unsafe fn relocate(&self, from: NonNull<u8>, to: NonNull<u8>, bytes: usize) -> io::Result<()> {
        if !self.relocating || self.refuse_moves.load(SeqCst) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "refused by the test"));
        }
        // SAFETY: forwarded with the caller's promise.
        unsafe { OsMemory.relocate(from, to, bytes) }?;
        self.moved.fetch_add(bytes, SeqCst);
        self.moves.fetch_add(1, SeqCst);
        Ok(())
    }
    fn resident(&self, ptr: NonNull<u8>, bytes: usize) -> Option<usize> {
        if self.reports_residency.load(SeqCst) { OsMemory.resident(ptr, bytes) } else { None }
    }
    fn name(&self) -> &str {
        "counting"
    }
}

/// The sub-allocator handing out `Counting` memory.
#[derive(Debug)]
struct CountingSub(Arc<Counting>);

// SAFETY: regions come from the OS sub-allocator; the expandable form is `Counting`.
unsafe impl SubAllocator for CountingSub {
    fn alloc_region(&self, min_bytes: usize, alignment: usize) -> Option<(NonNull<u8>, usize)> {
        OsSubAllocator.alloc_region(min_bytes, alignment)
    }
    unsafe fn free_region(&self, ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: forwarded with the caller's promise.
        unsafe { OsSubAllocator.free_region(ptr, bytes) }
    }
    fn max_alignment(&self) -> usize {
        OsSubAllocator.max_alignment()
    }
    fn expandable(&self) -> Option<&dyn ExpandableMemory> {
        Some(&*self.0)
    }
}

fn counting_bfc(limit: usize, partial: bool) -> (Arc<Counting>, BfcAllocator) {
    let memory = Counting::new(partial);
    let bfc = BfcAllocator::builder()
        .memory_limit(limit as u64)
        .sub_allocator(Arc::new(CountingSub(memory.clone())))
        .build()
        .unwrap();
    (memory, bfc)
}

#[test]
fn the_limit_costs_address_space_not_memory() {
    // Without allow_growth, TensorFlow's allocator took its whole limit at the first allocation.
    let bfc = BfcAllocator::builder().memory_limit(64 << 30).build().unwrap();
    assert!(bfc.is_expandable());
    assert_eq!(reserved(&bfc), 0);
    let p = alloc(&bfc, 100);
    assert_eq!(reserved(&bfc), 2 * MIB, "one growth granule, not 64 GiB");
    let d = bfc.memory_dump();
    let e = d.expandable.as_ref().unwrap();
    assert_eq!((e.reserved_address_space, e.committed, e.pieces, e.granule), (64 << 30, 2 << 20, 1, 4096));
    assert!(d.render().contains("expandable: 2.0 MiB committed in 1 pieces of 64.0 GiB reserved"), "{}", d.render());
    free(&bfc, p, 100);
}

#[test]
fn growth_is_sized_to_need_and_chunks_coalesce_across_growth_steps() {
    let (memory, bfc) = counting_bfc(1 << 30, true);
    let a = alloc(&bfc, 3 * MIB); // commits 4 MiB (3 MiB rounded up to the 2 MiB granule)
    assert_eq!(reserved(&bfc), 4 * MIB);
    // 1 MiB is free at the end: a 5 MiB block needs 4 MiB more, and spans both commits.
    let b = alloc(&bfc, 5 * MIB);
    assert_eq!(reserved(&bfc), 8 * MIB);
    assert_eq!(b.as_ptr() as usize, a.as_ptr() as usize + 3 * MIB, "b starts right after a, in the first piece");
    assert_eq!(memory.committed.load(SeqCst), 8 * MIB, "committed bytes = what the stats call reserved");
    let d = bfc.memory_dump();
    assert_eq!(d.regions.len(), 1, "one region grows: {:?}", d.regions);
    assert_eq!(d.expandable.unwrap().pieces, 2);
    // A doubling allocator would have taken 2 + 4 + 8 = 14 MiB; a 30 MiB request now takes 30.
    let c = alloc(&bfc, 30 * MIB);
    assert_eq!(reserved(&bfc), 38 * MIB);
    for (p, n) in [(a, 3 * MIB), (b, 5 * MIB), (c, 30 * MIB)] {
        free(&bfc, p, n);
    }
    assert_eq!(bfc.memory_dump().chunks.len(), 1, "all of it merged into one free chunk");
    assert_eq!(bfc.stats().unwrap().peak_bytes_reserved, 38 * MIB as u64);
}

#[test]
fn release_cached_decommits_the_free_tail_and_keeps_live_blocks() {
    let (memory, bfc) = counting_bfc(1 << 30, true);
    let a = alloc(&bfc, 10 * MIB);
    let b = alloc(&bfc, 20 * MIB);
    // SAFETY: `a` holds 10 MiB; mark it to check it survives the release.
    unsafe { a.as_ptr().write_bytes(0x5A, 10 * MIB) };
    free(&bfc, b, 20 * MIB);
    assert_eq!(reserved(&bfc), 30 * MIB);
    assert_eq!(bfc.release_cached(), 20 * MIB, "the free 20 MiB after `a` go back");
    assert_eq!((reserved(&bfc), memory.committed.load(SeqCst)), (10 * MIB, 10 * MIB));
    // SAFETY: `a` is still live.
    assert!(unsafe { std::slice::from_raw_parts(a.as_ptr(), 10 * MIB) }.iter().all(|&x| x == 0x5A));
    assert_eq!(bfc.release_cached(), 0, "nothing more can go while `a` lives");
    free(&bfc, a, 10 * MIB);
    assert_eq!(bfc.release_cached(), 10 * MIB);
    assert_eq!((reserved(&bfc), memory.committed.load(SeqCst)), (0, 0), "nothing live: nothing committed");
    assert!(bfc.memory_dump().regions.is_empty());
    // It grows again from the start of the reservation.
    let c = alloc(&bfc, MIB);
    assert_eq!(c, a);
    assert_eq!(reserved(&bfc), 2 * MIB);
    free(&bfc, c, MIB);
}

#[test]
fn release_cached_also_gives_back_a_free_hole_before_a_live_block() {
    let (memory, bfc) = counting_bfc(1 << 30, true);
    let a = alloc(&bfc, 8 * MIB);
    let b = alloc(&bfc, MIB);
    free(&bfc, a, 8 * MIB);
    assert_eq!(reserved(&bfc), 10 * MIB);
    // The 1 MiB tail after `b` is decommitted and so is the 8 MiB hole before it (its pages;
    // the addresses stay): only `b` stays committed.
    assert_eq!(bfc.release_cached(), 9 * MIB);
    assert_eq!(reserved(&bfc), MIB);
    assert_eq!(memory.committed.load(SeqCst), MIB, "committed bytes = what the stats call reserved");
    // A block placed over the hole commits it again, and its memory is usable.
    let c = alloc(&bfc, 4 * MIB);
    assert_eq!(c, a, "the hole is reused at the same address");
    // SAFETY: `c` is 4 MiB, just allocated.
    unsafe { c.as_ptr().write_bytes(0xAB, 4 * MIB) };
    assert_eq!(reserved(&bfc), 5 * MIB);
    assert_eq!(memory.committed.load(SeqCst), 5 * MIB);
    free(&bfc, c, 4 * MIB);
    free(&bfc, b, MIB);
    assert_eq!(bfc.release_cached(), 5 * MIB);
    assert_eq!((reserved(&bfc), memory.committed.load(SeqCst)), (0, 0));
}

#[test]
fn growth_keeps_free_memory_between_blocks_and_release_cached_gives_it_back() {
    let (memory, bfc) = counting_bfc(1 << 30, true);
    let a = alloc(&bfc, 6 * MIB);
    let b = alloc(&bfc, MIB); // 2 MiB more committed, 1 MiB of it a free tail
    free(&bfc, a, 6 * MIB);
    assert_eq!(reserved(&bfc), 8 * MIB);
    // 10 MiB fits in no free chunk: 9 MiB more is needed after the 1 MiB tail, 10 MiB is
    // committed; the 6 MiB hole stays committed (decommitting it on growth cost 75x in time on
    // the training stream, as blocks land on holes again and again).
    let c = alloc(&bfc, 10 * MIB);
    assert_eq!(reserved(&bfc), 18 * MIB);
    // Asked: the hole and the 1 MiB free tail go.
    assert_eq!(bfc.release_cached(), 7 * MIB);
    assert_eq!((reserved(&bfc), memory.committed.load(SeqCst)), (11 * MIB, 11 * MIB));
    let d = bfc.memory_dump();
    assert_eq!((d.stats.bytes_reserved, d.expandable.unwrap().committed), (11 << 20, 11 << 20));
    // Using the hole again commits what is used of it.
    let e = alloc(&bfc, 2 * MIB);
    assert_eq!(e, a);
    // SAFETY: `e` is 2 MiB, just allocated.
    unsafe { e.as_ptr().write_bytes(1, 2 * MIB) };
    assert_eq!(reserved(&bfc), 13 * MIB);
    for (p, n) in [(b, MIB), (c, 10 * MIB), (e, 2 * MIB)] {
        free(&bfc, p, n);
    }
    assert_eq!(bfc.release_cached(), 13 * MIB);
    assert_eq!((reserved(&bfc), memory.committed.load(SeqCst)), (0, 0));
}

/// Frees the `live` blocks, then checks that `release_cached` gives back `held` bytes and leaves
/// nothing committed, by the stats and by the memory.
fn free_and_release_all(bfc: &BfcAllocator, memory: &Counting, live: &[(NonNull<u8>, usize)], held: usize) {
    for &(p, n) in live {
        free(bfc, p, n);
    }
    assert_eq!(bfc.release_cached(), held);
    assert_eq!((reserved(bfc), memory.committed.load(SeqCst)), (0, 0));
}

/// A 1 GiB BFC over `Counting` memory with a peak headroom of 0.
fn headroom_bfc(partial: bool) -> (Arc<Counting>, BfcAllocator) {
    headroom_bfc_over(Counting::new(partial))
}

/// A 1 GiB BFC over `memory` with a peak headroom of 0.
fn headroom_bfc_over(memory: Arc<Counting>) -> (Arc<Counting>, BfcAllocator) {
    let sub = Arc::new(CountingSub(memory.clone()));
    let bfc =
        BfcAllocator::builder().memory_limit(1 << 30).sub_allocator(sub).peak_headroom(Some(0.0)).build().unwrap();
    (memory, bfc)
}

#[test]
fn a_peak_headroom_gives_back_a_trapped_chunk_before_the_region_grows() {
    let (memory, bfc) = headroom_bfc(true);
    let a = alloc(&bfc, 100 * MIB);
    let b = alloc(&bfc, MIB); // 2 MiB committed for it, 1 MiB of it a free tail
    free(&bfc, a, 100 * MIB);
    assert_eq!(reserved(&bfc), 102 * MIB);
    // 200 MiB fits nowhere: 199 MiB more after the free tail, 200 MiB committed. Without a
    // headroom reserved would reach 302 MiB with 201 MiB in use; with 0 the 100 MiB chunk
    // trapped below `b` is decommitted first, so reserved never passes 202 MiB.
    let c = alloc(&bfc, 200 * MIB);
    assert_eq!(reserved(&bfc), 202 * MIB);
    assert_eq!(bfc.stats().unwrap().peak_bytes_reserved, 202 << 20, "not even for a moment");
    assert_eq!(memory.committed.load(SeqCst), 202 * MIB, "committed bytes = what the stats call reserved");
    // A block on the hole commits what it needs again, and the 1 MiB free tail goes to make
    // room: reserved is what is in use.
    let d = alloc(&bfc, 50 * MIB);
    assert_eq!(d, a, "first fit reuses the hole's addresses");
    // SAFETY: `d` is 50 MiB, just allocated.
    unsafe { d.as_ptr().write_bytes(0xCD, 50 * MIB) };
    assert_eq!(reserved(&bfc), 251 * MIB);
    assert_eq!(memory.committed.load(SeqCst), 251 * MIB);
    // Freed, the 50 MiB stay committed (the headroom acts on commits, not on frees), and a
    // block that fits in them commits nothing.
    free(&bfc, d, 50 * MIB);
    let e = alloc(&bfc, 30 * MIB);
    assert_eq!((e, reserved(&bfc)), (a, 251 * MIB));
    free_and_release_all(&bfc, &memory, &[(b, MIB), (c, 200 * MIB), (e, 30 * MIB)], 251 * MIB);
}

#[cfg(target_os = "linux")]
#[test]
fn a_peak_headroom_moves_a_trapped_chunks_pages_to_where_the_region_grows() {
    let (memory, bfc) = headroom_bfc_over(Counting::with(true, true));
    let a = alloc(&bfc, 100 * MIB);
    // SAFETY: `a` is 100 MiB, just allocated.
    unsafe { a.as_ptr().write_bytes(0xAB, 100 * MIB) };
    let b = alloc(&bfc, MIB); // 2 MiB committed for it, 1 MiB of it a free tail
    free(&bfc, a, 100 * MIB);
    // 200 MiB fit nowhere: 199 MiB more after the 1 MiB free tail, 200 MiB committed at the end.
    // The 100 MiB chunk trapped below `b` is over the headroom: its pages move to the first 100
    // MiB of the new piece (the frames and what they hold go with them), 100 MiB are committed.
    let c = alloc(&bfc, 200 * MIB);
    assert_eq!(c.as_ptr() as usize, b.as_ptr() as usize + MIB, "c starts in the free tail");
    assert_eq!(memory.moved.load(SeqCst), 100 * MIB);
    assert_eq!(reserved(&bfc), 202 * MIB);
    assert_eq!(bfc.stats().unwrap().peak_bytes_reserved, 202 << 20, "not even for a moment");
    assert_eq!(memory.committed.load(SeqCst), 202 * MIB, "committed bytes = what the stats call reserved");
    // SAFETY: `c` is 200 MiB: bytes 1 MiB..101 MiB are the moved pages, the rest fresh ones.
    unsafe {
        assert_eq!((*c.as_ptr().add(MIB), *c.as_ptr().add(101 * MIB - 1)), (0xAB, 0xAB), "the pages moved");
        assert_eq!(*c.as_ptr().add(101 * MIB), 0, "committed fresh");
        c.as_ptr().write_bytes(0xCD, 200 * MIB);
    }
    // A block on the hole finds no span of free pages to move (the 1 MiB free tail after `c` is
    // too small to be worth a move; it is given back) and commits its own.
    let d = alloc(&bfc, 50 * MIB);
    assert_eq!(d, a, "first fit reuses the hole's addresses");
    // SAFETY: `d` is 50 MiB, just allocated.
    unsafe { d.as_ptr().write_bytes(0xEF, 50 * MIB) };
    assert_eq!(
        (reserved(&bfc), memory.committed.load(SeqCst), memory.moved.load(SeqCst)),
        (251 * MIB, 251 * MIB, 100 * MIB)
    );
    // Freed, `c` is free pages above the hole's rest: a block over the rest of the hole takes
    // them (from the top of `c`'s chunk) instead of committing more.
    free(&bfc, c, 200 * MIB);
    let e = alloc(&bfc, 40 * MIB);
    assert_eq!(e.as_ptr() as usize, d.as_ptr() as usize + 50 * MIB, "on the rest of the hole");
    // SAFETY: `e` is 40 MiB, just allocated.
    unsafe {
        assert_eq!(*e.as_ptr().add(40 * MIB - 1), 0xCD, "what `c` left in the moved pages");
        e.as_ptr().write_bytes(0x11, 40 * MIB);
    }
    assert_eq!(
        (reserved(&bfc), memory.committed.load(SeqCst), memory.moved.load(SeqCst)),
        (251 * MIB, 251 * MIB, 140 * MIB)
    );
    free_and_release_all(&bfc, &memory, &[(b, MIB), (d, 50 * MIB), (e, 40 * MIB)], 251 * MIB);
}

#[cfg(target_os = "linux")]
#[test]
fn a_peak_headroom_moves_only_pages_that_were_touched_and_gives_back_the_others() {
    // The trapped chunk of the test above, its block written whole or only its first byte.
    let trap = |written: usize| {
        let memory = Counting::with(true, true);
        memory.reports_residency.store(true, SeqCst);
        let (memory, bfc) = headroom_bfc_over(memory);
        let a = alloc(&bfc, 100 * MIB);
        // SAFETY: `a` is 100 MiB, just allocated.
        unsafe { a.as_ptr().write_bytes(0xAB, written) };
        // What the BFC will sample: one 4 KiB page per byte written, or a 2 MiB one where
        // transparent huge pages are on for all memory.
        let sampled = OsMemory.resident(a, 2 * MIB).unwrap();
        let b = alloc(&bfc, MIB);
        free(&bfc, a, 100 * MIB);
        let c = alloc(&bfc, 200 * MIB);
        assert_eq!(c.as_ptr() as usize, b.as_ptr() as usize + MIB, "c starts in the free tail");
        // The same bytes reserved either way, never more.
        assert_eq!((reserved(&bfc), memory.committed.load(SeqCst)), (202 * MIB, 202 * MIB), "{written} bytes written");
        assert_eq!(bfc.stats().unwrap().peak_bytes_reserved, 202 << 20);
        // SAFETY: `c` is 200 MiB, just allocated.
        let first_moved = unsafe {
            let first_moved = *c.as_ptr().add(MIB);
            c.as_ptr().write_bytes(0xCD, 200 * MIB);
            first_moved
        };
        let moved = (memory.moved.load(SeqCst), memory.moves.load(SeqCst));
        free_and_release_all(&bfc, &memory, &[(b, MIB), (c, 200 * MIB)], 202 * MIB);
        (moved, first_moved, sampled)
    };
    // Written: its pages are resident, and they move (in a few calls), bytes and all.
    let ((moved, moves), first, _) = trap(100 * MIB);
    assert_eq!((moved, first), (100 * MIB, 0xAB));
    assert!((1..=8).contains(&moves), "{moves} moves");
    // One byte written: one page resident of 25,600. A move would save one page fault, so the
    // chunk is given back and fresh pages (zeros) committed for `c`, with no move at all.
    match trap(1) {
        (moved, first, 4096) => assert_eq!((moved, first), ((0, 0), 0)),
        // With huge pages for all memory the byte faulted in 2 MiB: the piece sampled there
        // (whole 16 MiB units from the chunk's start) is worth a move; the rest need not be.
        (moved, first, sampled) => {
            assert_eq!((first, sampled), (0xAB, 2 * MIB));
            assert!((16 * MIB..=100 * MIB).contains(&moved.0), "{} MiB moved", moved.0 / MIB);
        }
    }
    assert_eq!(trap(0), ((0, 0), 0, 0));
}

#[cfg(target_os = "linux")]
#[test]
fn os_memory_counts_resident_pages() {
    let page = 4096;
    let base = OsMemory.reserve(64 * MIB).unwrap();
    assert_eq!(OsMemory.resident(base, 64 * MIB), Some(0), "reserved: nothing behind it");
    // SAFETY: the first 32 MiB of our fresh reservation.
    unsafe { OsMemory.commit(base, 32 * MIB) }.unwrap();
    // 4 KiB pages even where transparent huge pages are on for all memory (a touch would fault
    // in 2 MiB there).
    // SAFETY: advice on our own committed range; it changes no contents.
    assert_eq!(unsafe { libc::madvise(base.as_ptr().cast(), 32 * MIB, libc::MADV_NOHUGEPAGE) }, 0);
    assert_eq!(OsMemory.resident(base, 32 * MIB), Some(0), "committed, not touched yet");
    // Three pages touched, one of them past the first 4096 pages (one mincore call's worth).
    for at in [0, 5 * page, 4100 * page] {
        // SAFETY: inside the committed 32 MiB.
        unsafe { base.as_ptr().add(at).write(1) };
    }
    assert_eq!(OsMemory.resident(base, 32 * MIB), Some(3 * page));
    assert_eq!(OsMemory.resident(base, 64 * MIB), Some(3 * page));
    let at = |off: usize| NonNull::new(base.as_ptr().wrapping_add(off)).unwrap();
    assert_eq!(OsMemory.resident(at(page), 4 * page), Some(0));
    assert_eq!(OsMemory.resident(at(page), 5 * page), Some(page), "the range's last page");
    assert_eq!(OsMemory.resident(at(page), page / 2), Some(0), "part of a page");
    assert_eq!(OsMemory.resident(at(1), page), None, "not page-aligned");
    assert_eq!(OsMemory.resident(at(0), usize::MAX), None, "past the address space");
    // SAFETY: the committed 32 MiB, unused.
    unsafe { OsMemory.decommit(base, 32 * MIB) };
    assert_eq!(OsMemory.resident(base, 32 * MIB), Some(0), "decommitted");
    // SAFETY: the whole reservation, released once.
    unsafe { OsMemory.release(base, 64 * MIB) };
    // Not `base` again: another test's thread may map those addresses by now. The second page
    // of the address space lies below `vm.mmap_min_addr` (64 KiB by default): never mapped.
    let low = NonNull::new(std::ptr::without_provenance_mut::<u8>(page)).unwrap();
    assert_eq!(OsMemory.resident(low, page), None, "not mapped");
}

#[cfg(target_os = "linux")]
#[test]
fn by_default_a_peak_headroom_moves_pages_only_over_memory_that_moves_them() {
    let build = |memory: &Arc<Counting>, headroom: Option<Option<f64>>| {
        let b = BfcAllocator::builder().memory_limit(1 << 30).sub_allocator(Arc::new(CountingSub(memory.clone())));
        match headroom {
            Some(h) => b.peak_headroom(h),
            None => b,
        }
        .build()
        .unwrap()
    };
    // Unset: 4% over memory that moves pages; none over memory that could only give them back
    // (to be faulted in again) or unmaps whole pieces only (a GPU mapping).
    let moving = Counting::with(true, true);
    assert_eq!(build(&moving, None).peak_headroom(), Some(tensormem_allocators::DEFAULT_PEAK_HEADROOM));
    assert_eq!(build(&Counting::new(true), None).peak_headroom(), None);
    assert_eq!(build(&Counting::new(false), None).peak_headroom(), None);
    assert_eq!(build(&moving, Some(None)).peak_headroom(), None, "turned off");

    // A 100 MiB chunk trapped below a live block while a 200 MiB block needs the region to grow.
    let trap = |bfc: &BfcAllocator| {
        let a = alloc(bfc, 100 * MIB);
        let b = alloc(bfc, MIB);
        free(bfc, a, 100 * MIB);
        let c = alloc(bfc, 200 * MIB);
        let r = reserved(bfc);
        free(bfc, b, MIB);
        free(bfc, c, 200 * MIB);
        r
    };
    let off = Counting::with(true, true);
    assert_eq!(trap(&build(&off, Some(None))), 302 * MIB, "without a headroom the region grows by 200 MiB");
    assert_eq!(off.moved.load(SeqCst), 0);
    let on = Counting::with(true, true);
    let bfc = build(&on, None);
    let r = trap(&bfc);
    // 201 MiB in use at the peak: at most 4% above it (whole 2 MiB pieces), the rest moved.
    assert!((201 * MIB..=201 * MIB * 104 / 100 + 2 * MIB).contains(&r), "{} MiB", r / MIB);
    assert!(on.moved.load(SeqCst) >= 90 * MIB, "{} MiB moved", on.moved.load(SeqCst) / MIB);
    assert_eq!(on.committed.load(SeqCst), r, "committed bytes = what the stats call reserved");
}

/// How many of this process's memory mappings overlap `lo..hi`.
#[cfg(target_os = "linux")]
fn mappings_in(lo: usize, hi: usize) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?))
        })
        .filter(|&(a, b)| a < hi && lo < b)
        .count()
}

#[cfg(target_os = "linux")]
#[test]
fn pages_moving_back_and_forth_between_two_places_move_in_few_calls() {
    // The training stream's step in small: X, Y1, Y2 allocated upwards, Y1 and X freed, Z1 fits
    // below Y2 but Z2 does not, so the 100 MiB left below Y2 is trapped and its pages move to
    // where the region grows for Z2. The next step puts Y1 over the hole they left, and pages
    // move back. Sizes are not multiples of the move unit.
    let (memory, bfc) = headroom_bfc_over(Counting::with(true, true));
    let mut per_step = Vec::new();
    let mut mappings = Vec::new();
    let mut base = None;
    for step in 0..12 {
        let before = memory.moves.load(SeqCst);
        let x = alloc(&bfc, 100 * MIB);
        let base = *base.get_or_insert(x.as_ptr() as usize);
        let y1 = alloc(&bfc, 203 * MIB);
        let y2 = alloc(&bfc, 203 * MIB);
        free(&bfc, y1, 203 * MIB);
        free(&bfc, x, 100 * MIB);
        let z1 = alloc(&bfc, 203 * MIB);
        let z2 = alloc(&bfc, 203 * MIB);
        // SAFETY: each block was just allocated with the size written here.
        unsafe {
            for (p, n) in [(y2, 203 * MIB), (z1, 203 * MIB), (z2, 203 * MIB)] {
                p.as_ptr().write_bytes(step as u8, n);
            }
        }
        assert_eq!(reserved(&bfc), memory.committed.load(SeqCst), "step {step}");
        assert!(reserved(&bfc) <= 610 * MIB, "step {step}: reserved {} MiB", reserved(&bfc) / MIB);
        for (p, n) in [(y2, 203 * MIB), (z1, 203 * MIB), (z2, 203 * MIB)] {
            free(&bfc, p, n);
        }
        per_step.push(memory.moves.load(SeqCst) - before);
        mappings.push(mappings_in(base, base + (1 << 30)));
    }
    // Whole 16 MiB units move first, then the chunk's edges as they are: each move is one or
    // two calls, the same ones every step (measured: 4 a step, 7 mappings from the second step
    // on). Edges given back and committed fresh instead were a new mapping every step.
    assert!(per_step[2..].iter().all(|&n| (1..=4).contains(&n)), "moves per step: {per_step:?}");
    assert!(mappings[2..].iter().all(|&n| n == mappings[2] && n <= 8), "mappings: {mappings:?}");
    free_and_release_all(&bfc, &memory, &[], reserved(&bfc));
}

#[cfg(target_os = "linux")]
#[test]
fn a_refused_move_falls_back_to_giving_the_trapped_chunk_back() {
    let (memory, bfc) = headroom_bfc_over(Counting::with(true, true));
    let a = alloc(&bfc, 100 * MIB);
    let b = alloc(&bfc, MIB);
    free(&bfc, a, 100 * MIB);
    // The memory refuses the move (as a kernel without MREMAP_DONTUNMAP would): the trapped
    // chunk is decommitted instead, and the headroom still holds.
    memory.refuse_moves.store(true, SeqCst);
    let c = alloc(&bfc, 200 * MIB);
    assert_eq!(memory.moved.load(SeqCst), 0);
    assert_eq!((reserved(&bfc), memory.committed.load(SeqCst)), (202 * MIB, 202 * MIB));
    assert_eq!(bfc.stats().unwrap().peak_bytes_reserved, 202 << 20);
    free(&bfc, b, MIB);
    free(&bfc, c, 200 * MIB);
}

#[test]
fn a_peak_headroom_leaves_small_chunks_and_whole_piece_memory_alone() {
    for (partial, small) in [(true, true), (false, false)] {
        let (memory, bfc) = headroom_bfc(partial);
        // A trapped chunk below 64 MiB is not worth the page faults; memory that unmaps whole
        // commits only (a GPU mapping) cannot give back part of one.
        let trapped = if small { 32 * MIB } else { 100 * MIB };
        let a = alloc(&bfc, trapped);
        let b = alloc(&bfc, MIB);
        free(&bfc, a, trapped);
        let c = alloc(&bfc, 2 * trapped);
        assert_eq!(reserved(&bfc), trapped + 2 * MIB + 2 * trapped, "partial {partial}");
        assert_eq!(memory.bad_decommits.load(SeqCst), 0);
        free(&bfc, b, MIB);
        free(&bfc, c, 2 * trapped);
    }
}

#[test]
fn a_peak_headroom_must_be_a_fraction_of_at_least_zero() {
    for bad in [-0.01, f64::NAN, f64::INFINITY] {
        let e = BfcAllocator::builder().memory_limit(1 << 30).peak_headroom(Some(bad)).build().unwrap_err();
        assert!(matches!(e, BuildError::InvalidOption { option: "peak_headroom", .. }), "{bad}: {e:?}");
        assert!(e.to_string().contains(&format!("a headroom of {bad}")), "{e}");
    }
    for ok in [None, Some(0.0), Some(0.04), Some(2.0)] {
        assert!(BfcAllocator::builder().memory_limit(1 << 30).peak_headroom(ok).build().is_ok());
    }
}

#[test]
fn a_hole_that_cannot_be_committed_again_is_an_oom_and_nothing_changes() {
    let (memory, bfc) = counting_bfc(1 << 30, true);
    let a = alloc(&bfc, 8 * MIB);
    let b = alloc(&bfc, MIB);
    free(&bfc, a, 8 * MIB);
    assert_eq!(bfc.release_cached(), 9 * MIB);
    memory.refuse.store(true, SeqCst);
    let err = bfc.allocate_raw(Layout::from_size_align(4 * MIB, 8).unwrap(), &AllocationAttributes::default());
    let err = err.expect_err("the hole could not be committed");
    let msg = err.to_string();
    assert!(msg.contains("could not allocate 4.0 MiB") && msg.contains("out of memory"), "{msg}");
    assert_eq!(err.reserved(), Some(MIB as u64));
    assert_eq!(reserved(&bfc), MIB);
    memory.refuse.store(false, SeqCst);
    let c = alloc(&bfc, 4 * MIB);
    assert_eq!(c, a);
    free(&bfc, c, 4 * MIB);
    free(&bfc, b, MIB);
}

#[test]
fn memory_that_decommits_whole_pieces_only_gets_whole_pieces_back() {
    // Like a GPU mapping: only what one commit mapped can be unmapped.
    let (memory, bfc) = counting_bfc(1 << 30, false);
    let a = alloc(&bfc, 3 * MIB); // piece 1: 4 MiB
    let b = alloc(&bfc, 6 * MIB); // piece 2: 6 MiB - 1 MiB free tail = 5 MiB, rounded to 6 MiB
    let c = alloc(&bfc, 11 * MIB); // piece 3: 11 MiB - 1 MiB free tail = 10 MiB
    assert_eq!(reserved(&bfc), 20 * MIB);
    free(&bfc, c, 11 * MIB);
    // The free tail is 1 MiB of piece 2 + piece 3: only piece 3 lies wholly inside it.
    assert_eq!(bfc.release_cached(), 10 * MIB);
    assert_eq!(reserved(&bfc), 10 * MIB);
    free(&bfc, b, 6 * MIB);
    free(&bfc, a, 3 * MIB);
    assert_eq!(bfc.release_cached(), 10 * MIB);
    assert_eq!(memory.committed.load(SeqCst), 0);
    assert_eq!(memory.bad_decommits.load(SeqCst), 0, "every decommit was exactly one commit");
    assert!(memory.pieces.lock().is_empty());
}

#[test]
fn a_release_threshold_gives_memory_back_as_frees_happen() {
    let bfc = BfcAllocator::builder().memory_limit(1 << 30).release_threshold(Some(4 * MIB as u64)).build().unwrap();
    let a = alloc(&bfc, 64 * MIB);
    let b = alloc(&bfc, MIB);
    assert_eq!(reserved(&bfc), 66 * MIB);
    free(&bfc, b, MIB);
    // 2 MiB free: under the threshold, kept.
    assert_eq!(reserved(&bfc), 66 * MIB);
    free(&bfc, a, 64 * MIB);
    // 66 MiB free: all but 4 MiB go at once.
    assert_eq!(reserved(&bfc), 4 * MIB);
    let s = bfc.stats().unwrap();
    assert_eq!((s.bytes_in_use, s.peak_bytes_reserved), (0, 66 * MIB as u64));
}

#[test]
fn release_cached_from_two_threads_while_blocks_live() {
    let bfc = BfcAllocator::builder().memory_limit(1 << 30).build().unwrap();
    std::thread::scope(|s| {
        for t in 0..2u8 {
            let bfc = &bfc;
            s.spawn(move || {
                let mut live = Vec::new();
                for i in 0..2000usize {
                    let n = 1 + (i * 7919 + usize::from(t) * 31) % (3 * MIB);
                    let p = alloc(bfc, n);
                    // SAFETY: `p` holds `n` bytes.
                    unsafe { p.as_ptr().add(n - 1).write(t) };
                    live.push((p, n));
                    if live.len() > 40 {
                        let (p, n) = live.swap_remove(i % live.len());
                        // SAFETY: only this thread wrote it.
                        assert_eq!(unsafe { p.as_ptr().add(n - 1).read() }, t);
                        free(bfc, p, n);
                    }
                    if i % 50 == 0 {
                        bfc.release_cached();
                    }
                }
                for (p, n) in live {
                    // SAFETY: only this thread wrote it; it survived every release.
                    assert_eq!(unsafe { p.as_ptr().add(n - 1).read() }, t);
                    free(bfc, p, n);
                }
            });
        }
    });
    bfc.check_invariants().unwrap();
    bfc.release_cached();
    assert_eq!(reserved(&bfc), 0);
}

/// The default headroom moves pages while other threads write and read their live blocks: every
/// page of every live block keeps what its thread wrote, whatever moved around it.
#[cfg(target_os = "linux")]
#[test]
fn pages_moving_under_the_default_headroom_never_touch_live_blocks_of_other_threads() {
    let memory = Counting::with(true, true);
    // A limit well above what the threads can hold at once (3 x 3 blocks of at most 129 MiB and
    // the splits between them): only address space.
    let bfc = BfcAllocator::builder()
        .memory_limit(4 << 30)
        .sub_allocator(Arc::new(CountingSub(memory.clone())))
        .build()
        .unwrap();
    assert!(bfc.peak_headroom().is_some());
    // Writes `tag` in the first byte of every page of a block (and its last byte); checks it.
    let fill = |p: NonNull<u8>, n: usize, tag: u8| {
        for at in (0..n).step_by(4096).chain([n - 1]) {
            // SAFETY: `p` holds `n` bytes, owned by the calling thread.
            unsafe { p.as_ptr().add(at).write(tag) };
        }
    };
    let check = |p: NonNull<u8>, n: usize, tag: u8| {
        for at in (0..n).step_by(4096).chain([n - 1]) {
            // SAFETY: as above; written by `fill` with `tag`.
            assert_eq!(unsafe { p.as_ptr().add(at).read() }, tag, "byte {at} of a {n}-byte block");
        }
    };
    std::thread::scope(|s| {
        for t in 0..3u8 {
            let (bfc, fill, check) = (&bfc, &fill, &check);
            s.spawn(move || {
                // Large blocks (64-128 MiB) that come and go between longer-lived ones, so
                // that free chunks are trapped and the region would grow.
                let mut live: Vec<(NonNull<u8>, usize, u8)> = Vec::new();
                let mut x = 0x9E37_79B9_u32.wrapping_mul(u32::from(t) + 1);
                for i in 0..60usize {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    let n = (64 + (x as usize % 65)) * MIB + (x as usize % 4096);
                    let p = alloc(bfc, n);
                    let tag = t.wrapping_mul(60).wrapping_add(i as u8) | 1;
                    fill(p, n, tag);
                    live.push((p, n, tag));
                    if live.len() > 2 {
                        let (p, n, tag) = live.remove(x as usize % live.len());
                        check(p, n, tag);
                        free(bfc, p, n);
                    }
                }
                for (p, n, tag) in live {
                    check(p, n, tag);
                    free(bfc, p, n);
                }
            });
        }
    });
    bfc.check_invariants().unwrap();
    // 84-115 moves in three runs.
    assert!(memory.moves.load(SeqCst) > 0, "no page moved: the test did not test moves");
    assert_eq!(memory.committed.load(SeqCst), reserved(&bfc), "committed bytes = what the stats call reserved");
    bfc.release_cached();
    assert_eq!((reserved(&bfc), memory.committed.load(SeqCst)), (0, 0));
}

#[test]
fn a_commit_the_system_refuses_is_an_oom_naming_the_request_and_the_state_stays_intact() {
    let (memory, bfc) = counting_bfc(1 << 30, true);
    let a = alloc(&bfc, MIB);
    memory.refuse.store(true, SeqCst);
    let err = bfc.allocate::<u8>(8 * MIB).unwrap_err();
    assert_eq!(err.kind(), AllocErrorKind::OutOfMemory);
    let text = err.to_string();
    assert!(text.contains("could not allocate 8.0 MiB (8388608 bytes") && text.contains("out of memory"), "{text}");
    assert!(text.contains("1.0 MiB in use of a 1.0 GiB limit, 2.0 MiB reserved; largest free block 1.0 MiB"), "{text}");
    // What fits in committed memory still works; the state is intact.
    let b = alloc(&bfc, 512 * KIB);
    bfc.check_invariants().unwrap();
    memory.refuse.store(false, SeqCst);
    let c = alloc(&bfc, 8 * MIB);
    for (p, n) in [(a, MIB), (b, 512 * KIB), (c, 8 * MIB)] {
        free(&bfc, p, n);
    }
    assert_eq!(bfc.stats().unwrap().num_ooms, 1);
    assert_eq!(memory.committed.load(SeqCst), reserved(&bfc));
}

#[test]
fn a_limit_below_one_granule() {
    // Asked for explicitly: an error naming the granule.
    let err = BfcAllocator::builder().memory_limit(1000).expandable(true).build().unwrap_err();
    assert_eq!(err, BuildError::LimitTooSmall { allocator: "bfc".into(), limit: 1000, minimum: 4096 });
    // Left to the default: TensorFlow's regions, which can hold 768 bytes of chunks.
    let bfc = BfcAllocator::builder().memory_limit(1000).build().unwrap();
    assert!(!bfc.is_expandable());
    let p = alloc(&bfc, 700);
    let s = bfc.stats().unwrap();
    assert_eq!(s.bytes_limit, Some(1000), "the limit is reported as configured");
    let err = bfc.allocate::<u8>(300).unwrap_err();
    assert!(err.to_string().contains("of a 1000 B limit"), "{err}");
    free(&bfc, p, 700);
    // A sub-allocator without expandable memory, asked to expand.
    let err = BfcAllocator::builder()
        .memory_limit(1 << 20)
        .sub_allocator(Arc::new(NoExpand))
        .expandable(true)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("invalid expandable: its sub-allocator NoExpand cannot reserve"), "{err}");
    let err = BfcAllocator::builder().memory_limit(1 << 20).growth_granule(0).build().unwrap_err();
    assert!(err.to_string().contains("invalid growth_granule"), "{err}");
}

#[derive(Debug)]
struct NoExpand;

// SAFETY: regions come from the OS sub-allocator.
unsafe impl SubAllocator for NoExpand {
    fn alloc_region(&self, min_bytes: usize, alignment: usize) -> Option<(NonNull<u8>, usize)> {
        OsSubAllocator.alloc_region(min_bytes, alignment)
    }
    unsafe fn free_region(&self, ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: forwarded with the caller's promise.
        unsafe { OsSubAllocator.free_region(ptr, bytes) }
    }
    fn max_alignment(&self) -> usize {
        4096
    }
}

#[test]
fn a_reservation_refused_under_rlimit_as_is_a_build_error_naming_the_size() {
    // setrlimit is process-wide: run the check in a child process of this test binary.
    if std::env::var_os("TENSORMEM_TEST_RLIMIT_CHILD").is_some() {
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "bfc_expandable::rlimit_child", "--nocapture", "--test-threads=1"])
        .env("TENSORMEM_TEST_RLIMIT_CHILD", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("RESERVE ERROR: allocator 'huge': could not reserve 1.0 TiB of address space (1099511627776 bytes) from os memory"), "{text}");
    assert!(text.contains("lower the memory limit, raise the address-space limit"), "{text}");
}

#[test]
fn rlimit_child() {
    if std::env::var_os("TENSORMEM_TEST_RLIMIT_CHILD").is_none() {
        return;
    }
    let limit = libc::rlimit { rlim_cur: 64 << 30, rlim_max: 64 << 30 };
    // SAFETY: setrlimit reads the struct we pass; it only lowers this child's address-space limit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) }, 0);
    let err = BfcAllocator::builder().name("huge").memory_limit(1 << 40).build().unwrap_err();
    println!("RESERVE ERROR: {err}");
    assert!(matches!(err, BuildError::Reserve { bytes, .. } if bytes == 1 << 40));
    // A limit that fits is fine in the same process.
    let bfc = BfcAllocator::builder().memory_limit(1 << 30).build().unwrap();
    let p = alloc(&bfc, MIB);
    free(&bfc, p, MIB);
}

#[test]
fn over_aligned_requests_that_fit_are_served() {
    for expandable in [true, false] {
        // A 1 MiB, page-aligned request on a fresh 1 MiB allocator.
        let bfc = BfcAllocator::builder().memory_limit(MIB as u64).expandable(expandable).build().unwrap();
        let page = Layout::from_size_align(MIB, 4096).unwrap();
        let p = bfc.allocate_raw(page, &AllocationAttributes::default()).unwrap();
        assert_eq!(p.as_ptr() as usize % 4096, 0);
        // SAFETY: freed once with its layout.
        unsafe { bfc.deallocate_raw(p, page) };
        // 512 KiB page-aligned beside a free, page-aligned 512 KiB chunk.
        let first = alloc(&bfc, 512 * KIB);
        let half = Layout::from_size_align(512 * KIB, 4096).unwrap();
        let q = bfc.allocate_raw(half, &AllocationAttributes::default()).unwrap();
        assert_eq!(q.as_ptr() as usize, first.as_ptr() as usize + 512 * KIB);
        bfc.check_invariants().unwrap();
        // SAFETY: freed once with its layout.
        unsafe { bfc.deallocate_raw(q, half) };
        free(&bfc, first, 512 * KIB);
    }
}

#[test]
fn a_double_free_of_a_block_merged_into_a_free_neighbour_is_called_a_double_free() {
    let bfc = BfcAllocator::builder().name("arena").memory_limit(1 << 30).build().unwrap();
    let a = alloc(&bfc, 4 * KIB);
    let b = alloc(&bfc, 4 * KIB);
    let c = alloc(&bfc, 4 * KIB);
    free(&bfc, a, 4 * KIB);
    free(&bfc, b, 4 * KIB); // merges into a's free chunk: no chunk starts at b any more
    let e = catch_unwind(AssertUnwindSafe(|| free(&bfc, b, 4 * KIB))).unwrap_err();
    let m = e.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(m.contains("BfcAllocator 'arena'") && m.contains("double free"), "{m}");
    bfc.check_invariants().unwrap();
    free(&bfc, c, 4 * KIB);
}

#[test]
fn split_policies_decide_the_waste() {
    // A 1 MiB hole at the start, then a 600 KiB request (large: first fit takes the hole).
    let hole = |policy: SplitPolicy| {
        let bfc = BfcAllocator::builder().memory_limit(1 << 30).split(policy).build().unwrap();
        let h = alloc(&bfc, MIB);
        let c = alloc(&bfc, KIB);
        free(&bfc, h, MIB);
        let p = alloc(&bfc, 600 * KIB);
        assert_eq!(p, h);
        let got = bfc.allocated_size(p).unwrap();
        for (q, n) in [(p, 600 * KIB), (c, KIB)] {
            free(&bfc, q, n);
        }
        got
    };
    assert_eq!(hole(SplitPolicy::default()), 600 * KIB, "the default splits off every whole chunk");
    assert_eq!(hole(SplitPolicy::PyTorch), 600 * KIB, "PyTorch splits a small request's block above 512 B");
    assert_eq!(hole(SplitPolicy::TensorFlow), MIB, "TensorFlow keeps a chunk under twice the request whole");
    assert_eq!(hole(SplitPolicy::Remainder(512 * KIB)), MIB, "424 KiB left is below the 512 KiB minimum");
}

#[test]
fn large_requests_take_the_lowest_address_that_fits_and_small_ones_the_smallest_hole() {
    let bfc = BfcAllocator::builder().memory_limit(1 << 30).build().unwrap();
    // Holes of 16 MiB (low) and 4 MiB (high), with live blocks between.
    let sizes = [16 * MIB, KIB, 4 * MIB, KIB];
    let p: Vec<_> = sizes.iter().map(|&n| alloc(&bfc, n)).collect();
    free(&bfc, p[0], 16 * MIB);
    free(&bfc, p[2], 4 * MIB);
    // 3 MiB is large: first fit takes the low 16 MiB hole (best fit would take the 4 MiB one).
    let big = alloc(&bfc, 3 * MIB);
    assert_eq!(big, p[0]);
    // 64 KiB is large too, and goes right after it.
    let mid = alloc(&bfc, 64 * KIB);
    assert_eq!(mid.as_ptr() as usize, p[0].as_ptr() as usize + 3 * MIB);
    // A small request takes a hole of the smallest size class, not the lowest address: of the
    // 12.9 MiB left of the low hole, the 4 MiB hole and the 2 MiB - 2 KiB left at the end of the
    // last growth step, the last.
    let small = alloc(&bfc, 10 * KIB);
    assert_eq!(small.as_ptr() as usize, p[3].as_ptr() as usize + KIB);
    // With first fit off (TensorFlow's best fit everywhere) the 3 MiB block takes the 4 MiB hole.
    let best = BfcAllocator::builder().memory_limit(1 << 30).first_fit_above(u64::MAX).build().unwrap();
    let q: Vec<_> = sizes.iter().map(|&n| alloc(&best, n)).collect();
    free(&best, q[0], 16 * MIB);
    free(&best, q[2], 4 * MIB);
    assert_eq!(alloc(&best, 3 * MIB), q[2]);
}
