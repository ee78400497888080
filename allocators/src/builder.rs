//! [`AllocatorBuilder`]: the options shared by the plain backends (name, limit, fill).

use core::fmt;
use core::marker::PhantomData;
use core::ptr::NonNull;

use crate::BuildError;

/// How fresh memory is filled before it is handed out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Fill {
    /// Left as the backend returns it (fastest).
    #[default]
    None,
    /// Zeroed (through `calloc`-style allocation, so fresh pages are not touched twice).
    Zero,
    /// Filled with the 32-bit pattern `0x7fedbeef`, a NaN as `f32`, as PyTorch's junk fill does,
    /// so that reads of uninitialised memory show up in results.
    Junk,
}

/// The 32-bit junk pattern, a quiet NaN as `f32`.
pub const JUNK_PATTERN: u32 = 0x7fed_beef;

impl Fill {
    /// Fills `len` bytes at `ptr` with the junk pattern (little-endian, cut at the end).
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes.
    pub(crate) unsafe fn junk(ptr: NonNull<u8>, len: usize) {
        let pattern = JUNK_PATTERN.to_le_bytes();
        for i in 0..len {
            // SAFETY: `i < len` and the caller promises `len` writable bytes at `ptr`.
            unsafe { ptr.as_ptr().add(i).write(pattern[i % 4]) };
        }
    }
}

/// The options of a backend, as collected by [`AllocatorBuilder`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendOptions {
    /// The allocator's name.
    pub name: String,
    /// The most bytes it may hand out at once.
    pub bytes_limit: Option<u64>,
    /// How fresh memory is filled.
    pub fill: Fill,
}

/// A backend that an [`AllocatorBuilder`] can build.
pub trait FromOptions: Sized {
    /// The name used when none is given.
    const DEFAULT_NAME: &'static str;
    /// Builds the backend from validated options.
    fn from_options(options: BackendOptions) -> Self;
}

/// Builder for [`SystemAllocator`](crate::SystemAllocator) and
/// [`JemallocAllocator`](crate::JemallocAllocator).
///
/// ```
/// use tensormem_allocators::{BuildError, SystemAllocator};
///
/// let limited = SystemAllocator::builder().name("cpu-limited").bytes_limit(1 << 20).zero_fill().build()?;
/// assert_eq!(tensormem_allocators::Allocator::name(&limited), "cpu-limited");
///
/// let err = SystemAllocator::builder().zero_fill().junk_fill().build().unwrap_err();
/// assert!(matches!(err, BuildError::ConflictingFill { .. }));
/// # Ok::<(), BuildError>(())
/// ```
pub struct AllocatorBuilder<T> {
    name: Option<String>,
    bytes_limit: Option<u64>,
    zero: bool,
    junk: bool,
    _backend: PhantomData<fn() -> T>,
}

impl<T: FromOptions> AllocatorBuilder<T> {
    /// A builder with no name, no limit and no fill.
    pub fn new() -> Self {
        Self { name: None, bytes_limit: None, zero: false, junk: false, _backend: PhantomData }
    }

    /// Names the allocator (default: the backend's own name, e.g. `cpu`).
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Caps the bytes in use: a request that would go over fails with
    /// [`LimitExceeded`](crate::AllocErrorKind::LimitExceeded) before any memory is touched.
    #[must_use]
    pub fn bytes_limit(mut self, bytes: u64) -> Self {
        self.bytes_limit = Some(bytes);
        self
    }

    /// Zeroes fresh memory.
    #[must_use]
    pub fn zero_fill(mut self) -> Self {
        self.zero = true;
        self
    }

    /// Fills fresh memory with a NaN pattern (see [`Fill::Junk`]).
    #[must_use]
    pub fn junk_fill(mut self) -> Self {
        self.junk = true;
        self
    }

    /// Checks the options and builds the allocator.
    ///
    /// # Errors
    /// [`BuildError::ZeroLimit`] for `bytes_limit(0)`, [`BuildError::ConflictingFill`] when both
    /// fills were asked for, [`BuildError::EmptyName`] for an empty name.
    pub fn build(self) -> Result<T, BuildError> {
        let name = self.name.unwrap_or_else(|| T::DEFAULT_NAME.to_owned());
        if name.is_empty() {
            return Err(BuildError::EmptyName);
        }
        if self.bytes_limit == Some(0) {
            return Err(BuildError::ZeroLimit { allocator: name });
        }
        let fill = match (self.zero, self.junk) {
            (true, true) => return Err(BuildError::ConflictingFill { allocator: name }),
            (true, false) => Fill::Zero,
            (false, true) => Fill::Junk,
            (false, false) => Fill::None,
        };
        Ok(T::from_options(BackendOptions { name, bytes_limit: self.bytes_limit, fill }))
    }
}

impl<T: FromOptions> Default for AllocatorBuilder<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for AllocatorBuilder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AllocatorBuilder")
            .field("backend", &core::any::type_name::<T>())
            .field("name", &self.name)
            .field("bytes_limit", &self.bytes_limit)
            .field("zero_fill", &self.zero)
            .field("junk_fill", &self.junk)
            .finish()
    }
}
