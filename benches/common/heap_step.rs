//! The malloc-heavy step that `benches/global_allocator.rs` and
//! `tools/global_alloc_interleaved.rs` time: 256 allocations of sizes
//! `base + (i * 37) % spread`, then their frees in another order.

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;

/// One step on `a`.
pub fn step(a: &impl GlobalAlloc, base: usize, spread: usize) {
    let mut ptrs = [(core::ptr::null_mut::<u8>(), Layout::new::<u8>()); 256];
    for (i, slot) in ptrs.iter_mut().enumerate() {
        let layout = Layout::from_size_align(base + (i * 37 * (spread / 2000).max(1)) % spread, 8).unwrap();
        // SAFETY: non-zero size.
        let p = unsafe { a.alloc(layout) };
        assert!(!p.is_null());
        *slot = (p, layout);
    }
    for i in (0..256).map(|i| (i * 97) % 256) {
        let (p, layout) = ptrs[i];
        // SAFETY: allocated above with `layout`, freed once.
        unsafe { a.dealloc(black_box(p), layout) };
    }
}
