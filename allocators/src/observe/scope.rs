//! Scopes: the thread's stack of tags ([`scope`], [`ScopeGuard`], [`current_scope`]).

use core::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::thread::{self, ThreadId};

use super::{SCOPED, Tag, set_bits};

struct Entry {
    tag: Tag,
    open: Arc<AtomicBool>,
}

thread_local! {
    static SCOPES: std::cell::RefCell<Vec<Entry>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Tags this thread's allocations until it is dropped; made by [`scope`].
///
/// Guards normally drop in the reverse order they were made, on the thread that made them.
/// The guard is `Send`: dropped on another thread, it closes its scope without touching that
/// thread's stack; the thread that opened it stops using the tag at its next allocation (and
/// scopes opened inside it keep their full path). Dropped out of order on its own thread, it
/// closes just its own scope. Neither corrupts anything.
#[must_use = "the scope ends when the guard is dropped"]
pub struct ScopeGuard {
    tag: Tag,
    open: Arc<AtomicBool>,
    thread: ThreadId,
}

/// Opens a scope: until the returned guard drops, allocations made on this thread through any
/// tensormem allocator carry the tag. Scopes nest: inside `scope("encoder.layer3")`,
/// `scope("attn")` tags with `encoder.layer3/attn`.
///
/// ```
/// use tensormem_allocators::observe::{current_scope, scope};
///
/// assert_eq!(current_scope(), None);
/// let _layer = scope("encoder.layer3");
/// {
///     let _attn = scope("attn");
///     assert_eq!(current_scope().as_deref(), Some("encoder.layer3/attn"));
/// }
/// assert_eq!(current_scope().as_deref(), Some("encoder.layer3"));
/// ```
pub fn scope(tag: &str) -> ScopeGuard {
    super::unobserved(|| scope_unobserved(tag))
}

fn scope_unobserved(tag: &str) -> ScopeGuard {
    let path = match current_tag() {
        Some(parent) => Tag::intern(&format!("{}/{tag}", parent.as_str())),
        None => Tag::intern(tag),
    };
    let open = Arc::new(AtomicBool::new(true));
    SCOPES.with_borrow_mut(|s| s.push(Entry { tag: path, open: open.clone() }));
    set_bits(SCOPED, true);
    ScopeGuard { tag: path, open, thread: thread::current().id() }
}

/// The innermost open scope on this thread, as a full path.
pub fn current_scope() -> Option<String> {
    current_tag().map(|t| t.as_str().to_owned())
}

/// The innermost open scope on this thread, interned; `None` outside every scope (and during
/// thread teardown).
pub fn current_tag() -> Option<Tag> {
    SCOPES
        .try_with(|s| {
            let mut s = s.try_borrow_mut().ok()?;
            // Scopes closed from another thread are dropped from the top when seen.
            while s.last().is_some_and(|e| !e.open.load(Relaxed)) {
                s.pop();
            }
            if s.is_empty() {
                set_bits(SCOPED, false);
            }
            s.last().map(|e| e.tag)
        })
        .ok()
        .flatten()
}

impl ScopeGuard {
    /// The full path this guard tags with.
    pub fn tag(&self) -> Tag {
        self.tag
    }
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        self.open.store(false, Relaxed);
        super::unobserved(|| self.close());
    }
}

impl ScopeGuard {
    fn close(&self) {
        if thread::current().id() != self.thread {
            return;
        }
        let _ = SCOPES.try_with(|s| {
            if let Ok(mut s) = s.try_borrow_mut() {
                s.retain(|e| e.open.load(Relaxed));
                if s.is_empty() {
                    set_bits(SCOPED, false);
                }
            }
        });
    }
}

impl fmt::Debug for ScopeGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopeGuard").field("tag", &self.tag).field("open", &self.open.load(Relaxed)).finish()
    }
}
