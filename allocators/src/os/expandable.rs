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
/// Implementors promise that a range that [`commit`](Self::commit) accepted, or that
/// [`relocate`](Self::relocate) moved memory to, is valid for reads and writes (on the device
/// the memory belongs to) until it is decommitted, moved away or released, that a
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
    /// memory (true for host pages, and for GPU memory mapped in units:
    /// [`UnitMemory`](crate::UnitMemory)) or only whole ranges as committed (memory that maps
    /// each commit as one mapping, which can only be unmapped whole).
    fn decommits_partially(&self) -> bool {
        true
    }

    /// Whether [`relocate`](Self::relocate) can move committed memory to other addresses of
    /// the reservation (false by default).
    fn relocates(&self) -> bool {
        false
    }

    /// Moves the memory committed at `from` to the uncommitted range at `to` without copying
    /// it or giving it back: afterwards `to..to + bytes` is committed, holding what
    /// `from..from + bytes` held, and `from..from + bytes` is decommitted (reserved, with
    /// nothing behind it). A caching allocator uses it to take memory left free between live
    /// blocks to where a block needs it, instead of committing more and keeping both (on a
    /// host, the pages keep their physical frames: nothing is faulted in again).
    ///
    /// # Errors
    /// `Unsupported` unless [`relocates`](Self::relocates); otherwise the system's refusal, with
    /// both ranges as they were.
    ///
    /// # Safety
    /// Both ranges must lie inside one live reservation of this memory, be granule-aligned and
    /// not overlap; `from` must be committed and unused (nothing may use its memory
    /// afterwards), `to` not committed.
    unsafe fn relocate(&self, from: NonNull<u8>, to: NonNull<u8>, bytes: usize) -> io::Result<()> {
        let _ = (from, to, bytes);
        Err(io::Error::new(io::ErrorKind::Unsupported, "this memory cannot move committed pages"))
    }

    /// How many of the `bytes` at `ptr` have memory behind them now (on a host: pages that were
    /// touched since they were committed and are resident), if this memory can tell; `None`
    /// (the default) if it cannot (host memory: off Linux, or for a range that is not
    /// page-aligned or not mapped).
    ///
    /// A caching allocator asks before it [relocates](Self::relocate) free memory: moving pages
    /// that were never touched saves no page faults, while the move costs system calls (giving
    /// them back and committing fresh ones costs fewer). Where this answers `None`, it moves.
    fn resident(&self, ptr: NonNull<u8>, bytes: usize) -> Option<usize> {
        let _ = (ptr, bytes);
        None
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
/// `mprotect(PROT_READ | PROT_WRITE)` commits, a fresh `PROT_NONE` mapping over the range
/// (`mmap(MAP_FIXED)`) decommits, `munmap` releases, and on Linux `mremap(MREMAP_DONTUNMAP)` relocates pages
/// (their page-table entries move; the frames stay). Page granularity. Unix only; elsewhere `reserve` fails and
/// a BFC falls back to regions.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsMemory;

// SAFETY: on Unix, `reserve` maps a fresh anonymous `PROT_NONE` range (page-aligned, never handed
// out twice by the kernel while mapped); `commit` makes pages of it readable and writable, so
// they are valid memory (zero-filled on first touch) until `decommit` drops them or `release`
// unmaps the range. On Linux `relocate` moves committed pages over a `PROT_NONE` part of the same
// reservation (`mremap(MREMAP_FIXED | MREMAP_DONTUNMAP)`, which replaces only that part), so the
// destination is valid memory holding the same bytes, and leaves the source mapped, empty and
// `PROT_NONE` again, as decommitted. Elsewhere nothing is ever reserved.
unsafe impl ExpandableMemory for OsMemory {
    fn granule(&self) -> usize {
        PAGE
    }

    fn reserve(&self, bytes: usize) -> io::Result<NonNull<u8>> {
        reserve_aligned(bytes, PAGE, false)
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
            reserve_again(ptr, bytes, false)
        };
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

    fn relocates(&self) -> bool {
        cfg!(target_os = "linux")
    }

    unsafe fn relocate(&self, from: NonNull<u8>, to: NonNull<u8>, bytes: usize) -> io::Result<()> {
        // SAFETY: the caller keeps `relocate`'s contract, which is `move_pages`'.
        unsafe { move_pages(from, to, bytes, false) }
    }

    /// Counts resident pages with `mincore` (Linux; `None` elsewhere, and for a range that is
    /// not page-aligned or not mapped).
    fn resident(&self, ptr: NonNull<u8>, bytes: usize) -> Option<usize> {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: `sysconf` reads a constant of the system.
            let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok().filter(|&p| p > 0)?;
            // One byte per page, up to 4096 pages a call.
            let mut pages = [0u8; 4096];
            let (mut at, end) = (ptr.as_ptr() as usize, (ptr.as_ptr() as usize).checked_add(bytes)?);
            if !at.is_multiple_of(page) {
                return None;
            }
            let mut resident = 0;
            while at < end {
                let len = (end - at).min(pages.len() * page);
                // SAFETY: `mincore` reads only page tables and writes one byte per page of
                // `at..at + len` into `pages`: `len.div_ceil(page)` bytes, at most its length.
                // It dereferences nothing at `at`; an address that is not mapped is an error
                // (ENOMEM), and `at` is page-aligned as it asks.
                if unsafe { libc::mincore(at as *mut libc::c_void, len, pages.as_mut_ptr()) } != 0 {
                    return None;
                }
                let touched: usize = pages[..len.div_ceil(page)].iter().map(|&b| usize::from(b & 1)).sum();
                resident += touched * page;
                at += len;
            }
            Some(resident.min(bytes))
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (ptr, bytes);
            None
        }
    }

    fn name(&self) -> &str {
        "os"
    }
}

/// Turns `bytes` at `ptr`, part of a reservation of ours that nobody uses, back into reserved
/// address space with nothing behind it: a fresh `PROT_NONE` mapping put over it in one call
/// (`MAP_FIXED` replaces only our own range), which drops its pages. A fresh mapping, rather than
/// `madvise` + `mprotect` on the old one, because pages moved by `mremap` keep their mapping's
/// page offset: ranges they visited could then never merge with their neighbours again, and
/// every move would leave the process more mappings, up to the system's limit (`vm.max_map_count`,
/// 65530), where commits start failing. If the mapping is refused (that limit: the kernel checks
/// it before it takes the old mapping out), the old way.
///
/// With `huge`, the fresh mapping asks for huge pages again ([`advise_huge`]), as the rest of
/// its reservation does: a mapping without the flag would neither merge with its neighbours nor
/// get huge pages when committed again.
///
/// # Safety
/// The range must lie inside a live reservation of ours, page-aligned, and nothing may use its
/// memory.
#[cfg(unix)]
pub(crate) unsafe fn reserve_again(ptr: NonNull<u8>, bytes: usize, huge: bool) {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED;
    // SAFETY: the caller promises the range is ours and unused; `MAP_FIXED` replaces exactly it.
    let p = unsafe { libc::mmap(ptr.as_ptr().cast(), bytes, libc::PROT_NONE, flags, -1, 0) };
    if p != libc::MAP_FAILED {
        if huge {
            advise_huge(ptr, bytes);
        }
    } else {
        // SAFETY: as above; dropping the pages and the access touches nothing else.
        unsafe {
            libc::madvise(ptr.as_ptr().cast(), bytes, libc::MADV_DONTNEED);
            libc::mprotect(ptr.as_ptr().cast(), bytes, libc::PROT_NONE);
        }
    }
}

/// Reserves `bytes` of address space (`mmap(PROT_NONE, MAP_NORESERVE)`) at an address aligned
/// to `align` (a power of two, at least [`PAGE`]): `align - PAGE` bytes more are mapped
/// and the parts before and after the aligned range unmapped again. With `huge`, the range asks
/// for transparent huge pages ([`advise_huge`]). Unix only.
pub(crate) fn reserve_aligned(bytes: usize, align: usize, huge: bool) -> io::Result<NonNull<u8>> {
    #[cfg(unix)]
    {
        let extra = align.saturating_sub(PAGE);
        let total = bytes.checked_add(extra).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("reserving {bytes} bytes aligned to {align} overflows"))
        })?;
        // SAFETY: an anonymous private mapping with no address hint touches no existing
        // memory; the result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                total,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // From the mapping's start to the next multiple of `align` (a power of two).
        let lead = (p as usize).wrapping_neg() & (align - 1);
        let trail = extra - lead;
        // SAFETY: both ranges are the ends of the mapping just made, outside the aligned range
        // that is returned, and nothing uses them; `munmap` of a part of a mapping leaves the
        // rest mapped.
        unsafe {
            if lead > 0 {
                libc::munmap(p, lead);
            }
            if trail > 0 {
                libc::munmap(p.cast::<u8>().add(lead + bytes).cast(), trail);
            }
        }
        let start =
            NonNull::new(p.cast::<u8>().wrapping_add(lead)).ok_or_else(|| io::Error::other("mmap returned null"))?;
        if huge {
            advise_huge(start, bytes);
        }
        Ok(start)
    }
    #[cfg(not(unix))]
    {
        let _ = (bytes, align, huge);
        Err(io::Error::new(io::ErrorKind::Unsupported, "address-space reservation needs a Unix system"))
    }
}

/// Asks Linux to back `bytes` at `ptr` (a range of our own mappings) with transparent huge pages
/// where whole 2 MiB of it are mapped alike (`madvise(MADV_HUGEPAGE)`; the flag stays with the
/// range through `mprotect` and `mremap`). A hint: a kernel without them (or set to `never`)
/// refuses it or ignores it, and the range keeps 4 KiB pages. Nothing elsewhere.
#[cfg(unix)]
pub(crate) fn advise_huge(ptr: NonNull<u8>, bytes: usize) {
    #[cfg(target_os = "linux")]
    // SAFETY: `madvise(MADV_HUGEPAGE)` changes only how the kernel backs the range, never its
    // contents or its access; the callers pass a range of their own mappings.
    unsafe {
        libc::madvise(ptr.as_ptr().cast(), bytes, libc::MADV_HUGEPAGE);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, bytes);
}

/// Moves the pages committed at `from` to `to` ([`ExpandableMemory::relocate`]) by
/// `mremap(MREMAP_FIXED | MREMAP_DONTUNMAP)`, then reserves `from` again (with huge pages asked
/// for again where `huge`). Linux only; `Unsupported` elsewhere.
///
/// # Safety
/// [`ExpandableMemory::relocate`]'s contract, for a reservation of ours.
pub(crate) unsafe fn move_pages(from: NonNull<u8>, to: NonNull<u8>, bytes: usize, huge: bool) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        let flags = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP;
        // SAFETY: the caller promises both ranges lie in one live reservation of ours and do
        // not overlap, `from` committed and unused, `to` not committed: moving `from`'s
        // pages over `to` (which replaces only our own `PROT_NONE` mapping there) and
        // leaving `from` mapped but empty touches no other mapping and no memory in use.
        let p = unsafe { libc::mremap(from.as_ptr().cast(), bytes, bytes, flags, to.as_ptr().cast::<libc::c_void>()) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `from` is our own range, now without pages and unused.
        unsafe { reserve_again(from, bytes, huge) };
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (from, to, bytes, huge);
        Err(io::Error::new(io::ErrorKind::Unsupported, "moving pages needs Linux's mremap"))
    }
}
