//! Per-request [`AllocationAttributes`] and per-tensor [`AllocatorAttributes`], as in TensorFlow.

use core::fmt;

use crate::StreamId;

/// Options for one allocation request (TensorFlow's `AllocationAttributes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct AllocationAttributes {
    /// When memory is short, may the allocator wait for frees and retry before failing?
    /// Defaults to `true`, as in TensorFlow.
    pub retry_on_failure: bool,
    /// The caller logs this allocation itself, so the allocator need not.
    pub allocation_will_be_logged: bool,
    /// The device stream whose work will use the block ([`StreamId::LEGACY`] by default). A
    /// stream-ordered allocator ([`StreamOrdered`](crate::StreamOrdered)) reuses the block for
    /// later requests of that stream without waiting; other allocators ignore it.
    #[serde(default)]
    pub stream: StreamId,
}

impl AllocationAttributes {
    /// The defaults: retry on failure, not logged by the caller, the legacy stream.
    pub const DEFAULT: Self =
        Self { retry_on_failure: true, allocation_will_be_logged: false, stream: StreamId::LEGACY };

    /// Fail at once instead of waiting for memory to be freed.
    pub const NO_RETRY: Self =
        Self { retry_on_failure: false, allocation_will_be_logged: false, stream: StreamId::LEGACY };

    /// These attributes for work on `stream`.
    #[must_use]
    pub const fn on_stream(mut self, stream: StreamId) -> Self {
        self.stream = stream;
        self
    }
}

impl Default for AllocationAttributes {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Where the memory of a tensor must live and what it must be usable by (TensorFlow's
/// `AllocatorAttributes`): a 32-bit set of flags whose upper 8 bits are device-specific.
///
/// ```
/// use tensormem_allocators::AllocatorAttributes;
///
/// let host = AllocatorAttributes::new().with_on_host(true);
/// let pinned = host.with_gpu_compatible(true);
/// assert!(host.is_equal_or_less_restrictive_than(&pinned));
/// assert!(!pinned.is_equal_or_less_restrictive_than(&host));
/// assert_eq!(host.merge(&pinned), pinned);
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct AllocatorAttributes {
    value: u32,
}

macro_rules! flag {
    ($bit:expr, $get:ident, $set:ident, $with:ident, $doc:literal) => {
        #[doc = concat!("Whether the memory ", $doc, ".")]
        pub const fn $get(&self) -> bool {
            self.value & (1 << $bit) != 0
        }
        #[doc = concat!("Sets or clears the flag saying the memory ", $doc, ".")]
        pub fn $set(&mut self, on: bool) {
            if on {
                self.value |= 1 << $bit;
            } else {
                self.value &= !(1 << $bit);
            }
        }
        #[doc = concat!("A copy with the flag saying the memory ", $doc, " set to `on`.")]
        #[must_use]
        pub fn $with(mut self, on: bool) -> Self {
            self.$set(on);
            self
        }
    };
}

impl AllocatorAttributes {
    /// Mask of the upper 8 bits, reserved for device-specific meanings.
    pub const DEVICE_SPECIFIC_MASK: u32 = 0xff00_0000;

    /// No flags set: the least restrictive attributes.
    pub const fn new() -> Self {
        Self { value: 0 }
    }

    /// Attributes from their raw 32-bit value.
    pub const fn from_bits(value: u32) -> Self {
        Self { value }
    }

    /// The raw 32-bit value.
    pub const fn bits(&self) -> u32 {
        self.value
    }

    flag!(0, on_host, set_on_host, with_on_host, "must be in host (CPU) memory");
    flag!(1, nic_compatible, set_nic_compatible, with_nic_compatible, "must be usable by a network card (RDMA)");
    flag!(2, gpu_compatible, set_gpu_compatible, with_gpu_compatible, "must be usable by a GPU (pinned)");
    flag!(3, track_sizes, set_track_sizes, with_track_sizes, "must have its sizes tracked");

    /// The upper 8 bits, whose meaning is up to each device.
    pub const fn device_specific(&self) -> u8 {
        (self.value >> 24) as u8
    }

    /// Replaces the upper 8 device-specific bits.
    pub fn set_device_specific(&mut self, bits: u8) {
        self.value = (self.value & !Self::DEVICE_SPECIFIC_MASK) | (u32::from(bits) << 24);
    }

    /// The union of both sets of requirements (TensorFlow's `Merge`): memory satisfying the
    /// result satisfies both.
    #[must_use]
    pub const fn merge(&self, other: &Self) -> Self {
        Self { value: self.value | other.value }
    }

    /// True when every flag set here is also set in `other` (TensorFlow's
    /// `IsEqualOrLessRestrictiveThan`): memory allocated for `other` also serves `self`.
    pub const fn is_equal_or_less_restrictive_than(&self, other: &Self) -> bool {
        (self.value | other.value) == other.value
    }
}

impl fmt::Debug for AllocatorAttributes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("AllocatorAttributes");
        d.field("on_host", &self.on_host())
            .field("nic_compatible", &self.nic_compatible())
            .field("gpu_compatible", &self.gpu_compatible())
            .field("track_sizes", &self.track_sizes());
        if self.device_specific() != 0 {
            d.field("device_specific", &format_args!("{:#04x}", self.device_specific()));
        }
        d.finish()
    }
}
