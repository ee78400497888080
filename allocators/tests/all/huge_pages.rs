//! `HugePageMemory`, `HugePageSubAllocator` and the pool's `huge_pages` option: 2 MiB-aligned
//! reservations in 2 MiB granules, and, where Linux has transparent huge pages, memory the
//! kernel really backs with them (read from `/proc/self/smaps`), also after the range was
//! decommitted and committed again or its pages moved.
//!
//! The kernel's part is checked only where `/sys/kernel/mm/transparent_hugepage/enabled` says
//! `madvise` or `always`; elsewhere those tests say why they check less.

use std::ptr::NonNull;
use std::sync::Arc;

use tensormem_allocators::{
    AllocationAttributes, Allocator, AllocatorExt, BfcAllocator, ExpandableMemory, HUGE_PAGE, HugePageMemory,
    HugePageSubAllocator, PoolAllocator, SubAllocator, SystemAllocator,
};

const MIB: usize = 1 << 20;

/// The kernel's transparent-huge-page mode (`always`, `madvise`, `never`), if it has them.
fn thp_mode() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(text[start..end].to_owned())
}

/// Whether the kernel gives huge pages to ranges that ask (`madvise` or `always`); says why not
/// when it does not.
fn kernel_gives_huge_pages(test: &str) -> bool {
    match thp_mode().as_deref() {
        Some("madvise" | "always") => true,
        mode => {
            eprintln!("{test}: transparent huge pages are {mode:?} here; the kernel's backing is not checked");
            false
        }
    }
}

/// Bytes of `AnonHugePages` in the mappings of this process that overlap `start..start + len`.
fn huge_bytes(start: NonNull<u8>, len: usize) -> u64 {
    let (lo, hi) = (start.as_ptr() as usize, start.as_ptr() as usize + len);
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
    let mut overlaps = false;
    let mut total = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-')
            && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
        {
            overlaps = a < hi && lo < b;
        } else if overlaps && let Some(kb) = line.strip_prefix("AnonHugePages:") {
            total += kb.trim().trim_end_matches("kB").trim().parse::<u64>().expect("a size in kB") * 1024;
        }
    }
    total
}

/// Writes every byte of the range with `value`.
///
/// # Safety
/// The range must be committed memory nobody else uses.
unsafe fn fill(ptr: NonNull<u8>, len: usize, value: u8) {
    // SAFETY: the caller's promise.
    unsafe { ptr.as_ptr().write_bytes(value, len) };
}

#[test]
fn reservations_are_aligned_to_the_huge_page_and_committed_ranges_get_huge_pages() {
    let m = HugePageMemory;
    assert_eq!(m.granule(), HUGE_PAGE);
    assert_eq!(HUGE_PAGE, 2 * MIB);
    if !cfg!(unix) {
        assert!(m.reserve(4 * HUGE_PAGE).is_err(), "no reservations off Unix");
        return;
    }
    // Several reservations in a row: each lands 2 MiB-aligned wherever the kernel put the map.
    let reservations: Vec<_> = (1..=6).map(|n| (m.reserve(n * HUGE_PAGE).unwrap(), n * HUGE_PAGE)).collect();
    for &(base, _) in &reservations {
        assert_eq!(base.as_ptr() as usize % HUGE_PAGE, 0, "{base:?}");
    }
    let (base, len) = reservations[5];
    // SAFETY: the first 8 MiB of a live reservation of 12 MiB, not committed.
    unsafe { m.commit(base, 8 * MIB) }.unwrap();
    assert_eq!(m.resident(base, len), Some(0), "committed, not touched");
    // SAFETY: committed above, used by nothing else.
    unsafe { fill(base, 8 * MIB, 7) };
    assert_eq!(m.resident(base, len), Some(8 * MIB));
    if kernel_gives_huge_pages("reservations_are_aligned") {
        assert!(
            huge_bytes(base, 8 * MIB) >= HUGE_PAGE as u64,
            "8 MiB written, {} B in huge pages",
            huge_bytes(base, len)
        );
    }
    for (base, len) in reservations {
        // SAFETY: live reservations of `m` that nothing uses any more.
        unsafe { m.release(base, len) };
    }
}

#[test]
fn ranges_decommitted_or_moved_get_huge_pages_again_and_keep_their_bytes() {
    let m = HugePageMemory;
    if !cfg!(target_os = "linux") {
        return;
    }
    let len = 32 * MIB;
    let base = m.reserve(len).unwrap();
    let at = |off: usize| NonNull::new(base.as_ptr().wrapping_add(off)).unwrap();
    // SAFETY: the first 16 MiB of the live reservation, not committed yet.
    unsafe { m.commit(base, 16 * MIB) }.unwrap();
    // SAFETY: committed above, used by nothing else.
    unsafe { fill(base, 16 * MIB, 1) };

    // Give the second half back and commit it again: the fresh mapping asks for huge pages too.
    // SAFETY: committed, granule-aligned, unused.
    unsafe { m.decommit(at(8 * MIB), 8 * MIB) };
    assert_eq!(m.resident(at(8 * MIB), 8 * MIB), Some(0), "decommitted");
    assert_eq!(m.resident(base, 8 * MIB), Some(8 * MIB), "the first half stays");
    // SAFETY: reserved and not committed now.
    unsafe { m.commit(at(8 * MIB), 8 * MIB) }.unwrap();
    // SAFETY: committed again, unused.
    unsafe { fill(at(8 * MIB), 8 * MIB, 2) };

    // Move the first 8 MiB to 16..24 MiB: the bytes go with the pages, the source is empty.
    assert!(m.relocates());
    // SAFETY: both ranges in the reservation, granule-aligned, apart; the source committed and
    // unused, the destination not committed.
    unsafe { m.relocate(base, at(16 * MIB), 8 * MIB) }.unwrap();
    assert_eq!(m.resident(base, 8 * MIB), Some(0), "the source is decommitted");
    // SAFETY: the destination is committed now and holds the source's bytes.
    let moved = unsafe { std::slice::from_raw_parts(at(16 * MIB).as_ptr(), 8 * MIB) };
    assert!(moved.iter().all(|&b| b == 1), "the bytes moved with the pages");
    // SAFETY: the source, reserved again and not committed.
    unsafe { m.commit(base, 8 * MIB) }.unwrap();
    // SAFETY: committed, unused.
    unsafe { fill(base, 8 * MIB, 3) };

    if kernel_gives_huge_pages("ranges_decommitted_or_moved") {
        for (name, off) in [("recommitted after decommit", 8), ("moved", 16), ("recommitted after a move", 0)] {
            let huge = huge_bytes(at(off * MIB), 8 * MIB);
            assert!(huge >= HUGE_PAGE as u64, "{name} (at {off} MiB): {huge} B in huge pages");
        }
    }
    // SAFETY: the live reservation, which nothing uses any more.
    unsafe { m.release(base, len) };
}

#[test]
fn the_sub_allocator_maps_aligned_regions_of_whole_huge_pages() {
    let sub = HugePageSubAllocator;
    assert_eq!(sub.max_alignment(), HUGE_PAGE);
    assert!(sub.alloc_region(MIB, 2 * HUGE_PAGE).is_none(), "an alignment above 2 MiB is refused");
    assert!(sub.alloc_region(MIB, 3).is_none(), "an alignment that is not a power of two is refused");
    assert!(sub.alloc_region(usize::MAX, 64).is_none(), "a size that cannot be rounded up is refused");
    if !cfg!(unix) {
        assert!(sub.expandable().is_none());
        return;
    }
    assert_eq!(sub.expandable().map(|e| e.granule()), Some(HUGE_PAGE));
    let (p, bytes) = sub.alloc_region(5 * MIB + 1, 4096).unwrap();
    assert_eq!((p.as_ptr() as usize % HUGE_PAGE, bytes), (0, 6 * MIB), "rounded up to whole huge pages");
    // SAFETY: the region is valid for `bytes` bytes and used by nothing else.
    unsafe { fill(p, bytes, 9) };
    if kernel_gives_huge_pages("the_sub_allocator") {
        assert!(huge_bytes(p, bytes) >= HUGE_PAGE as u64, "{} B in huge pages", huge_bytes(p, bytes));
    }
    // SAFETY: the region just allocated, which nothing uses any more.
    unsafe { sub.free_region(p, bytes) };
}

#[test]
fn a_bfc_over_the_sub_allocator_grows_in_huge_pages() {
    let bfc = BfcAllocator::builder()
        .sub_allocator(Arc::new(HugePageSubAllocator))
        .memory_limit(256 << 20)
        .expandable(cfg!(unix))
        .build()
        .unwrap();
    let layout = std::alloc::Layout::from_size_align(16 * MIB, HUGE_PAGE).unwrap();
    let p = bfc.allocate_raw(layout, &AllocationAttributes::DEFAULT).unwrap();
    assert_eq!(p.as_ptr() as usize % HUGE_PAGE, 0, "2 MiB alignment is served");
    if cfg!(unix) {
        let dump = bfc.memory_dump();
        assert_eq!(dump.expandable.map(|e| e.granule), Some(HUGE_PAGE as u64));
    }
    // SAFETY: a live 16 MiB block, used by nothing else.
    unsafe { fill(p, 16 * MIB, 5) };
    if cfg!(unix) && kernel_gives_huge_pages("a_bfc_over_the_sub_allocator") {
        assert!(huge_bytes(p, 16 * MIB) >= 4 * HUGE_PAGE as u64, "{} B in huge pages", huge_bytes(p, 16 * MIB));
    }
    // SAFETY: allocated above with `layout`.
    unsafe { bfc.deallocate_raw(p, layout) };
}

/// A large block of `pool` (16 MiB, written), its bytes in huge pages, and the granule of the
/// pool's large allocator.
fn large_block(pool: &PoolAllocator) -> (u64, u64) {
    let layout = std::alloc::Layout::from_size_align(16 * MIB, 64).unwrap();
    let p = pool.allocate_raw(layout, &AllocationAttributes::DEFAULT).unwrap();
    // SAFETY: a live 16 MiB block, used by nothing else.
    unsafe { fill(p, 16 * MIB, 4) };
    let huge = huge_bytes(p, 16 * MIB);
    // SAFETY: allocated above with `layout`.
    unsafe { pool.deallocate_raw(p, layout) };
    let (_, large) = pool.large_allocator().expect("a large allocator over unlimited host memory");
    let granule =
        large.backend_as::<BfcAllocator>().and_then(|b| b.memory_dump().expandable).map(|e| e.granule).unwrap();
    (huge, granule)
}

#[test]
fn the_default_pool_puts_large_blocks_in_huge_pages_and_huge_pages_false_keeps_4_kib_pages() {
    if !cfg!(unix) {
        return;
    }
    let system: Arc<dyn Allocator> = Arc::new(SystemAllocator::new());
    let default = PoolAllocator::builder(system.clone()).build().unwrap();
    let small = PoolAllocator::builder(system).huge_pages(false).build().unwrap();
    let (huge, granule) = large_block(&default);
    assert_eq!(granule, HUGE_PAGE as u64);
    let (huge_off, granule_off) = large_block(&small);
    assert_eq!(granule_off, 4096);
    if kernel_gives_huge_pages("the_default_pool") {
        assert!(huge >= 4 * HUGE_PAGE as u64, "default pool: {huge} B of 16 MiB in huge pages");
    }
    if thp_mode().as_deref() == Some("madvise") {
        assert_eq!(huge_off, 0, "huge_pages(false): nothing asks for huge pages");
    }
}
