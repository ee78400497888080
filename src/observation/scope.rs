//! Scopes and the scoped default allocator: [`scope`], [`current_scope`],
//! [`with_default_allocator`].

use std::cell::RefCell;
use std::sync::Arc;

pub use crate::allocators::observe::ScopeGuard;
use crate::allocators::{Allocator, observe};

/// Opens a scope: until the guard drops, allocations made on this thread through any tensormem
/// allocator carry the tag, in tracking chunks, leak reports, history events and
/// [`tag_stats`](crate::tag_stats). Scopes nest: inside `scope("encoder.layer3")`,
/// `scope("attn")` tags with `encoder.layer3/attn`.
///
/// Tags are interned for the life of the process: use a bounded set (layer and phase names).
/// The guard is `Send`; dropped on another thread, it closes its scope without touching that
/// thread's scopes, and the opening thread stops using the tag at its next allocation.
///
/// ```
/// use tensormem::{AllocatorExt, SystemAllocator, TrackingAllocator};
///
/// let tracker = TrackingAllocator::new(std::sync::Arc::new(SystemAllocator::new()));
/// let _layer = tensormem::scope("encoder.layer3");
/// let p = {
///     let _attn = tensormem::scope("attn");
///     assert_eq!(tensormem::current_scope().as_deref(), Some("encoder.layer3/attn"));
///     tracker.allocate::<f32>(16)?
/// };
/// let chunk = tracker.chunk(p.cast()).unwrap();
/// assert_eq!(chunk.tag.unwrap().as_str(), "encoder.layer3/attn");
/// // SAFETY: `p` came from `allocate::<f32>(16)` on `tracker`.
/// unsafe { tracker.deallocate(p, 16) };
/// # Ok::<(), tensormem::AllocError>(())
/// ```
pub fn scope(tag: &str) -> ScopeGuard {
    crate::observation::hub::hub();
    observe::scope(tag)
}

/// The innermost open scope on this thread, as a full path (`encoder.layer3/attn`).
pub fn current_scope() -> Option<String> {
    observe::current_scope()
}

thread_local! {
    static DEFAULT: RefCell<Vec<Arc<dyn Allocator>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with `alloc` as this thread's default allocator: inside it, everything that would
/// use the registry's default ([`AllocatorRegistry::get`](crate::AllocatorRegistry::get) and
/// `try_get` on the global registry, tensor constructors without an allocator, kernel outputs
/// whose first input is mapped or allocator-less) uses `alloc`. Calls nest; the previous
/// default is back when `f` returns or panics. Other threads are not affected.
///
/// ```
/// use std::sync::Arc;
/// use tensormem::{Allocator, AllocatorRegistry, SystemAllocator, TrackingAllocator};
///
/// let arena = Arc::new(TrackingAllocator::new(Arc::new(SystemAllocator::new())));
/// let name = tensormem::with_default_allocator(arena.clone(), || AllocatorRegistry::global().get().name().to_owned());
/// assert_eq!(name, arena.name());
/// ```
pub fn with_default_allocator<R>(alloc: Arc<dyn Allocator>, f: impl FnOnce() -> R) -> R {
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            let _ = DEFAULT.try_with(|d| d.borrow_mut().pop());
        }
    }
    DEFAULT.with_borrow_mut(|d| d.push(alloc));
    let _pop = Pop;
    f()
}

/// This thread's default set by [`with_default_allocator`], if any.
pub(crate) fn default_override() -> Option<Arc<dyn Allocator>> {
    DEFAULT.try_with(|d| d.borrow().last().cloned()).ok().flatten()
}
