//! The allocation path shared by the plain backends: zero-size requests, the limit, counting,
//! filling.

use core::alloc::Layout;
use core::ptr::NonNull;

use crate::{AllocError, AllocErrorKind, BackendOptions, Fill, StatsCounters, dangling};

/// Options plus counters; a backend supplies only its raw alloc and free functions.
#[derive(Debug)]
pub(crate) struct Backend {
    pub(crate) options: BackendOptions,
    pub(crate) counters: StatsCounters,
}

impl Backend {
    pub(crate) fn new(options: BackendOptions) -> Self {
        Self { counters: StatsCounters::new(options.bytes_limit), options }
    }

    /// Allocates through `raw(layout, zeroed)`, which returns null on failure.
    #[inline]
    pub(crate) fn allocate(
        &self,
        layout: Layout,
        raw: impl FnOnce(Layout, bool) -> *mut u8,
    ) -> Result<NonNull<u8>, AllocError> {
        let size = layout.size();
        if size == 0 {
            return Ok(dangling(layout));
        }
        if let Err(hit) = self.counters.try_reserve(size) {
            self.counters.record_oom();
            return Err(self.error(AllocErrorKind::LimitExceeded, layout).with_usage(hit.in_use, Some(hit.limit)));
        }
        let Some(ptr) = NonNull::new(raw(layout, self.options.fill == Fill::Zero)) else {
            self.counters.cancel_reservation(size);
            self.counters.record_oom();
            let in_use = self.counters.snapshot().bytes_in_use;
            return Err(self.error(AllocErrorKind::OutOfMemory, layout).with_usage(in_use, self.counters.limit()));
        };
        if self.options.fill == Fill::Junk {
            // SAFETY: the backend just returned `ptr` valid for `size` bytes.
            unsafe { Fill::junk(ptr, size) };
        }
        self.counters.record_alloc(size);
        Ok(ptr)
    }

    /// Frees through `raw(ptr, layout)`.
    ///
    /// # Safety
    /// `ptr` must be currently allocated by this backend with `layout`.
    #[inline]
    pub(crate) unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout, raw: impl FnOnce(*mut u8, Layout)) {
        if layout.size() == 0 {
            return;
        }
        self.counters.record_free(layout.size());
        raw(ptr.as_ptr(), layout);
    }

    fn error(&self, kind: AllocErrorKind, layout: Layout) -> AllocError {
        AllocError::new(kind, layout, &self.options.name)
    }
}
