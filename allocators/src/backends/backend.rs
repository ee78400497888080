//! The allocation path shared by the plain backends: zero-size requests, the limit, counting,
//! filling.

use core::alloc::Layout;
use core::ptr::NonNull;

use crate::observe::{self, Layer};
use crate::{AllocError, AllocErrorKind, BackendOptions, Fill, StatsCounters, dangling};

/// Options plus counters; a backend supplies only its raw alloc and free functions.
#[derive(Debug)]
pub(crate) struct Backend {
    pub(crate) options: BackendOptions,
    pub(crate) counters: StatsCounters,
    /// No limit and no fill: the fast path applies.
    plain: bool,
}

impl Backend {
    pub(crate) fn new(options: BackendOptions) -> Self {
        Self {
            counters: StatsCounters::new(options.bytes_limit),
            plain: options.bytes_limit.is_none() && options.fill == Fill::None,
            options,
        }
    }

    /// Allocates through `raw(layout, zeroed)`, which returns null on failure, and reports the
    /// block to the [observer](crate::observe) when `OBSERVE` (always, except in the bench
    /// baseline).
    #[inline(always)]
    pub(crate) fn allocate<const OBSERVE: bool>(
        &self,
        layout: Layout,
        raw: impl Fn(Layout, bool) -> *mut u8,
    ) -> Result<NonNull<u8>, AllocError> {
        let size = layout.size();
        if size == 0 {
            return Ok(dangling(layout));
        }
        let ptr = if self.plain {
            match NonNull::new(raw(layout, false)) {
                Some(ptr) => {
                    self.counters.record_alloc(size);
                    ptr
                }
                None => return Err(self.out_of_memory(layout)),
            }
        } else {
            self.allocate_general(layout, &raw)?
        };
        if OBSERVE {
            observe::allocated(Layer::Leaf, &self.options.name, ptr.as_ptr() as usize, size, size);
        }
        Ok(ptr)
    }

    /// The path with a limit or a fill.
    #[inline(never)]
    fn allocate_general(
        &self,
        layout: Layout,
        raw: &dyn Fn(Layout, bool) -> *mut u8,
    ) -> Result<NonNull<u8>, AllocError> {
        let size = layout.size();
        if let Err(hit) = self.counters.try_reserve(size) {
            return Err(self.over_limit(layout, hit.in_use, hit.limit));
        }
        let Some(ptr) = NonNull::new(raw(layout, self.options.fill == Fill::Zero)) else {
            self.counters.cancel_reservation(size);
            return Err(self.out_of_memory(layout));
        };
        if self.options.fill == Fill::Junk {
            // SAFETY: the backend just returned `ptr` valid for `size` bytes.
            unsafe { Fill::junk(ptr, size) };
        }
        self.counters.record_alloc(size);
        Ok(ptr)
    }

    #[cold]
    #[inline(never)]
    fn out_of_memory(&self, layout: Layout) -> AllocError {
        self.counters.record_oom();
        let in_use = self.counters.snapshot().bytes_in_use;
        let err = AllocError::new(AllocErrorKind::OutOfMemory, layout, &self.options.name)
            .with_usage(in_use, self.counters.limit());
        tracing::warn!(allocator = %self.options.name, size = layout.size(), align = layout.align(), in_use, "{err}");
        observe::refused(&self.options.name, &err, None);
        err
    }

    #[cold]
    #[inline(never)]
    fn over_limit(&self, layout: Layout, in_use: u64, limit: u64) -> AllocError {
        self.counters.record_oom();
        let err =
            AllocError::new(AllocErrorKind::LimitExceeded, layout, &self.options.name).with_usage(in_use, Some(limit));
        tracing::warn!(allocator = %self.options.name, size = layout.size(), in_use, limit, "{err}");
        observe::refused(&self.options.name, &err, None);
        err
    }

    /// Frees through `raw(ptr, layout)`, reporting the free first (before the address can be
    /// handed out again) when `OBSERVE`.
    ///
    /// # Safety
    /// `ptr` must be currently allocated by this backend with `layout`.
    #[inline(always)]
    pub(crate) unsafe fn deallocate<const OBSERVE: bool>(
        &self,
        ptr: NonNull<u8>,
        layout: Layout,
        raw: impl FnOnce(*mut u8, Layout),
    ) {
        if layout.size() == 0 {
            return;
        }
        if OBSERVE {
            observe::freed(Layer::Leaf, &self.options.name, ptr.as_ptr() as usize, layout.size());
        }
        self.counters.record_free(layout.size());
        raw(ptr.as_ptr(), layout);
    }
}
