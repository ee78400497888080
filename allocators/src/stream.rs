//! Device streams for stream-ordered allocation: [`StreamId`], the [`StreamEvents`] a
//! stream-ordered allocator records and polls, and the [`StreamOrdered`] extension of
//! [`Allocator`](crate::Allocator).

use core::fmt;
use core::ptr::NonNull;
use std::io;

/// A device stream: the device API's stream handle as an integer (CUDA: the `CUstream`
/// pointer). [`StreamId::LEGACY`] is CUDA's legacy default stream, which orders itself with
/// every blocking stream of its context.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct StreamId(u64);

impl StreamId {
    /// CUDA's legacy default stream (the null stream).
    pub const LEGACY: StreamId = StreamId(0);

    /// The stream whose handle is `raw` (CUDA: `stream as u64` for a `CUstream`).
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The handle.
    pub const fn raw(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Self::LEGACY { f.write_str("legacy") } else { write!(f, "stream {:#x}", self.0) }
    }
}

/// Events on device streams: what a stream-ordered allocator records when a block used on
/// other streams is freed, and polls before it reuses the block. CUDA's implementation is
/// [`CudaEvents`](crate::cuda::CudaEvents) (feature `cuda`).
pub trait StreamEvents: Send + Sync + fmt::Debug {
    /// A recorded event.
    type Event: Send + fmt::Debug;

    /// Records an event on `stream`: it completes when the work queued there so far has.
    ///
    /// # Errors
    /// The device's error.
    fn record(&self, stream: StreamId) -> io::Result<Self::Event>;

    /// Whether `event` has completed, without waiting.
    ///
    /// # Errors
    /// The device's error (a failed kernel, for one).
    fn query(&self, event: &Self::Event) -> io::Result<bool>;

    /// Waits until `event` has completed.
    ///
    /// # Errors
    /// The device's error.
    fn wait(&self, event: &Self::Event) -> io::Result<()>;

    /// Destroys `event`.
    fn destroy(&self, event: Self::Event);
}

/// What a stream-ordered allocator adds to [`Allocator`](crate::Allocator): blocks tied to the
/// stream they were allocated for, and uses on other streams recorded. Reach it through
/// [`Allocator::stream_ordered`](crate::Allocator::stream_ordered), which decorators forward.
///
/// # The safety rule, both sides
/// A device runs the work queued on one stream in order, and work on different streams in any
/// order. A stream-ordered allocator ties each block to the stream named when it was allocated
/// ([`AllocationAttributes::stream`](crate::AllocationAttributes::stream)) and, once it is
/// freed, hands it out again at once, but only to requests of that same stream: their work is
/// queued after the work that used the block before, so it cannot overlap it.
/// - **The caller** queues work on a block only on its stream, or, for any other stream it
///   uses the block on, calls [`record_stream`](Self::record_stream) before freeing it.
/// - **The allocator** then records an event on each such stream when the block is freed and
///   keeps the block out of its free lists until every event has completed (checked at later
///   allocations, without blocking); when memory runs short it waits for them.
///
/// Host code that reads or writes a block through the legacy stream's synchronous copies works
/// on the legacy stream.
pub trait StreamOrdered: Send + Sync {
    /// Records that work queued on `stream` uses the live block at `ptr` (PyTorch's
    /// `record_stream`): when the block is freed, it is reused only after that work, as of the
    /// free, has completed. Recording the block's own stream, or a stream twice, changes nothing.
    ///
    /// # Errors
    /// [`StreamError::NotLive`] when `ptr` is not a live block of this allocator.
    fn record_stream(&self, ptr: NonNull<u8>, stream: StreamId) -> Result<(), StreamError>;

    /// The stream the live block at `ptr` was allocated for (`None` if it is not one).
    fn block_stream(&self, ptr: NonNull<u8>) -> Option<StreamId>;

    /// Freed blocks waiting for work on other streams to complete before they can be reused.
    fn pending_frees(&self) -> usize;

    /// Checks the pending frees' events now (as an allocation does), returns those freed.
    fn process_events(&self) -> usize;

    /// Waits for every pending free's events and frees them all; returns how many there were.
    fn synchronize(&self) -> usize;
}

/// Why a stream operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The address is not a live block of the allocator.
    #[error("{allocator}: {address:#x} is not a live block, so no stream use can be recorded for it")]
    NotLive {
        /// The allocator's name.
        allocator: String,
        /// The address given.
        address: usize,
    },
    /// The allocator does not tie blocks to streams, so it cannot record stream uses.
    #[error("{allocator} does not order its blocks by stream: synchronise the other stream before freeing instead")]
    NotStreamOrdered {
        /// The allocator's name.
        allocator: String,
    },
}
