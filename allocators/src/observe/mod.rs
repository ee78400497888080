//! Observation hooks: how leak checks, scopes and allocation history see every allocation made
//! through any tensormem allocator.
//!
//! Users reach this through the `tensormem` crate (`tensormem::scope`, `tensormem::testing`,
//! `tensormem::history`); this module is where the backends report, and where an allocator
//! written outside tensormem can report too.
//!
//! # Who reports
//! Decorators (tracking, retry, wrappers) forward and report nothing; the backend that serves a
//! request reports it once:
//! - a *leaf* backend (system, jemalloc) reports `alloc`/`free` when called by a user or a
//!   decorator, and `segment_alloc`/`segment_free` when a caching allocator calls it for memory
//!   to cache (inside [`nested`]);
//! - a *caching* backend (BFC, pool) reports `alloc`/`free` of the blocks it hands out, and the
//!   regions it takes from and returns to its source as segments; called from another caching
//!   allocator, its blocks are that allocator's memory and it reports none;
//! - the process's Rust heap (`tensormem::GlobalAllocator`) reports every block as allocator
//!   `global`, inside allocator calls too ([`Layer::Heap`]);
//! - a refused request is reported once, by the allocator that refused it, with [`refused`].
//!
//! # Cost
//! With nothing watching (no leak check, scope or history), an allocation costs one read of a
//! thread-local word and one relaxed load of a global word, and a free one relaxed load; both
//! are measured in the `observe` criterion bench.

mod scope;
mod tag;

use core::alloc::Layout;
use core::cell::{Cell, RefCell};
use core::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

// `tensormem::scope` is the one users call (it also installs tensormem's observer); these are
// what it is built on.
#[doc(hidden)]
pub use scope::{ScopeGuard, current_scope, current_tag, scope};
pub use tag::Tag;

use crate::{AllocError, AllocErrorKind};

/// This thread has an active leak check.
const CHECKED: u32 = 1;
/// This thread has an open scope.
const SCOPED: u32 = 2;
/// This thread is inside the observer: its allocations are not observed.
const IN_HOOK: u32 = 4;
/// Bits above this count the depth of [`nested`] calls.
const DEPTH_SHIFT: u32 = 8;

/// Global watch word: bit 0 = history recording; the rest counts live records (2 each).
static WATCH: AtomicUsize = AtomicUsize::new(0);
const HISTORY: usize = 1;

static OBSERVER: OnceLock<&'static dyn Observer> = OnceLock::new();

thread_local! {
    /// CHECKED | SCOPED | IN_HOOK | depth << DEPTH_SHIFT. Const-initialised with no destructor:
    /// reading it never allocates or fails, even during thread teardown.
    static STATE: Cell<u32> = const { Cell::new(0) };
    /// The ids of the leak checks this thread reports to, innermost last.
    static CHECKS: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

fn set_bits(bits: u32, on: bool) {
    STATE.with(|s| s.set(if on { s.get() | bits } else { s.get() & !bits }));
}

/// What happened to memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// A block was handed out.
    Alloc,
    /// A block was given back.
    Free,
    /// A request could not be served.
    Oom,
    /// A caching allocator took memory from its source (a region, a commit, a buffer).
    SegmentAlloc,
    /// A caching allocator gave memory back to its source.
    SegmentFree,
}

impl Action {
    /// The name used in history files: `alloc`, `free`, `oom`, `segment_alloc`, `segment_free`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::Free => "free",
            Action::Oom => "oom",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
        }
    }
}

#[doc(hidden)]
/// One observed event, as handed to the [`Observer`].
#[derive(Clone, Copy, Debug)]
pub struct Event<'a> {
    /// What happened.
    pub action: Action,
    /// The block's (or segment's) address; 0 for an OOM.
    pub address: usize,
    /// The size asked for (the segment's size for segments).
    pub requested: usize,
    /// The size set aside (a size class, a rounded chunk); equals `requested` when the same.
    pub allocated: usize,
    /// The name of the allocator that served it.
    pub allocator: &'a str,
    /// The innermost scope of the allocating thread (allocations and OOMs only).
    pub tag: Option<Tag>,
    /// Whether the allocating thread has an active leak check (allocations only); the observer
    /// reads the check ids with [`thread_checks`].
    pub checked: bool,
}

#[doc(hidden)]
/// Receives events; installed once per process by the `tensormem` crate.
pub trait Observer: Send + Sync {
    /// One event. Called on the thread that allocated or freed, with this thread's further
    /// allocations unobserved until it returns (so the observer may allocate).
    fn event(&self, event: &Event<'_>);

    /// A description of the block at `address` (e.g. the shape and dtype of the tensor it
    /// holds), asked for only while something watches this thread.
    fn describe(&self, address: usize, description: &dyn Fn() -> String);

    /// An allocator refused a request (see [`refused`]); called with this thread's further
    /// allocations unobserved and its further refusals unreported until it returns.
    fn refused(&self, _refusal: &Refusal<'_>) {}
}

#[doc(hidden)]
/// Installs the process's observer. Returns `false` if one was installed already.
pub fn set_observer(observer: &'static dyn Observer) -> bool {
    OBSERVER.set(observer).is_ok()
}

#[doc(hidden)]
/// Turns history recording on or off for every thread.
pub fn set_recording(on: bool) {
    if on {
        WATCH.fetch_or(HISTORY, Relaxed);
    } else {
        WATCH.fetch_and(!HISTORY, Relaxed);
    }
}

#[doc(hidden)]
/// Whether history is being recorded.
pub fn recording() -> bool {
    WATCH.load(Relaxed) & HISTORY != 0
}

#[doc(hidden)]
/// Tells the hooks how many allocation records the observer holds (`delta` added); while any
/// exist, frees on every thread are reported.
pub fn add_records(delta: isize) {
    if delta >= 0 {
        WATCH.fetch_add(delta as usize * 2, Relaxed);
    } else {
        WATCH.fetch_sub(delta.unsigned_abs() * 2, Relaxed);
    }
}

#[doc(hidden)]
/// Makes this thread report its allocations to leak check `id` (innermost last).
pub fn push_check(id: u64) {
    unobserved(|| CHECKS.with_borrow_mut(|c| c.push(id)));
    set_bits(CHECKED, true);
}

#[doc(hidden)]
/// Stops this thread reporting to leak check `id` (wherever it is in the stack).
pub fn remove_check(id: u64) {
    let _hook = InHook::enter();
    let _ = CHECKS.try_with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            if let Some(i) = c.iter().rposition(|&x| x == id) {
                c.remove(i);
            }
            if c.is_empty() {
                set_bits(CHECKED, false);
            }
        }
    });
}

#[doc(hidden)]
/// The leak checks this thread reports to, outermost first (for the observer, whose own
/// allocations, this copy's included, are unobserved).
pub fn thread_checks() -> Vec<u64> {
    CHECKS.try_with(|c| c.try_borrow().map(|c| c.clone()).unwrap_or_default()).unwrap_or_default()
}

/// Where a backend sits (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    /// Takes memory from the system: nested calls are a caching allocator's segments.
    Leaf,
    /// Caches memory: nested calls are another caching allocator's business.
    Caching,
    /// The process's Rust heap (`tensormem::GlobalAllocator`): every block is the program's own,
    /// whatever allocator call it is made in, so it is reported at any depth.
    Heap,
}

/// Runs `f` as a caching allocator's call into its source: allocations and frees in it are
/// segments (leaf) or not reported (caching).
#[inline]
pub fn nested<R>(f: impl FnOnce() -> R) -> R {
    struct Depth;
    impl Drop for Depth {
        fn drop(&mut self) {
            STATE.with(|s| s.set(s.get().wrapping_sub(1 << DEPTH_SHIFT)));
        }
    }
    STATE.with(|s| s.set(s.get().wrapping_add(1 << DEPTH_SHIFT)));
    let _depth = Depth;
    f()
}

/// Reports a block handed out by the backend `allocator` at `address`.
#[inline(always)]
pub fn allocated(layer: Layer, allocator: &str, address: usize, requested: usize, allocated: usize) {
    let s = STATE.with(Cell::get);
    if s & (CHECKED | SCOPED) == 0 && WATCH.load(Relaxed) & HISTORY == 0 {
        return;
    }
    allocated_slow(s, layer, allocator, address, requested, allocated);
}

#[cold]
#[inline(never)]
fn allocated_slow(s: u32, layer: Layer, allocator: &str, address: usize, requested: usize, allocated: usize) {
    let action = match (s >> DEPTH_SHIFT != 0, layer) {
        (false, _) | (true, Layer::Heap) => Action::Alloc,
        (true, Layer::Leaf) if recording() => Action::SegmentAlloc,
        (true, _) => return,
    };
    let top = action == Action::Alloc;
    let tag = if top && s & SCOPED != 0 { current_tag() } else { None };
    let checked = top && s & CHECKED != 0;
    dispatch(s, &Event { action, address, requested, allocated, allocator, tag, checked });
}

/// Reports a block given back to the backend `allocator`; call it before the memory can be
/// handed out again.
#[inline(always)]
pub fn freed(layer: Layer, allocator: &str, address: usize, size: usize) {
    if WATCH.load(Relaxed) == 0 {
        return;
    }
    freed_slow(layer, allocator, address, size);
}

#[cold]
#[inline(never)]
fn freed_slow(layer: Layer, allocator: &str, address: usize, size: usize) {
    let s = STATE.with(Cell::get);
    let action = match (s >> DEPTH_SHIFT != 0, layer) {
        (false, _) | (true, Layer::Heap) => Action::Free,
        (true, Layer::Leaf) if recording() => Action::SegmentFree,
        (true, _) => return,
    };
    let event = Event { action, address, requested: size, allocated: size, allocator, tag: None, checked: false };
    dispatch(s, &event);
}

/// Reports a caching allocator's segment (region, commit) taken from or returned to its source.
#[inline]
pub fn segment(action: Action, allocator: &str, address: usize, size: usize) {
    if !recording() {
        return;
    }
    let s = STATE.with(Cell::get);
    let event = Event { action, address, requested: size, allocated: size, allocator, tag: None, checked: false };
    dispatch(s, &event);
}

/// Reports a request of `size` bytes that `allocator` could not serve, when all it knows is the
/// size (an [`AllocError`] of kind out-of-memory is made for it); see [`refused`].
#[cold]
pub fn out_of_memory(allocator: &str, size: usize) {
    let layout = Layout::from_size_align(size, 1).unwrap_or(Layout::new::<u8>());
    refused(allocator, &AllocError::new(AllocErrorKind::OutOfMemory, layout, allocator), None);
}

/// A block an allocator knows to be live, as it hands it to [`refused`] for an OOM report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    /// Its address.
    pub address: usize,
    /// The bytes asked for.
    pub requested: usize,
    /// The bytes set aside for it.
    pub allocated: usize,
}

/// Keeps the `n` largest [`LiveBlock`]s pushed into it (by bytes asked for; of equal sizes, the
/// lowest addresses): what an allocator hands to [`refused`], found in one pass over its table.
/// A block enters only if it beats the smallest kept, so a table of equal sizes costs one
/// comparison per block.
#[derive(Debug)]
pub struct LargestBlocks {
    n: usize,
    /// A min-heap of `(requested, Reverse(address), allocated)`: addresses are unique, so the
    /// size set aside never decides the order.
    heap: BinaryHeap<Reverse<(usize, Reverse<usize>, usize)>>,
}

impl LargestBlocks {
    /// Keeps at most `n`.
    pub fn new(n: usize) -> Self {
        Self { n, heap: BinaryHeap::with_capacity(n.min(1 << 10) + 1) }
    }

    /// Offers one block.
    pub fn push(&mut self, b: LiveBlock) {
        let key = (b.requested, Reverse(b.address), b.allocated);
        if self.n == 0 || self.heap.len() == self.n && self.heap.peek().is_some_and(|Reverse(min)| key <= *min) {
            return;
        }
        self.heap.push(Reverse(key));
        if self.heap.len() > self.n {
            self.heap.pop();
        }
    }

    /// The blocks kept, largest first (of equal sizes, the lowest address first).
    pub fn into_sorted(self) -> Vec<LiveBlock> {
        let mut v: Vec<LiveBlock> = self
            .heap
            .into_iter()
            .map(|Reverse((requested, Reverse(address), allocated))| LiveBlock { address, requested, allocated })
            .collect();
        v.sort_by(|a, b| b.requested.cmp(&a.requested).then(a.address.cmp(&b.address)));
        v
    }
}

/// How many live blocks an OOM report lists, unless changed.
pub const DEFAULT_REPORT_ENTRIES: usize = 10;

static REPORT_ENTRIES: AtomicUsize = AtomicUsize::new(DEFAULT_REPORT_ENTRIES);

#[doc(hidden)]
/// Sets how many of the largest live blocks (and scopes) an OOM report lists.
pub fn set_report_entries(n: usize) {
    REPORT_ENTRIES.store(n, Relaxed);
}

/// How many of its largest live blocks an allocator should hand to [`refused`].
pub fn report_entries() -> usize {
    REPORT_ENTRIES.load(Relaxed)
}

/// Whether a refusal made now would be reported: an observer is installed, and this thread is
/// neither inside it nor a caching allocator's call into its source. A backend gathers its
/// largest live blocks for [`refused`] only then, so that an OOM nobody reports costs nothing
/// extra.
pub fn reports_wanted() -> bool {
    let s = STATE.with(Cell::get);
    OBSERVER.get().is_some() && s & IN_HOOK == 0 && s >> DEPTH_SHIFT == 0
}

#[doc(hidden)]
/// A refused request, as handed to [`Observer::refused`].
#[derive(Clone, Copy, Debug)]
pub struct Refusal<'a> {
    /// The allocator that refused.
    pub allocator: &'a str,
    /// Its error.
    pub error: &'a AllocError,
    /// Its largest live blocks, largest first, when it keeps a table of them.
    pub largest_live: Option<&'a [LiveBlock]>,
    /// The innermost scope of the refused thread.
    pub tag: Option<Tag>,
}

/// Reports that `allocator` refused a request with `error` (out of memory or over its limit),
/// with its largest live blocks (largest first, at most [`report_entries`]) when it keeps a
/// table of them. Call it after releasing the allocator's own locks: the observer builds an OOM
/// report and runs user callbacks, which may allocate and free.
///
/// A refusal inside [`nested`] (a caching allocator's call into its source) is not reported:
/// the caching allocator may recover, and reports its own refusal if it does not.
#[cold]
pub fn refused(allocator: &str, error: &AllocError, largest_live: Option<&[LiveBlock]>) {
    let s = STATE.with(Cell::get);
    let tag = if s & SCOPED != 0 { current_tag() } else { None };
    if recording() {
        let event = Event {
            action: Action::Oom,
            address: 0,
            requested: error.requested_size().unwrap_or(0),
            allocated: 0,
            allocator,
            tag,
            checked: false,
        };
        dispatch(s, &event);
    }
    if s >> DEPTH_SHIFT != 0 || s & IN_HOOK != 0 {
        return;
    }
    if let Some(o) = OBSERVER.get() {
        let _hook = InHook::enter();
        o.refused(&Refusal { allocator, error, largest_live, tag });
    }
}

/// Describes the block at `address` (built lazily: only while this thread is watched).
#[inline]
pub fn describe(address: usize, description: impl Fn() -> String) {
    let s = STATE.with(Cell::get);
    if s & (CHECKED | SCOPED) == 0 && !recording() {
        return;
    }
    if s & IN_HOOK != 0 {
        return;
    }
    if let Some(o) = OBSERVER.get() {
        let _hook = InHook::enter();
        o.describe(address, &description);
    }
}

fn dispatch(s: u32, event: &Event<'_>) {
    if s & IN_HOOK != 0 {
        return;
    }
    if let Some(o) = OBSERVER.get() {
        let _hook = InHook::enter();
        o.event(event);
    }
}

/// Marks the thread as inside the observer until dropped, then restores what it was (so that
/// marks nest).
struct InHook {
    was_in: bool,
}

impl InHook {
    fn enter() -> Self {
        let was_in = STATE.with(Cell::get) & IN_HOOK != 0;
        set_bits(IN_HOOK, true);
        InHook { was_in }
    }
}

impl Drop for InHook {
    fn drop(&mut self) {
        if !self.was_in {
            set_bits(IN_HOOK, false);
        }
    }
}

/// Runs `f` with this thread's allocations unobserved: for the bookkeeping of the observation
/// machinery itself (scopes, leak checks, history), whose allocations are not the program's and
/// which holds locks that the observer takes (with the global allocator reporting every heap
/// allocation, an observed allocation under such a lock would re-enter it). Nests.
#[doc(hidden)]
pub fn unobserved<R>(f: impl FnOnce() -> R) -> R {
    let _hook = InHook::enter();
    f()
}

/// Whether this thread's allocations are watched now (a leak check, a scope, or history): a
/// caller may skip building descriptions for [`describe`] otherwise.
#[inline]
pub fn watched() -> bool {
    STATE.with(Cell::get) & (CHECKED | SCOPED) != 0 || recording()
}

/// The innermost open scope's tag, reading one thread-local word when no scope is open (for
/// allocators that record a tag per allocation, such as the tracking allocator).
#[inline]
pub fn scope_tag() -> Option<Tag> {
    if STATE.with(Cell::get) & SCOPED == 0 { None } else { current_tag() }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{LargestBlocks, LiveBlock};

    #[test]
    fn largest_blocks_keeps_the_n_largest_in_order() {
        let mut l = LargestBlocks::new(3);
        for (i, size) in [5usize, 1, 9, 7, 3, 9].into_iter().enumerate() {
            l.push(LiveBlock { address: 100 + i, requested: size, allocated: size });
        }
        let got: Vec<(usize, usize)> = l.into_sorted().iter().map(|b| (b.requested, b.address)).collect();
        assert_eq!(got, vec![(9, 102), (9, 105), (7, 103)]);
        let mut ties = LargestBlocks::new(2);
        for address in [30, 10, 20] {
            ties.push(LiveBlock { address, requested: 4, allocated: 4 });
        }
        let got: Vec<usize> = ties.into_sorted().iter().map(|b| b.address).collect();
        assert_eq!(got, vec![10, 20], "of equal sizes, the lowest addresses");
        let mut none = LargestBlocks::new(0);
        none.push(LiveBlock { address: 1, requested: 1, allocated: 1 });
        assert!(none.into_sorted().is_empty());
        let mut huge = LargestBlocks::new(usize::MAX);
        huge.push(LiveBlock { address: 1, requested: 1, allocated: 1 });
        assert_eq!(huge.into_sorted().len(), 1);
    }
}
