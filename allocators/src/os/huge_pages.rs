//! [`HugePageMemory`] and [`HugePageSubAllocator`]: host memory from the operating system in
//! 2 MiB granules that Linux may back with transparent huge pages, for the large tensors of the
//! default allocation path.

use core::ptr::NonNull;
use std::io;

use crate::expandable::{self, PAGE};
use crate::{ExpandableMemory, OsMemory, SubAllocator};

/// The size of a huge page on x86-64 and of the usual one on AArch64 (2 MiB): the granule of
/// [`HugePageMemory`] and the alignment of its reservations.
pub const HUGE_PAGE: usize = 2 << 20;

/// [`OsMemory`] in 2 MiB granules, reserved at 2 MiB-aligned addresses, that asks Linux for
/// transparent huge pages (`madvise(MADV_HUGEPAGE)`), so that a committed range is backed by
/// 2 MiB pages when the kernel has them to give.
///
/// Streaming through a 16 MiB tensor then takes 8 TLB entries instead of 4096, so memory-bound
/// passes over large tensors run faster (`docs/huge-pages.md`). numpy asks for huge pages for every
/// array of 4 MiB or more; PyTorch does when `THP_MEM_ALLOC_ENABLE=1`. Fresh memory faults in
/// 2 MiB at a time: the first touch of a byte makes the whole huge page resident, so
/// [`resident`](ExpandableMemory::resident) counts in huge pages where the kernel gave them.
///
/// The kernel decides: with `/sys/kernel/mm/transparent_hugepage/enabled` at `madvise` (the
/// usual default) or `always` it gives them; at `never`, or without the feature, the memory has
/// 4 KiB pages and behaves as [`OsMemory`]'s. Where free memory is fragmented, a first touch
/// may wait while the kernel compacts some (`transparent_hugepage/defrag`), or get 4 KiB pages.
/// Off Linux it is [`OsMemory`] with a 2 MiB granule.
///
/// ```
/// use tensormem_allocators::{ExpandableMemory, HUGE_PAGE, HugePageMemory};
///
/// let m = HugePageMemory;
/// assert_eq!(m.granule(), HUGE_PAGE);
/// # #[cfg(unix)] {
/// let base = m.reserve(4 * HUGE_PAGE)?;
/// assert_eq!(base.as_ptr() as usize % HUGE_PAGE, 0);
/// // SAFETY: the first granule of the reservation just made, not committed yet.
/// unsafe { m.commit(base, HUGE_PAGE)? };
/// // SAFETY: committed above; nothing else uses it.
/// unsafe { base.as_ptr().write_bytes(1, HUGE_PAGE) };
/// // SAFETY: the whole reservation, which nothing uses any more.
/// unsafe { m.release(base, 4 * HUGE_PAGE) };
/// # }
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct HugePageMemory;

// SAFETY: as `OsMemory`, whose functions do the work: `reserve` maps a fresh anonymous
// `PROT_NONE` range and trims it to an address aligned to the granule; `madvise(MADV_HUGEPAGE)`
// changes how the kernel backs a range, never its contents or access, so every guarantee of
// `OsMemory` about committed, moved and decommitted ranges holds unchanged.
unsafe impl ExpandableMemory for HugePageMemory {
    fn granule(&self) -> usize {
        HUGE_PAGE
    }

    fn reserve(&self, bytes: usize) -> io::Result<NonNull<u8>> {
        expandable::reserve_aligned(bytes, HUGE_PAGE, true)
    }

    unsafe fn commit(&self, ptr: NonNull<u8>, bytes: usize) -> io::Result<()> {
        // SAFETY: the caller keeps the contract, and a range of our reservation is one of
        // `OsMemory`'s kind (`mprotect` keeps the range's huge-page flag).
        unsafe { OsMemory.commit(ptr, bytes) }
    }

    unsafe fn decommit(&self, ptr: NonNull<u8>, bytes: usize) {
        #[cfg(unix)]
        // SAFETY: the caller promises the range is committed memory of ours that nobody uses.
        unsafe {
            expandable::reserve_again(ptr, bytes, true)
        };
        #[cfg(not(unix))]
        let _ = (ptr, bytes);
    }

    unsafe fn release(&self, ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: the caller promises a live reservation of ours that nobody uses.
        unsafe { OsMemory.release(ptr, bytes) }
    }

    fn relocates(&self) -> bool {
        OsMemory.relocates()
    }

    unsafe fn relocate(&self, from: NonNull<u8>, to: NonNull<u8>, bytes: usize) -> io::Result<()> {
        // SAFETY: the caller keeps `relocate`'s contract, which is `move_pages`'.
        unsafe { expandable::move_pages(from, to, bytes, true) }
    }

    fn resident(&self, ptr: NonNull<u8>, bytes: usize) -> Option<usize> {
        OsMemory.resident(ptr, bytes)
    }

    fn name(&self) -> &str {
        "os-huge-pages"
    }
}

/// [`OsSubAllocator`](crate::OsSubAllocator)'s counterpart over [`HugePageMemory`]: regions
/// mapped from the operating system at 2 MiB-aligned addresses, in 2 MiB multiples, asking for
/// transparent huge pages; its [`expandable`](SubAllocator::expandable) form is
/// [`HugePageMemory`]. A [`PoolAllocator`](crate::PoolAllocator)'s default large allocator is
/// a BFC over it ([`PoolBuilder::huge_pages`](crate::PoolBuilder::huge_pages)). Off Unix its
/// regions are 2 MiB-aligned blocks of the global allocator and it is not expandable.
///
/// ```
/// use std::sync::Arc;
/// use tensormem_allocators::{Allocator, AllocatorExt, BfcAllocator, HugePageSubAllocator};
///
/// let bfc = BfcAllocator::builder()
///     .sub_allocator(Arc::new(HugePageSubAllocator))
///     .memory_limit(64 << 20)
///     .expandable(cfg!(unix))
///     .build()?;
/// let p = bfc.allocate::<f32>(4 << 20)?; // 16 MiB
/// // SAFETY: `p` came from `allocate::<f32>(4 << 20)` on `bfc`.
/// unsafe { bfc.deallocate(p, 4 << 20) };
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct HugePageSubAllocator;

// SAFETY: a region is a fresh reservation of `HugePageMemory` (2 MiB-aligned, so any alignment
// up to 2 MiB holds), committed whole before it is returned, so it is valid for reads and
// writes of the rounded size returned until `free_region` unmaps it; the kernel never hands a
// mapping out twice. Off Unix a region is a live block of the global allocator with that
// alignment and size, freed with the same layout.
unsafe impl SubAllocator for HugePageSubAllocator {
    fn alloc_region(&self, min_bytes: usize, alignment: usize) -> Option<(NonNull<u8>, usize)> {
        if alignment > HUGE_PAGE || !alignment.is_power_of_two() {
            return None;
        }
        let bytes = min_bytes.max(1).checked_next_multiple_of(HUGE_PAGE)?;
        #[cfg(unix)]
        {
            let base = HugePageMemory.reserve(bytes).ok()?;
            // SAFETY: the whole of the reservation just made, granule-aligned, not committed yet.
            if unsafe { HugePageMemory.commit(base, bytes) }.is_err() {
                // SAFETY: the reservation just made, which nothing uses.
                unsafe { HugePageMemory.release(base, bytes) };
                return None;
            }
            Some((base, bytes))
        }
        #[cfg(not(unix))]
        {
            // No address-space reservation here: 2 MiB-aligned blocks of the system allocator.
            let layout = core::alloc::Layout::from_size_align(bytes, HUGE_PAGE).ok()?;
            // SAFETY: `layout` has a non-zero size.
            NonNull::new(unsafe { std::alloc::alloc(layout) }).map(|p| (p, bytes))
        }
    }

    unsafe fn free_region(&self, ptr: NonNull<u8>, bytes: usize) {
        #[cfg(unix)]
        // SAFETY: the caller promises a live region of ours, which is one whole reservation.
        unsafe {
            HugePageMemory.release(ptr, bytes)
        };
        #[cfg(not(unix))]
        // SAFETY: the caller promises a live region of ours, which `alloc_region` allocated
        // with this layout (its size already a multiple of 2 MiB).
        unsafe {
            std::alloc::dealloc(ptr.as_ptr(), core::alloc::Layout::from_size_align_unchecked(bytes, HUGE_PAGE))
        };
    }

    fn max_alignment(&self) -> usize {
        HUGE_PAGE
    }

    fn expandable(&self) -> Option<&dyn ExpandableMemory> {
        static HUGE: HugePageMemory = HugePageMemory;
        cfg!(unix).then_some(&HUGE as &dyn ExpandableMemory)
    }
}

/// Whether `PAGE` divides [`HUGE_PAGE`], which the aligned reservations rely on.
const _: () = assert!(HUGE_PAGE.is_multiple_of(PAGE));
