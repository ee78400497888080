//! [`ExpandableMemory`]: address space reserved once and backed on demand, so that a caching
//! allocator can grow one region at its end and give memory back without unmapping it
//! (PyTorch's expandable segments), and the operating system's implementation of it.

use core::fmt;
use core::ptr::NonNull;
use std::io;

/// A source of memory that separates *reserving* address space from *committing* memory to it:
/// what PyTorch's `expandable_segments` build on (`cuMemAddressReserve` + `cuMemCreate` +
/// `cuMemMap` on a GPU, `mmap(PROT_NONE)` + `mprotect` on a host).
///
/// A [`BfcAllocator`](crate::BfcAllocator) reserves its whole limit once, commits at the end of
/// the committed part as it grows (so every new piece is adjacent to the last one and chunks
/// coalesce across growth steps), and decommits free pieces at the end to give memory back while
/// keeping the reservation.
///
/// All sizes and offsets are multiples of [`granule`](Self::granule).
///
/// # Safety
/// Implementors promise that a range that [`commit`](Self::commit) accepted is valid for reads
/// and writes (on the device the memory belongs to) until it is decommitted or released, that a
/// reservation is never handed out twice while it lives, and that `reserve` returns an address
/// aligned to the granule.
pub unsafe trait ExpandableMemory: Send + Sync + fmt::Debug {
    /// The unit of reservation and commitment (the page size on a host; the allocation
    /// granularity, usually 2 MiB, on a GPU).
    fn granule(&self) -> usize;

    /// Reserves `bytes` (a multiple of the granule) of address space with no memory behind it.
    ///
    /// # Errors
    /// The system's refusal, e.g. an address-space limit (`RLIMIT_AS`).
    fn reserve(&self, bytes: usize) -> io::Result<NonNull<u8>>;

    /// Backs `bytes` at `ptr` with memory.
    ///
    /// # Errors
    /// The system's refusal (out of memory); nothing is committed then.
    ///
    /// # Safety
    /// `ptr..ptr + bytes` must lie inside a live reservation of this memory, granule-aligned, and
    /// not be committed already.
    unsafe fn commit(&self, ptr: NonNull<u8>, bytes: usize) -> io::Result<()>;

    /// Gives the memory behind `bytes` at `ptr` back; the addresses stay reserved.
    ///
    /// # Safety
    /// The range must be committed, granule-aligned, nothing may use its memory afterwards, and,
    /// unless [`decommits_partially`](Self::decommits_partially), it must be exactly a range
    /// that one call of [`commit`](Self::commit) committed.
    unsafe fn decommit(&self, ptr: NonNull<u8>, bytes: usize);

    /// Releases a whole reservation (decommitting whatever is still committed in it).
    ///
    /// # Safety
    /// `ptr` and `bytes` must be a reservation returned by [`reserve`](Self::reserve) that was
    /// not released yet; nothing may use its memory afterwards.
    unsafe fn release(&self, ptr: NonNull<u8>, bytes: usize);

    /// Whether [`decommit`](Self::decommit) may take any granule-aligned part of committed
    /// memory (true for host pages) or only whole ranges as committed (a GPU mapping can only be
    /// unmapped whole).
    fn decommits_partially(&self) -> bool {
        true
    }

    /// A short name for messages (`os`, `cuda:0`).
    fn name(&self) -> &str;

    /// Where the memory lives (a device's memory for a GPU backend); host by default.
    fn memory_space(&self) -> crate::MemorySpace {
        crate::MemorySpace::Host
    }
}

/// The host page size assumed for alignment guarantees.
pub(crate) const PAGE: usize = 4096;

/// Host memory from the operating system: `mmap(PROT_NONE, MAP_NORESERVE)` reserves,
/// `mprotect(PROT_READ | PROT_WRITE)` commits, `madvise(MADV_DONTNEED)` plus `PROT_NONE`
/// decommits, `munmap` releases. Page granularity. Unix only; elsewhere `reserve` fails and
/// a BFC falls back to regions.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsMemory;

// SAFETY: on Unix, `reserve` maps a fresh anonymous `PROT_NONE` range (page-aligned, never handed
// out twice by the kernel while mapped); `commit` makes pages of it readable and writable, so
// they are valid memory (zero-filled on first touch) until `decommit` drops them or `release`
// unmaps the range. Elsewhere nothing is ever reserved.
unsafe impl ExpandableMemory for OsMemory {
    fn granule(&self) -> usize {
        PAGE
    }

    fn reserve(&self, bytes: usize) -> io::Result<NonNull<u8>> {
        #[cfg(unix)]
        {
            // SAFETY: an anonymous private mapping with no address hint touches no existing
            // memory; the result is checked against MAP_FAILED.
            let p = unsafe {
                libc::mmap(
                    core::ptr::null_mut(),
                    bytes,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))
        }
        #[cfg(not(unix))]
        {
            let _ = bytes;
            Err(io::Error::new(io::ErrorKind::Unsupported, "address-space reservation needs a Unix system"))
        }
    }

    unsafe fn commit(&self, ptr: NonNull<u8>, bytes: usize) -> io::Result<()> {
        #[cfg(unix)]
        {
            // SAFETY: the caller promises the range lies in a live reservation of ours, so
            // changing its protection affects no other mapping.
            let r = unsafe { libc::mprotect(ptr.as_ptr().cast(), bytes, libc::PROT_READ | libc::PROT_WRITE) };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        }
        #[cfg(not(unix))]
        {
            let _ = (ptr, bytes);
            Err(io::Error::new(io::ErrorKind::Unsupported, "no reservations here"))
        }
    }

    unsafe fn decommit(&self, ptr: NonNull<u8>, bytes: usize) {
        #[cfg(unix)]
        // SAFETY: the caller promises the range is committed memory of ours that nobody uses:
        // dropping its pages and making it inaccessible again affects nothing else.
        unsafe {
            libc::madvise(ptr.as_ptr().cast(), bytes, libc::MADV_DONTNEED);
            libc::mprotect(ptr.as_ptr().cast(), bytes, libc::PROT_NONE);
        }
        #[cfg(not(unix))]
        let _ = (ptr, bytes);
    }

    unsafe fn release(&self, ptr: NonNull<u8>, bytes: usize) {
        #[cfg(unix)]
        // SAFETY: the caller promises this is a live reservation of ours that nobody uses.
        unsafe {
            libc::munmap(ptr.as_ptr().cast(), bytes);
        }
        #[cfg(not(unix))]
        let _ = (ptr, bytes);
    }

    fn name(&self) -> &str {
        "os"
    }
}
