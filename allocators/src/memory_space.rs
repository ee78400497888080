//! [`MemorySpace`]: where an allocator's memory lives, and so who may read and write it.

use core::fmt;

/// Where an allocator's blocks live.
///
/// Host code may read and write [`Host`](Self::Host) and [`HostPinned`](Self::HostPinned)
/// memory; [`Device`](Self::Device) memory belongs to an accelerator and must never be
/// dereferenced on the host (copy it with the device's API). Everything in tensormem that
/// touches bytes (tensor kernels, fill options, trace replay's first-byte write) checks this and
/// refuses device memory with an error naming the operation and the device.
///
/// ```
/// use tensormem_allocators::{Allocator, MemorySpace, SystemAllocator};
///
/// assert_eq!(SystemAllocator::new().memory_space(), MemorySpace::Host);
/// assert!(MemorySpace::HostPinned.is_host_accessible());
/// let gpu = MemorySpace::Device { ordinal: 1 };
/// assert!(!gpu.is_host_accessible());
/// assert_eq!(gpu.to_string(), "cuda:1");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemorySpace {
    /// Ordinary host memory.
    #[default]
    Host,
    /// Page-locked host memory that devices can reach by DMA; the host may use it too.
    HostPinned,
    /// Memory of accelerator `ordinal` (CUDA device N).
    Device {
        /// The device's ordinal.
        ordinal: u32,
    },
}

impl MemorySpace {
    /// Whether host code may read and write this memory.
    pub fn is_host_accessible(self) -> bool {
        !matches!(self, MemorySpace::Device { .. })
    }
}

impl fmt::Display for MemorySpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemorySpace::Host => f.write_str("host"),
            MemorySpace::HostPinned => f.write_str("host (pinned)"),
            MemorySpace::Device { ordinal } => write!(f, "cuda:{ordinal}"),
        }
    }
}
