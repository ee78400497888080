//! [`SubAllocator`]: where a caching allocator (BFC) takes its regions from, and the default
//! [`OsSubAllocator`], which maps them from the operating system.

use core::fmt;
use core::ptr::NonNull;

use crate::expandable::PAGE;
use crate::{ExpandableMemory, OsMemory};

/// A source of large regions for a caching allocator (TensorFlow's `SubAllocator`).
///
/// # Safety
/// A region returned by [`alloc_region`](Self::alloc_region) must be valid for reads and writes
/// of the returned number of bytes (at least the requested minimum), aligned as asked, and not
/// handed out again until [`free_region`](Self::free_region) is called with it.
pub unsafe trait SubAllocator: Send + Sync + fmt::Debug {
    /// A region of at least `min_bytes` aligned to `alignment`, and how many bytes it really
    /// has; `None` if the memory cannot be had.
    fn alloc_region(&self, min_bytes: usize, alignment: usize) -> Option<(NonNull<u8>, usize)>;

    /// Gives a region back.
    ///
    /// # Safety
    /// `ptr` and `bytes` must be a region returned by `alloc_region` on this sub-allocator (the
    /// pointer and the size it reported) that has not been freed yet, and nothing may use its
    /// memory afterwards.
    unsafe fn free_region(&self, ptr: NonNull<u8>, bytes: usize);

    /// Whether two regions that happen to be adjacent in memory may be treated as one (so a
    /// chunk may span them). False by default.
    fn supports_coalescing(&self) -> bool {
        false
    }

    /// The largest alignment `alloc_region` can honour.
    fn max_alignment(&self) -> usize;

    /// Where the regions live (a device's memory for a GPU sub-allocator); host by default.
    /// The BFC over it reports this as its own [`memory_space`](crate::Allocator::memory_space);
    /// the BFC never reads or writes the memory it manages.
    fn memory_space(&self) -> crate::MemorySpace {
        self.expandable().map_or(crate::MemorySpace::Host, |m| m.memory_space())
    }

    /// `(free, total)` bytes of the device behind a device sub-allocator, as its driver reports
    /// them now (`cuMemGetInfo`), for out-of-memory errors; `None` (the default) for host memory.
    fn device_memory_info(&self) -> Option<(u64, u64)> {
        None
    }

    /// The same memory as an [`ExpandableMemory`] (address space reserved once, committed on
    /// demand), if this source can do that; a [`BfcAllocator`](crate::BfcAllocator) then grows
    /// one region at its end instead of taking separate regions. `None` by default.
    fn expandable(&self) -> Option<&dyn ExpandableMemory> {
        None
    }
}

/// Regions mapped from the operating system (anonymous `mmap` on Unix), page-aligned; pages are
/// backed lazily by the kernel when first touched. Its [`expandable`](SubAllocator::expandable)
/// form is [`OsMemory`] (Unix).
#[derive(Debug, Default, Clone, Copy)]
pub struct OsSubAllocator;

impl OsSubAllocator {
    fn round_to_page(bytes: usize) -> Option<usize> {
        bytes.max(1).checked_add(PAGE - 1).map(|b| b & !(PAGE - 1))
    }
}

// SAFETY: regions come from `mmap` (or the system allocator elsewhere), are page-aligned (so any
// alignment up to `PAGE` holds), valid for the rounded-up size returned, and unmapped only in
// `free_region`.
unsafe impl SubAllocator for OsSubAllocator {
    fn alloc_region(&self, min_bytes: usize, alignment: usize) -> Option<(NonNull<u8>, usize)> {
        if alignment > PAGE || !alignment.is_power_of_two() {
            return None;
        }
        let bytes = Self::round_to_page(min_bytes)?;
        #[cfg(unix)]
        {
            // SAFETY: an anonymous private mapping with no address hint touches no existing
            // memory; the result is checked against MAP_FAILED.
            let p = unsafe {
                libc::mmap(
                    core::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return None;
            }
            NonNull::new(p.cast::<u8>()).map(|p| (p, bytes))
        }
        #[cfg(not(unix))]
        {
            let layout = core::alloc::Layout::from_size_align(bytes, PAGE).ok()?;
            // SAFETY: `layout` has a non-zero size.
            NonNull::new(unsafe { std::alloc::alloc(layout) }).map(|p| (p, bytes))
        }
    }

    unsafe fn free_region(&self, ptr: NonNull<u8>, bytes: usize) {
        #[cfg(unix)]
        {
            // SAFETY: the caller promises `ptr`/`bytes` is a live mapping from `alloc_region`
            // (whose size is already page-rounded) that nothing uses any more.
            unsafe { libc::munmap(ptr.as_ptr().cast(), bytes) };
        }
        #[cfg(not(unix))]
        {
            // SAFETY: as above; `alloc_region` allocated it with this page-aligned layout.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), core::alloc::Layout::from_size_align_unchecked(bytes, PAGE)) };
        }
    }

    fn max_alignment(&self) -> usize {
        PAGE
    }

    fn expandable(&self) -> Option<&dyn ExpandableMemory> {
        static OS: OsMemory = OsMemory;
        cfg!(unix).then_some(&OS as &dyn ExpandableMemory)
    }
}
