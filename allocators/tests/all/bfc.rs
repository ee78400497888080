//! BfcAllocator: TensorFlow's algorithm, its figures, and bad inputs.

use std::alloc::Layout;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::Arc;

use parking_lot::Mutex;
use tensormem_allocators::{
    AllocErrorKind, AllocationAttributes, Allocator, AllocatorExt, BfcAllocator, BfcBuilder, BuildError, MemoryDump,
    SubAllocator,
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

/// TensorFlow's allocator exactly: regions, its split rule, best fit for every size.
fn tf() -> BfcBuilder {
    BfcAllocator::builder().tensorflow_policies()
}

fn dump(bfc: &BfcAllocator) -> MemoryDump {
    bfc.check_invariants().unwrap();
    bfc.memory_dump()
}

#[test]
fn requests_round_to_256_and_split_as_tensorflow_does() {
    let bfc = tf().memory_limit(MIB as u64).build().unwrap();
    let a = alloc(&bfc, 1);
    let b = alloc(&bfc, 257);
    assert_eq!((bfc.allocated_size(a), bfc.requested_size(a), bfc.allocation_id(a)), (Some(256), Some(1), Some(1)));
    assert_eq!((bfc.allocated_size(b), bfc.requested_size(b), bfc.allocation_id(b)), (Some(512), Some(257), Some(2)));
    // Lowest addresses first, one after the other in the single region.
    assert_eq!(b.as_ptr() as usize - a.as_ptr() as usize, 256);
    let d = dump(&bfc);
    assert_eq!(d.regions.len(), 1);
    assert_eq!(d.regions[0].size, MIB);
    let sizes: Vec<(usize, bool)> = d.chunks.iter().map(|c| (c.size, c.in_use)).collect();
    assert_eq!(sizes, vec![(256, true), (512, true), (MIB - 768, false)]);
    assert_eq!(d.chunks[2].bin, Some(11), "a free chunk of 1 MiB - 768 B waits in bin 11");
    let s = bfc.stats().unwrap();
    assert_eq!((s.bytes_in_use, s.peak_bytes_in_use, s.largest_alloc_size, s.num_allocs), (768, 768, 257, 2));
    assert_eq!((s.bytes_reserved, s.largest_free_block_bytes), (MIB as u64, Some((MIB - 768) as u64)));
    assert_eq!(s.fragmentation, Some(0.0));
    free(&bfc, a, 1);
    free(&bfc, b, 257);
    let d = dump(&bfc);
    assert_eq!(d.chunks.len(), 1, "everything merged back into one chunk");
    assert_eq!(d.stats.bytes_in_use, 0);
}

#[test]
fn a_chunk_is_not_split_when_the_waste_is_small() {
    let bfc = tf().memory_limit(MIB as u64).build().unwrap();
    // Carve a free 1 KiB hole between two live chunks, then ask for 600 bytes (rounded 768):
    // 1024 < 2 * 768, so the whole 1 KiB chunk is handed out.
    let a = alloc(&bfc, KIB);
    let hole = alloc(&bfc, KIB);
    let c = alloc(&bfc, KIB);
    free(&bfc, hole, KIB);
    let p = alloc(&bfc, 600);
    assert_eq!(p, hole, "the smallest fit is the hole");
    assert_eq!(bfc.allocated_size(p), Some(KIB));
    // With a tiny max_internal_fragmentation the same request splits.
    let strict = tf().memory_limit(MIB as u64).max_internal_fragmentation_bytes(1).build().unwrap();
    let x = alloc(&strict, 600);
    assert_eq!(strict.allocated_size(x), Some(768));
    for (q, n) in [(a, KIB), (p, 600), (c, KIB)] {
        free(&bfc, q, n);
    }
    free(&strict, x, 600);
}

#[test]
fn smallest_fit_then_lowest_address() {
    let bfc = tf().memory_limit(MIB as u64).build().unwrap();
    // Holes of 2 KiB, 1 KiB, 1 KiB (in address order), separated by live chunks.
    let sizes = [2 * KIB, 256, KIB, 256, KIB, 256];
    let ptrs: Vec<_> = sizes.iter().map(|&s| alloc(&bfc, s)).collect();
    for i in [0, 2, 4] {
        free(&bfc, ptrs[i], sizes[i]);
    }
    assert_eq!(alloc(&bfc, KIB), ptrs[2], "the first of the two 1 KiB holes");
    assert_eq!(alloc(&bfc, KIB), ptrs[4], "then the second");
    assert_eq!(alloc(&bfc, KIB), ptrs[0], "then the 2 KiB hole");
    bfc.check_invariants().unwrap();
}

#[test]
fn freeing_merges_with_both_neighbours() {
    let bfc = tf().memory_limit(MIB as u64).build().unwrap();
    let p: Vec<_> = (0..4).map(|_| alloc(&bfc, KIB)).collect();
    free(&bfc, p[0], KIB);
    free(&bfc, p[2], KIB);
    assert_eq!(dump(&bfc).chunks.len(), 5);
    free(&bfc, p[1], KIB); // merges with p[0] before and p[2] after
    let d = dump(&bfc);
    let layout: Vec<(usize, bool)> = d.chunks.iter().map(|c| (c.size, c.in_use)).collect();
    assert_eq!(layout, vec![(3 * KIB, false), (KIB, true), (MIB - 4 * KIB, false)]);
    free(&bfc, p[3], KIB);
    assert_eq!(dump(&bfc).chunks.len(), 1);
}

#[test]
fn growth_takes_2_mib_then_doubles_and_without_growth_takes_the_whole_limit() {
    let grow = tf().memory_limit(64 * MIB as u64).allow_growth(true).build().unwrap();
    let a = alloc(&grow, MIB);
    assert_eq!(dump(&grow).regions.iter().map(|r| r.size).collect::<Vec<_>>(), vec![2 * MIB]);
    let b = alloc(&grow, 2 * MIB);
    let c = alloc(&grow, 3 * MIB);
    let mut sizes: Vec<usize> = dump(&grow).regions.iter().map(|r| r.size).collect();
    sizes.sort();
    assert_eq!(sizes, vec![2 * MIB, 4 * MIB, 8 * MIB]);
    assert_eq!(grow.stats().unwrap().bytes_reserved, 14 * MIB as u64);
    for (p, n) in [(a, MIB), (b, 2 * MIB), (c, 3 * MIB)] {
        free(&grow, p, n);
    }
    assert_eq!(grow.stats().unwrap().peak_bytes_reserved, 14 * MIB as u64);

    let whole = tf().memory_limit(8 * MIB as u64).build().unwrap();
    assert_eq!(whole.stats().unwrap().bytes_reserved, 0, "nothing is taken before the first allocation");
    let x = alloc(&whole, 100);
    assert_eq!(whole.stats().unwrap().bytes_reserved, 8 * MIB as u64);
    free(&whole, x, 100);
}

#[test]
fn garbage_collection_returns_unused_regions_and_retries() {
    let bfc = tf().memory_limit(6 * MIB as u64).allow_growth(true).garbage_collection(true).build().unwrap();
    let a = alloc(&bfc, 2 * MIB); // region 1: 2 MiB
    let b = alloc(&bfc, 3 * MIB); // region 2: 4 MiB (no room left under the limit)
    free(&bfc, a, 2 * MIB);
    // 4 MiB fits nowhere: region 1 is free but too small, the limit is used up. Garbage
    // collection returns region 1 and takes a 4 MiB... no: 2 MiB are left under the limit.
    let err = bfc.allocate::<u8>(3 * MIB).unwrap_err();
    assert_eq!(err.kind(), AllocErrorKind::OutOfMemory);
    assert_eq!(bfc.stats().unwrap().bytes_reserved, 4 * MIB as u64, "the unused region went back");
    let c = alloc(&bfc, 2 * MIB); // fits in a new 2 MiB region now
    free(&bfc, b, 3 * MIB);
    free(&bfc, c, 2 * MIB);
    assert_eq!(bfc.release_unused_regions(), 2);
    assert_eq!(bfc.stats().unwrap().bytes_reserved, 0);
    bfc.check_invariants().unwrap();
}

#[test]
fn over_aligned_requests_split_off_the_misaligned_start() {
    let bfc = tf().memory_limit(MIB as u64).build().unwrap();
    let first = alloc(&bfc, 256);
    for align in [512usize, 1024, 4096] {
        let layout = Layout::from_size_align(300, align).unwrap();
        let p = bfc.allocate_raw(layout, &AllocationAttributes::default()).unwrap();
        assert_eq!(p.as_ptr() as usize % align, 0);
        assert_eq!(bfc.allocated_size(p), Some(512));
        bfc.check_invariants().unwrap();
        // SAFETY: freed once with its layout.
        unsafe { bfc.deallocate_raw(p, layout) };
    }
    free(&bfc, first, 256);
    assert_eq!(dump(&bfc).chunks.len(), 1);
    let err =
        bfc.allocate_raw(Layout::from_size_align(64, 8192).unwrap(), &AllocationAttributes::default()).unwrap_err();
    assert_eq!(err.kind(), AllocErrorKind::UnsupportedLayout);
    assert_eq!(err.max_alignment(), Some(4096));
    assert!(
        err.to_string().contains("align 8192): unsupported layout: this allocator aligns to at most 4096 bytes"),
        "{err}"
    );
}

#[test]
fn bad_limits_are_construction_errors() {
    assert_eq!(
        BfcAllocator::builder().build().unwrap_err(),
        BuildError::MissingOption { allocator: "bfc".into(), option: "memory_limit" }
    );
    assert_eq!(
        BfcAllocator::builder().memory_limit(0).build().unwrap_err(),
        BuildError::ZeroLimit { allocator: "bfc".into() }
    );
    let small = BfcAllocator::builder().memory_limit(255).build().unwrap_err();
    assert_eq!(small, BuildError::LimitTooSmall { allocator: "bfc".into(), limit: 255, minimum: 256 });
    assert_eq!(small.to_string(), "allocator 'bfc': a memory limit of 255 bytes is smaller than one chunk (256 bytes)");
    assert!(BfcAllocator::builder().memory_limit(256).build().is_ok());
}

#[test]
fn a_request_larger_than_the_limit_is_refused_with_the_numbers() {
    let bfc = tf().name("arena").memory_limit(4 * MIB as u64).build().unwrap();
    let p = alloc(&bfc, MIB);
    let err = bfc.allocate::<u8>(5 * MIB - 100).unwrap_err();
    assert_eq!(err.kind(), AllocErrorKind::LimitExceeded);
    assert_eq!(
        err.to_string(),
        "allocator 'arena' could not allocate 5.0 MiB (5242780 bytes, align 1), rounded to 5.0 MiB: limit exceeded: \
         1.0 MiB in use of a 4.0 MiB limit, 4.0 MiB reserved; largest free block 3.0 MiB"
    );
    let err = bfc.allocate::<u8>(3 * MIB + 1).unwrap_err();
    assert_eq!(err.kind(), AllocErrorKind::OutOfMemory);
    assert_eq!((err.rounded_size(), err.largest_free_block()), (Some(3 * MIB as u64 + 256), Some(3 * MIB as u64)));
    assert_eq!(bfc.stats().unwrap().num_ooms, 2);
    free(&bfc, p, MIB);
}

#[test]
fn foreign_and_double_frees_panic_with_the_address_and_corrupt_nothing() {
    let bfc = tf().name("arena").memory_limit(MIB as u64).build().unwrap();
    let a = alloc(&bfc, 1000);
    let b = alloc(&bfc, 1000);
    free(&bfc, a, 1000);
    let message = |f: &dyn Fn()| -> String {
        let e = catch_unwind(AssertUnwindSafe(f)).unwrap_err();
        e.downcast_ref::<String>().cloned().unwrap_or_default()
    };
    let m = message(&|| free(&bfc, a, 1000));
    assert!(m.contains("BfcAllocator 'arena'") && m.contains(&format!("{a:p}")) && m.contains("double free"), "{m}");
    let inside = NonNull::new(b.as_ptr().wrapping_add(8)).unwrap();
    let m = message(&|| free(&bfc, inside, 1000));
    assert!(m.contains(&format!("{inside:p}")) && m.contains("no chunk of this allocator starts"), "{m}");
    let outside = Box::new(0u64);
    let stranger = NonNull::from(&*outside).cast::<u8>();
    let m = message(&|| free(&bfc, stranger, 8));
    assert!(m.contains("no chunk of this allocator starts"), "{m}");
    // Nothing was corrupted: the allocator's state is intact and keeps working.
    bfc.check_invariants().unwrap();
    assert_eq!(bfc.stats().unwrap().bytes_in_use, 1024);
    let c = alloc(&bfc, 1000);
    assert_eq!(c, a);
    free(&bfc, b, 1000);
    free(&bfc, c, 1000);
    assert_eq!(dump(&bfc).chunks.len(), 1);
}

#[test]
fn the_memory_dump_is_complete_and_serialisable() {
    let bfc = tf().name("dumped").memory_limit(MIB as u64).build().unwrap();
    let a = alloc(&bfc, 300);
    let b = alloc(&bfc, 70 * KIB);
    let d = dump(&bfc);
    assert_eq!(d.allocator, "dumped");
    assert_eq!(d.bins.len(), 21);
    assert_eq!((d.bins[1].chunks_in_use, d.bins[1].bytes_in_use), (1, 512));
    assert_eq!((d.bins[8].chunks_in_use, d.bins[8].bytes_in_use), (1, 70 * 1024));
    assert_eq!(d.bins.iter().map(|b| b.bytes_in_bin).sum::<u64>(), MIB as u64);
    assert_eq!(d.chunks[0].allocation_id, Some(1));
    assert_eq!(d.chunks[1].requested_size, 70 * KIB);
    assert_eq!(d.occupancy.len(), 1);
    // 70.5 KiB of 1 MiB in 16 KiB cells: four full cells and one shared with free space.
    assert!(d.occupancy[0].ends_with(&format!("|####+{}|", ".".repeat(59))), "{}", d.occupancy[0]);
    let text = d.render();
    assert!(text.contains("allocator 'dumped': 70.5 KiB in use of 1.0 MiB reserved"), "{text}");
    let json = serde_json::to_string(&d).unwrap();
    assert_eq!(serde_json::from_str::<MemoryDump>(&json).unwrap(), d);
    free(&bfc, a, 300);
    free(&bfc, b, 70 * KIB);
}

#[test]
fn the_dump_is_written_on_oom_when_asked() {
    let path = std::env::temp_dir().join(format!("tensormem-bfc-dump-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let bfc = tf().memory_limit(MIB as u64).dump_on_oom(Some(path.clone())).build().unwrap();
    let p = alloc(&bfc, 600 * KIB);
    assert!(bfc.allocate::<u8>(600 * KIB).is_err());
    let d: MemoryDump = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    // 600 KiB took the whole 1 MiB chunk: 1 MiB < 2 x 600 KiB, so it was not split.
    assert_eq!(d.stats.bytes_in_use, MIB as u64);
    assert_eq!(d.stats.num_ooms, 1);
    assert_eq!(d.chunks.iter().filter(|c| c.in_use).count(), 1);
    std::fs::remove_file(&path).unwrap();
    free(&bfc, p, 600 * KIB);
}

/// Hands out consecutive slices of one big buffer, so that regions are adjacent.
#[derive(Debug)]
struct Adjacent {
    base: usize,
    len: usize,
    next: Mutex<usize>,
    _buffer: Vec<u64>,
}

// SAFETY: slices of a buffer this value owns, 256-byte aligned, each handed out once.
unsafe impl SubAllocator for Adjacent {
    fn alloc_region(&self, min_bytes: usize, _alignment: usize) -> Option<(NonNull<u8>, usize)> {
        let mut next = self.next.lock();
        if *next + min_bytes > self.len {
            return None;
        }
        let p = NonNull::new((self.base + *next) as *mut u8)?;
        *next += min_bytes;
        Some((p, min_bytes))
    }
    unsafe fn free_region(&self, _ptr: NonNull<u8>, _bytes: usize) {}
    fn supports_coalescing(&self) -> bool {
        true
    }
    fn max_alignment(&self) -> usize {
        256
    }
}

#[test]
fn adjacent_regions_coalesce_when_the_sub_allocator_allows_it() {
    let buffer = vec![0u64; (16 * MIB + 256) / 8];
    let base = (buffer.as_ptr() as usize).next_multiple_of(256);
    let sub = Arc::new(Adjacent { base, len: 16 * MIB, next: Mutex::new(0), _buffer: buffer });
    let bfc =
        BfcAllocator::builder().memory_limit(16 * MIB as u64).allow_growth(true).sub_allocator(sub).build().unwrap();
    let a = alloc(&bfc, MIB);
    let b = alloc(&bfc, 3 * MIB); // needs a second region, adjacent to the first
    let d = dump(&bfc);
    assert_eq!(d.regions.len(), 1, "adjacent regions were not merged: {:?}", d.regions);
    assert_eq!(d.regions[0].size, 2 * MIB + 4 * MIB);
    // The free tail of the first region merged with the new region's start: b sits right after a.
    assert_eq!(b.as_ptr() as usize, a.as_ptr() as usize + MIB);
    free(&bfc, a, MIB);
    free(&bfc, b, 3 * MIB);
    assert_eq!(dump(&bfc).chunks.len(), 1);
}

#[test]
fn two_threads_keep_the_bfc_consistent() {
    let bfc = BfcAllocator::builder().memory_limit(64 * MIB as u64).allow_growth(true).build().unwrap();
    std::thread::scope(|s| {
        for t in 0..2usize {
            let bfc = &bfc;
            s.spawn(move || {
                let mut live = Vec::new();
                for i in 0..20_000usize {
                    let n = 1 + (i * 7919 + t * 31) % 20_000;
                    let p = alloc(bfc, n);
                    // SAFETY: `p` holds `n` bytes; stamp the first and last.
                    unsafe {
                        p.as_ptr().write(t as u8);
                        p.as_ptr().add(n - 1).write(t as u8);
                    }
                    live.push((p, n));
                    if live.len() > 50 {
                        let (p, n) = live.swap_remove(i % live.len());
                        // SAFETY: only this thread wrote it.
                        assert_eq!(unsafe { p.as_ptr().add(n - 1).read() }, t as u8);
                        free(bfc, p, n);
                    }
                }
                for (p, n) in live {
                    free(bfc, p, n);
                }
            });
        }
    });
    let s = bfc.stats().unwrap();
    assert_eq!((s.num_allocs, s.num_frees, s.bytes_in_use), (40_000, 40_000, 0));
    bfc.check_invariants().unwrap();
    assert!(dump(&bfc).chunks.iter().all(|c| !c.in_use));
}
