//! Errors: the small `Copy` [`AllocError`] of the allocation path and the [`BuildError`] of builders.

use core::alloc::Layout;
use core::fmt;

use crate::format::ByteSize as Bytes;

/// Why an allocation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AllocErrorKind {
    /// The backend has no memory left to give (the system, jemalloc, or a BFC arena is exhausted).
    OutOfMemory,
    /// Granting the request would take the allocator over its configured byte limit.
    LimitExceeded,
    /// The requested size cannot be represented: `n * size_of::<T>()` overflows, or the size
    /// rounded up to the alignment exceeds `isize::MAX`.
    SizeOverflow,
    /// The backend cannot honour this layout (for example an alignment above what it supports).
    UnsupportedLayout,
}

impl fmt::Display for AllocErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::OutOfMemory => "out of memory",
            Self::LimitExceeded => "limit exceeded",
            Self::SizeOverflow => "size overflow",
            Self::UnsupportedLayout => "unsupported layout",
        })
    }
}

/// Capacity of the inline allocator-name buffer in [`AllocError`].
const NAME_CAP: usize = 27;

/// An allocator name stored inline so that [`AllocError`] stays `Copy` and allocation-free.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct InlineName {
    len: u8,
    truncated: bool,
    bytes: [u8; NAME_CAP],
}

impl InlineName {
    fn new(name: &str) -> Self {
        let mut end = name.len().min(NAME_CAP);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        let mut bytes = [0u8; NAME_CAP];
        bytes[..end].copy_from_slice(&name.as_bytes()[..end]);
        Self { len: end as u8, truncated: end < name.len(), bytes }
    }

    fn as_str(&self) -> &str {
        // The buffer was filled from a `&str` cut at a char boundary, so this never fails.
        core::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or("?")
    }
}

impl fmt::Debug for InlineName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// What was asked for: a layout, or an element count whose total size overflowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Request {
    Layout(Layout),
    Array { count: usize, element: Layout },
}

const NONE: u64 = u64::MAX;

/// The error of every allocation: the request, why it failed, which allocator refused it, and
/// (where the allocator knows them) how much was in use, of what limit, and the largest free block.
///
/// It is `Copy` and never allocates, so it can be built and returned on the hot path. Its
/// `Display` is written for a person:
///
/// ```
/// use core::alloc::Layout;
/// use tensormem_allocators::{AllocError, AllocErrorKind};
///
/// let layout = Layout::from_size_align(3 << 20, 64).unwrap();
/// let err = AllocError::new(AllocErrorKind::LimitExceeded, layout, "cpu").with_usage(7 << 20, Some(8 << 20));
/// assert_eq!(
///     err.to_string(),
///     "allocator 'cpu' could not allocate 3.0 MiB (3145728 bytes, align 64): limit exceeded: \
///      7.0 MiB in use of a 8.0 MiB limit"
/// );
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AllocError {
    kind: AllocErrorKind,
    request: Request,
    allocator: InlineName,
    rounded: u64,
    /// log2 of the largest supported alignment (`u8::MAX`: not said).
    max_align_log2: u8,
    in_use: u64,
    limit: u64,
    largest_free: u64,
    reserved: u64,
    /// Device ordinal (`u8::MAX`: none) and the driver's free and total memory in KiB (kept
    /// small: the error is returned by value on every allocation path).
    device: u8,
    device_free_kib: u32,
    device_total_kib: u32,
}

impl AllocError {
    /// An error of `kind` for `layout`, refused by the allocator called `allocator`.
    ///
    /// Names longer than 27 bytes are shortened (shown with a trailing `…`).
    pub fn new(kind: AllocErrorKind, layout: Layout, allocator: &str) -> Self {
        Self {
            kind,
            request: Request::Layout(layout),
            allocator: InlineName::new(allocator),
            rounded: NONE,
            max_align_log2: u8::MAX,
            in_use: NONE,
            limit: NONE,
            largest_free: NONE,
            reserved: NONE,
            device: u8::MAX,
            device_free_kib: 0,
            device_total_kib: 0,
        }
    }

    /// A [`AllocErrorKind::SizeOverflow`] error for an array of `count` elements of layout
    /// `element` whose total size does not fit in a `Layout`.
    pub fn array_overflow(count: usize, element: Layout, allocator: &str) -> Self {
        Self {
            request: Request::Array { count, element },
            ..Self::new(AllocErrorKind::SizeOverflow, element, allocator)
        }
    }

    /// Adds the bytes in use at the time of the failure and the limit, if there is one.
    #[must_use]
    pub fn with_usage(mut self, in_use: u64, limit: Option<u64>) -> Self {
        self.in_use = in_use.min(NONE - 1);
        self.limit = limit.map_or(NONE, |l| l.min(NONE - 1));
        self
    }

    /// Adds the size the allocator rounded the request up to (e.g. BFC's 256-byte rounding).
    #[must_use]
    pub fn with_rounded_size(mut self, rounded: u64) -> Self {
        self.rounded = rounded.min(NONE - 1);
        self
    }

    /// Adds the largest alignment the allocator supports (for
    /// [`AllocErrorKind::UnsupportedLayout`]).
    #[must_use]
    pub fn with_max_alignment(mut self, align: u64) -> Self {
        // Alignments are powers of two; anything else is rounded down to one.
        self.max_align_log2 = align.max(1).ilog2() as u8;
        self
    }

    /// The largest alignment the allocator supports, if it said.
    pub fn max_alignment(&self) -> Option<u64> {
        (self.max_align_log2 != u8::MAX).then(|| 1u64 << self.max_align_log2)
    }

    /// Adds the largest free block the allocator had when the request failed.
    #[must_use]
    pub fn with_largest_free_block(mut self, bytes: u64) -> Self {
        self.largest_free = bytes.min(NONE - 1);
        self
    }

    /// Adds the bytes the allocator had taken from its backing memory (in use, cached and
    /// free) when the request failed.
    #[must_use]
    pub fn with_reserved(mut self, bytes: u64) -> Self {
        self.reserved = bytes.min(NONE - 1);
        self
    }

    /// Adds the device the memory belongs to and what its driver reported free and in total
    /// when the request failed (`cuMemGetInfo`), kept to the KiB (up to 4 TiB) for ordinals
    /// below 255.
    #[must_use]
    pub fn with_device_memory(mut self, ordinal: u32, free: u64, total: u64) -> Self {
        let kib = |b: u64| u32::try_from(b >> 10).unwrap_or(u32::MAX);
        if let Ok(ordinal) = u8::try_from(ordinal)
            && ordinal != u8::MAX
        {
            self.device = ordinal;
            self.device_free_kib = kib(free);
            self.device_total_kib = kib(total);
        }
        self
    }

    /// Bytes the allocator had reserved when the request failed, if it said.
    pub fn reserved(&self) -> Option<u64> {
        opt(self.reserved)
    }

    /// `(ordinal, free, total)` of the device (bytes, to the KiB), from its driver, for a
    /// device allocator's error.
    pub fn device_memory(&self) -> Option<(u32, u64, u64)> {
        (self.device != u8::MAX).then_some((
            u32::from(self.device),
            u64::from(self.device_free_kib) << 10,
            u64::from(self.device_total_kib) << 10,
        ))
    }

    /// Why the allocation failed.
    pub fn kind(&self) -> AllocErrorKind {
        self.kind
    }

    /// The requested layout, or `None` when the request was an array whose size overflowed.
    pub fn layout(&self) -> Option<Layout> {
        match self.request {
            Request::Layout(layout) => Some(layout),
            Request::Array { .. } => None,
        }
    }

    /// The requested size in bytes, or `None` when it overflowed.
    pub fn requested_size(&self) -> Option<usize> {
        self.layout().map(|l| l.size())
    }

    /// The name of the allocator that refused the request (at most 27 bytes of it).
    pub fn allocator(&self) -> &str {
        self.allocator.as_str()
    }

    /// Bytes in use when the request failed, if the allocator reported them.
    pub fn in_use(&self) -> Option<u64> {
        opt(self.in_use)
    }

    /// The allocator's byte limit, if it has one and reported it.
    pub fn limit(&self) -> Option<u64> {
        opt(self.limit)
    }

    /// The size the request was rounded up to, if the allocator rounds.
    pub fn rounded_size(&self) -> Option<u64> {
        opt(self.rounded)
    }

    /// The largest free block when the request failed, if the allocator knows it.
    pub fn largest_free_block(&self) -> Option<u64> {
        opt(self.largest_free)
    }
}

fn opt(v: u64) -> Option<u64> {
    (v != NONE).then_some(v)
}

impl fmt::Debug for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("AllocError");
        d.field("kind", &self.kind).field("allocator", &self.allocator);
        match self.request {
            Request::Layout(layout) => d.field("layout", &layout),
            Request::Array { count, element } => d.field("count", &count).field("element", &element),
        };
        for (name, v) in [
            ("rounded", self.rounded),
            ("max_alignment", self.max_alignment().unwrap_or(NONE)),
            ("in_use", self.in_use),
            ("limit", self.limit),
            ("largest_free_block", self.largest_free),
            ("reserved", self.reserved),
        ] {
            if let Some(v) = opt(v) {
                d.field(name, &v);
            }
        }
        if let Some(device) = self.device_memory() {
            d.field("device_memory", &device);
        }
        d.finish()
    }
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ellipsis = if self.allocator.truncated { "…" } else { "" };
        write!(f, "allocator '{}{ellipsis}' could not allocate ", self.allocator.as_str())?;
        match self.request {
            Request::Layout(l) => write!(f, "{} ({} bytes, align {})", Bytes(l.size() as u64), l.size(), l.align())?,
            Request::Array { count, element } => write!(
                f,
                "{count} elements of {} bytes (align {}): the total size overflows usize",
                element.size(),
                element.align()
            )?,
        }
        if let Some(r) = self.rounded_size() {
            write!(f, ", rounded to {}", Bytes(r))?;
        }
        if !matches!(self.request, Request::Array { .. }) {
            write!(f, ": {}", self.kind)?;
        }
        if let Some(a) = self.max_alignment() {
            write!(f, ": this allocator aligns to at most {a} bytes")?;
        }
        match (self.in_use(), self.limit()) {
            (Some(u), Some(l)) => write!(f, ": {} in use of a {} limit", Bytes(u), Bytes(l))?,
            (Some(u), None) => write!(f, ": {} in use", Bytes(u))?,
            (None, Some(l)) => write!(f, ": limit {}", Bytes(l))?,
            (None, None) => {}
        }
        if let Some(r) = self.reserved() {
            write!(f, ", {} reserved", Bytes(r))?;
        }
        if let Some(b) = self.largest_free_block() {
            write!(f, "; largest free block {}", Bytes(b))?;
        }
        if let Some((ordinal, free, total)) = self.device_memory() {
            write!(f, "; device cuda:{ordinal} has {} free of {}", Bytes(free), Bytes(total))?;
        }
        Ok(())
    }
}

impl std::error::Error for AllocError {}

/// A builder was given options that cannot work together.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A byte limit of zero would refuse every allocation; leave the limit unset instead.
    #[error("allocator '{allocator}': a bytes_limit of 0 would refuse every allocation; set a positive limit or none")]
    ZeroLimit {
        /// The allocator being built.
        allocator: String,
    },
    /// `zero_fill` and `junk_fill` were both asked for; fresh memory can be filled one way only.
    #[error("allocator '{allocator}': zero_fill and junk_fill were both requested; choose one")]
    ConflictingFill {
        /// The allocator being built.
        allocator: String,
    },
    /// The name is empty.
    #[error("an allocator name must not be empty")]
    EmptyName,
    /// A required option was not given.
    #[error("allocator '{allocator}': the option {option} is required")]
    MissingOption {
        /// The allocator being built.
        allocator: String,
        /// The missing option.
        option: &'static str,
    },
    /// An option has a value that cannot work.
    #[error("allocator '{allocator}': invalid {option}: {reason}")]
    InvalidOption {
        /// The allocator being built.
        allocator: String,
        /// The option.
        option: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The limit cannot hold a single chunk.
    #[error("allocator '{allocator}': a memory limit of {limit} bytes is smaller than one chunk ({minimum} bytes)")]
    LimitTooSmall {
        /// The allocator being built.
        allocator: String,
        /// The limit given.
        limit: u64,
        /// The smallest usable limit.
        minimum: u64,
    },
    /// Address space for an expandable allocator could not be reserved.
    #[error(
        "allocator '{allocator}': could not reserve {} of address space ({bytes} bytes) from {memory} memory: \
         {reason}; lower the memory limit, raise the address-space limit (ulimit -v), or build it with expandable(false)",
        Bytes(*.bytes)
    )]
    Reserve {
        /// The allocator being built.
        allocator: String,
        /// The bytes asked for.
        bytes: u64,
        /// The memory's name (`os`, `cuda:0`).
        memory: String,
        /// The system's answer.
        reason: String,
    },
    /// The sub-allocator cannot align regions as the allocator needs.
    #[error(
        "allocator '{allocator}': its sub-allocator aligns regions to at most {alignment} bytes, but {required} are needed"
    )]
    UnsupportedSubAllocator {
        /// The allocator being built.
        allocator: String,
        /// The sub-allocator's largest alignment.
        alignment: u64,
        /// The alignment needed.
        required: u64,
    },
}
