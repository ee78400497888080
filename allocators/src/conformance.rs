//! [`allocator_conformance_tests!`](crate::allocator_conformance_tests): the contract every
//! [`Allocator`](crate::Allocator) must keep, as a set of `#[test]`s to run over any backend or
//! decorator.

/// Generates a module of `#[test]` functions checking the [`Allocator`](crate::Allocator)
/// contract on fresh allocators made by `$make` (an expression evaluated once per test, whose
/// value implements `Allocator`, e.g. `SystemAllocator::new()` or an `Arc<dyn Allocator>`).
///
/// The tests: alignments 1 to 4096 are honoured; memory is writable end to end and blocks never
/// overlap; zero-size requests count nothing; statistics return to zero bytes in use after all
/// frees with exact counts and peak >= in use at every step; `clear_stats` follows TensorFlow;
/// typed allocation overflow is an error; two threads allocating and freeing concurrently keep
/// the counts exact.
///
/// ```
/// tensormem_allocators::allocator_conformance_tests!(system, tensormem_allocators::SystemAllocator::new());
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! allocator_conformance_tests {
    ($name:ident, $make:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use ::core::alloc::Layout;
            use ::core::ptr::NonNull;
            use $crate::{AllocErrorKind, AllocationAttributes, Allocator, AllocatorExt, AllocatorStats};

            fn make() -> impl Allocator {
                $make
            }

            fn stats(a: &impl Allocator) -> Option<AllocatorStats> {
                let s = a.stats()?;
                assert!(
                    s.peak_bytes_in_use >= s.bytes_in_use,
                    "{}: peak {} below in use {}",
                    a.name(),
                    s.peak_bytes_in_use,
                    s.bytes_in_use
                );
                Some(s)
            }

            fn fill_and_check(p: NonNull<u8>, len: usize, byte: u8) {
                // SAFETY: the allocator returned `p` valid for `len` bytes.
                unsafe { p.as_ptr().write_bytes(byte, len) };
                // SAFETY: as above; the bytes were just written.
                let s = unsafe { ::core::slice::from_raw_parts(p.as_ptr(), len) };
                assert!(s.iter().all(|&b| b == byte), "memory did not keep what was written");
            }

            #[test]
            fn alignments_1_to_4096_are_honoured_and_memory_is_writable() {
                let a = make();
                let attrs = AllocationAttributes::default();
                for shift in 0..=12 {
                    let align = 1usize << shift;
                    for size in [1usize, 7, 64, 1000, 4099, 1 << 20] {
                        let layout = Layout::from_size_align(size, align).unwrap();
                        let p = a.allocate_raw(layout, &attrs).unwrap();
                        assert_eq!(p.as_ptr() as usize % align, 0, "{}: {layout:?} misaligned", a.name());
                        fill_and_check(p, size, shift as u8 + 1);
                        // SAFETY: `p` was allocated just above with `layout`.
                        unsafe { a.deallocate_raw(p, layout) };
                    }
                }
                if let Some(s) = stats(&a) {
                    assert_eq!(s.bytes_in_use, 0);
                }
            }

            #[test]
            fn live_blocks_do_not_overlap() {
                let a = make();
                let attrs = AllocationAttributes::default();
                let blocks: Vec<(NonNull<u8>, Layout)> = (0..64usize)
                    .map(|i| {
                        let layout = Layout::from_size_align(1 + i * 37, 1 << (i % 8)).unwrap();
                        let p = a.allocate_raw(layout, &attrs).unwrap();
                        // SAFETY: `p` is valid for `layout.size()` bytes.
                        unsafe { p.as_ptr().write_bytes(i as u8, layout.size()) };
                        (p, layout)
                    })
                    .collect();
                for (i, (p, layout)) in blocks.iter().enumerate() {
                    // SAFETY: `p` is live and was filled above.
                    let s = unsafe { ::core::slice::from_raw_parts(p.as_ptr(), layout.size()) };
                    assert!(s.iter().all(|&b| b == i as u8), "block {i} was overwritten by another");
                }
                for (p, layout) in blocks {
                    // SAFETY: each block is freed once with its layout.
                    unsafe { a.deallocate_raw(p, layout) };
                }
            }

            #[test]
            fn zero_size_requests_count_nothing() {
                let a = make();
                let before = stats(&a);
                for align in [1usize, 8, 64, 4096] {
                    let layout = Layout::from_size_align(0, align).unwrap();
                    let p = a.allocate_raw(layout, &AllocationAttributes::default()).unwrap();
                    assert_eq!(p.as_ptr() as usize % align, 0);
                    // SAFETY: freeing a zero-size block is a no-op by contract.
                    unsafe { a.deallocate_raw(p, layout) };
                }
                let p = a.allocate::<u64>(0).unwrap();
                // SAFETY: as above.
                unsafe { a.deallocate(p, 0) };
                assert_eq!(stats(&a), before, "{}: zero-size requests changed the stats", a.name());
            }

            #[test]
            fn stats_are_exact_and_return_to_zero_in_use() {
                let a = make();
                let Some(before) = stats(&a) else { return };
                let sizes = [64usize, 4096, 100, 1 << 20, 3];
                let mut live = Vec::new();
                let mut expect_in_use = 0u64;
                let mut expect_peak = 0u64;
                for &size in &sizes {
                    let layout = Layout::from_size_align(size, 16).unwrap();
                    live.push((a.allocate_raw(layout, &AllocationAttributes::default()).unwrap(), layout));
                    let s = stats(&a).unwrap();
                    assert!(s.bytes_in_use >= expect_in_use + size as u64, "in use did not grow by the request");
                    expect_in_use = s.bytes_in_use;
                    expect_peak = expect_peak.max(expect_in_use);
                    assert!(s.peak_bytes_in_use >= expect_peak);
                    assert!(s.largest_alloc_size >= size as u64);
                }
                let s = stats(&a).unwrap();
                assert_eq!(s.num_allocs, before.num_allocs + sizes.len() as u64);
                assert_eq!(s.largest_alloc_size, (1 << 20).max(before.largest_alloc_size));
                for (p, layout) in live.drain(..) {
                    // SAFETY: each block is freed once with its layout.
                    unsafe { a.deallocate_raw(p, layout) };
                    stats(&a);
                }
                let s = stats(&a).unwrap();
                assert_eq!(s.bytes_in_use, 0, "{}: bytes still in use after every free", a.name());
                assert_eq!(s.num_frees, before.num_frees + sizes.len() as u64);
                assert_eq!(s.peak_bytes_in_use, expect_peak, "{}: peak is not the high point", a.name());
            }

            #[test]
            fn clear_stats_follows_tensorflow() {
                let a = make();
                let small = Layout::from_size_align(256, 8).unwrap();
                let big = Layout::from_size_align(8192, 8).unwrap();
                let p = a.allocate_raw(small, &AllocationAttributes::default()).unwrap();
                let q = a.allocate_raw(big, &AllocationAttributes::default()).unwrap();
                // SAFETY: `q` is freed once with its layout.
                unsafe { a.deallocate_raw(q, big) };
                if !a.clear_stats() {
                    assert!(a.stats().is_none(), "clear_stats() false but stats() answered");
                    // SAFETY: `p` is freed once with its layout.
                    unsafe { a.deallocate_raw(p, small) };
                    return;
                }
                let s = stats(&a).unwrap();
                assert_eq!(s.num_allocs, 0);
                assert_eq!(s.largest_alloc_size, 0);
                assert_eq!(s.peak_bytes_in_use, s.bytes_in_use);
                assert!(s.bytes_in_use >= 256);
                // SAFETY: `p` is freed once with its layout.
                unsafe { a.deallocate_raw(p, small) };
                let s = stats(&a).unwrap();
                assert_eq!(s.bytes_in_use, 0);
                assert_eq!(s.num_allocs, 0);
            }

            #[test]
            fn typed_allocation_overflow_is_an_error() {
                let a = make();
                let before = stats(&a);
                let err = a.allocate::<u64>(usize::MAX / 4).unwrap_err();
                assert_eq!(err.kind(), AllocErrorKind::SizeOverflow);
                assert!(err.layout().is_none());
                assert!(err.to_string().contains("overflows"), "{err}");
                assert_eq!(stats(&a), before);
            }

            #[test]
            fn two_threads_keep_counts_exact() {
                let a = make();
                let Some(before) = stats(&a) else { return };
                const ROUNDS: usize = 20_000;
                ::std::thread::scope(|s| {
                    for t in 0..2usize {
                        let a = &a;
                        s.spawn(move || {
                            let mut live: Vec<(NonNull<u8>, Layout)> = Vec::new();
                            for i in 0..ROUNDS {
                                let size = 1 + (i * 7919 + t * 104_729) % 9000;
                                let layout = Layout::from_size_align(size, 8).unwrap();
                                let p = a.allocate_raw(layout, &AllocationAttributes::default()).unwrap();
                                // SAFETY: `p` is valid for `size` bytes.
                                unsafe { p.as_ptr().write(i as u8) };
                                live.push((p, layout));
                                if i % 3 != 0 {
                                    let (p, layout) = live.swap_remove((i * 31) % live.len());
                                    // SAFETY: each block is freed once with its layout.
                                    unsafe { a.deallocate_raw(p, layout) };
                                }
                            }
                            for (p, layout) in live {
                                // SAFETY: each block is freed once with its layout.
                                unsafe { a.deallocate_raw(p, layout) };
                            }
                        });
                    }
                });
                let s = stats(&a).unwrap();
                assert_eq!(s.num_allocs, before.num_allocs + 2 * ROUNDS as u64);
                assert_eq!(s.num_frees, before.num_frees + 2 * ROUNDS as u64);
                assert_eq!(s.bytes_in_use, before.bytes_in_use);
                assert!(s.peak_bytes_in_use > 0);
            }
        }
    };
}
