//! [`GlobalAllocator`]: the process's Rust heap through tensormem, so that leak checks, scopes,
//! history, budgets and the heap metrics see `Vec`, `Box` and `String` allocations too.

use core::alloc::{GlobalAlloc, Layout};
use core::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::alloc::System;

use crate::allocators::AllocatorStats;
use crate::allocators::observe::{self, Layer};
use crate::telemetry::global_alloc::{count_alloc, count_free, global_stats};

/// The environment variable that picks [`GlobalAllocator`]'s backend at process start:
/// `system` (the default) or `jemalloc` (feature `jemalloc`). Another value is reported on
/// standard error and the system allocator is used.
pub const GLOBAL_ALLOCATOR_ENV: &str = "TENSORMEM_GLOBAL_ALLOCATOR";

/// The name the Rust heap's allocations carry in leak reports, histories and metrics.
pub const GLOBAL_ALLOCATOR_NAME: &str = "global";

/// Where [`GlobalAllocator`] takes memory from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GlobalBackend {
    /// The platform's allocator (`std::alloc::System`).
    System,
    /// jemalloc (feature `jemalloc`).
    Jemalloc,
}

const UNRESOLVED: u8 = 0;
const SYSTEM: u8 = 1;
const JEMALLOC: u8 = 2;

/// The backend, chosen at the first allocation of the process and never changed after (every
/// block must go back to the allocator that made it).
static BACKEND: AtomicU8 = AtomicU8::new(UNRESOLVED);

/// A `#[global_allocator]` that reports every Rust heap allocation to tensormem's hooks, with
/// its backend picked at process start from [`GLOBAL_ALLOCATOR_ENV`]:
///
/// ```
/// #[global_allocator]
/// static GLOBAL: tensormem::GlobalAllocator = tensormem::GlobalAllocator::new();
///
/// let check = tensormem::testing::LeakCheck::start();
/// let kept = Box::new([0u8; 1000]);
/// let report = check.finish();
/// assert!(report.leaks.iter().any(|l| l.requested_size == 1000 && l.allocator == "global"), "{report}");
/// drop(kept);
/// assert!(GLOBAL.stats().unwrap().num_allocs > 0);
/// ```
///
/// - A [`LeakCheck`](crate::testing::LeakCheck), [`assert_peak_below`](crate::testing::assert_peak_below),
///   [`scope`](crate::scope()) and [`history`](crate::history) see its allocations (allocator
///   `global`) per thread, exactly as they see a tensormem allocator's: parallel tests stay
///   apart.
/// - Its figures are the process heap's ([`stats`](Self::stats),
///   [`process_heap_stats`](crate::telemetry::process_heap_stats), allocator `global` in the
///   metrics; it replaces the deprecated `CountingGlobalAlloc`).
/// - With nothing watching, an allocation or free costs the backend's plus a few reads of
///   thread-local and global words and one update of the heap counters in a word the thread owns
///   (see `benches/global_allocator.rs` and `docs/global-allocator-cost.md`).
/// - It is re-entrancy safe: the observer's own allocations, and those of tensormem's
///   bookkeeping (scopes, leak checks, history, interned names), are not reported.
/// - A refusal of the backend returns null to Rust's allocation error handler (no OOM report:
///   building one would allocate from the heap that just failed).
#[derive(Debug, Default)]
pub struct GlobalAllocator {
    _private: (),
}

impl GlobalAllocator {
    /// The allocator; its backend is chosen at its first allocation.
    pub const fn new() -> Self {
        Self { _private: () }
    }

    /// The backend in use (choosing it now if nothing was allocated yet).
    pub fn backend(&self) -> GlobalBackend {
        match backend() {
            JEMALLOC => GlobalBackend::Jemalloc,
            _ => GlobalBackend::System,
        }
    }

    /// The process heap's figures (`None` before its first allocation). The same as
    /// [`process_heap_stats`](crate::telemetry::process_heap_stats).
    pub fn stats(&self) -> Option<AllocatorStats> {
        global_stats()
    }
}

#[inline(always)]
fn backend() -> u8 {
    match BACKEND.load(Relaxed) {
        UNRESOLVED => resolve(),
        b => b,
    }
}

/// Reads [`GLOBAL_ALLOCATOR_ENV`] without allocating (this runs inside the first allocation of
/// the process) and settles the backend; a racing thread reads the same environment, and the
/// first to settle wins.
#[cold]
#[inline(never)]
fn resolve() -> u8 {
    let mut value = [0u8; 32];
    let len = read_env(&mut value);
    let chosen = match value.get(..len).map(<[u8]>::trim_ascii) {
        None => {
            complain(b"(a value longer than 32 bytes)");
            SYSTEM
        }
        Some(v) if v.is_empty() || v.eq_ignore_ascii_case(b"system") => SYSTEM,
        Some(v) if v.eq_ignore_ascii_case(b"jemalloc") && JEMALLOC_BUILT => JEMALLOC,
        Some(v) => {
            complain(v);
            SYSTEM
        }
    };
    match BACKEND.compare_exchange(UNRESOLVED, chosen, Relaxed, Relaxed) {
        Ok(_) => chosen,
        Err(settled) => settled,
    }
}

const JEMALLOC_BUILT: bool = cfg!(all(feature = "jemalloc", not(target_env = "msvc")));

/// Copies the variable's value into `buf`; returns its length (0 when unset), or more than
/// `buf.len()` when it does not fit.
fn read_env(buf: &mut [u8]) -> usize {
    #[cfg(unix)]
    {
        // SAFETY: the name is a NUL-terminated literal; `getenv` returns null or a pointer to a
        // NUL-terminated string owned by the environment, read here before anything else in
        // this thread can change it (nothing else runs inside an allocation).
        let p = unsafe { libc::getenv(c"TENSORMEM_GLOBAL_ALLOCATOR".as_ptr()) };
        if p.is_null() {
            return 0;
        }
        // SAFETY: `p` is a valid NUL-terminated string (above).
        let bytes = unsafe { core::ffi::CStr::from_ptr(p) }.to_bytes();
        if bytes.len() > buf.len() {
            return buf.len() + 1;
        }
        buf[..bytes.len()].copy_from_slice(bytes);
        bytes.len()
    }
    #[cfg(not(unix))]
    {
        let _ = buf;
        0
    }
}

/// Says on standard error, without allocating, that `value` names no backend.
fn complain(value: &[u8]) {
    let mut msg = [0u8; 200];
    let mut n = 0;
    let known: &[u8] = if JEMALLOC_BUILT { b"system, jemalloc" } else { b"system (jemalloc: feature off)" };
    for part in [
        b"tensormem: TENSORMEM_GLOBAL_ALLOCATOR=".as_slice(),
        value,
        b": unknown backend (known: ",
        known,
        b"); using system\n",
    ] {
        let take = part.len().min(msg.len() - n);
        msg[n..n + take].copy_from_slice(&part[..take]);
        n += take;
    }
    #[cfg(unix)]
    // SAFETY: writes `n` initialised bytes of `msg` to standard error; a failed write is ignored.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), n);
    }
}

/// The backend's allocation.
///
/// # Safety
/// `GlobalAlloc::alloc`'s contract (`layout` of non-zero size).
#[inline(always)]
unsafe fn raw_alloc(layout: Layout, zeroed: bool) -> *mut u8 {
    #[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
    if backend() == JEMALLOC {
        let j = crate::allocators::JemallocGlobal;
        // SAFETY: forwarded with the caller's promise.
        return unsafe { if zeroed { j.alloc_zeroed(layout) } else { j.alloc(layout) } };
    }
    // Without jemalloc built in, the first allocation still settles the backend (to system).
    #[cfg(not(all(feature = "jemalloc", not(target_env = "msvc"))))]
    backend();
    // SAFETY: forwarded with the caller's promise.
    unsafe { if zeroed { System.alloc_zeroed(layout) } else { System.alloc(layout) } }
}

/// The backend's free.
///
/// # Safety
/// `ptr` was allocated by [`raw_alloc`] (or [`raw_realloc`]) with `layout`; the backend is the
/// one that made it, since it never changes once chosen.
#[inline(always)]
unsafe fn raw_dealloc(ptr: *mut u8, layout: Layout) {
    #[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
    if BACKEND.load(Relaxed) == JEMALLOC {
        // SAFETY: forwarded with the caller's promise.
        return unsafe { crate::allocators::JemallocGlobal.dealloc(ptr, layout) };
    }
    // SAFETY: forwarded with the caller's promise.
    unsafe { System.dealloc(ptr, layout) }
}

/// The backend's reallocation.
///
/// # Safety
/// `GlobalAlloc::realloc`'s contract.
#[inline(always)]
unsafe fn raw_realloc(ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
    #[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
    if BACKEND.load(Relaxed) == JEMALLOC {
        // SAFETY: forwarded with the caller's promise.
        return unsafe { crate::allocators::JemallocGlobal.realloc(ptr, layout, new_size) };
    }
    // SAFETY: forwarded with the caller's promise.
    unsafe { System.realloc(ptr, layout, new_size) }
}

#[inline(always)]
fn allocated(p: *mut u8, size: usize) {
    count_alloc(size);
    observe::allocated(Layer::Heap, GLOBAL_ALLOCATOR_NAME, p as usize, size, size);
}

// SAFETY: every block comes from the one backend chosen before the first allocation and goes
// back to it (`BACKEND` never changes once settled); the bookkeeping around the calls touches
// static atomics and const thread-locals, and the observer it may call runs with this thread's
// further allocations unobserved, so it never re-enters itself; nothing here unwinds.
unsafe impl GlobalAlloc for GlobalAllocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's promise (non-zero size).
        let p = unsafe { raw_alloc(layout, false) };
        if !p.is_null() {
            allocated(p, layout.size());
        }
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's promise (non-zero size).
        let p = unsafe { raw_alloc(layout, true) };
        if !p.is_null() {
            allocated(p, layout.size());
        }
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Reported before the block can be handed out again.
        observe::freed(Layer::Heap, GLOBAL_ALLOCATOR_NAME, ptr as usize, layout.size());
        // SAFETY: forwarded with the caller's promise (`ptr` allocated here with `layout`).
        unsafe { raw_dealloc(ptr, layout) };
        count_free(layout.size());
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // The old block is reported freed before the backend may hand its address to another
        // thread; if the backend refuses, it is still the caller's and is reported again.
        observe::freed(Layer::Heap, GLOBAL_ALLOCATOR_NAME, ptr as usize, layout.size());
        // SAFETY: forwarded with the caller's promise.
        let p = unsafe { raw_realloc(ptr, layout, new_size) };
        if p.is_null() {
            observe::allocated(Layer::Heap, GLOBAL_ALLOCATOR_NAME, ptr as usize, layout.size(), layout.size());
        } else {
            count_free(layout.size());
            allocated(p, new_size);
        }
        p
    }
}
