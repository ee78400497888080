//! [`SplitPolicy`]: when a free chunk handed out for a smaller request is cut in two.

use core::fmt;
use core::str::FromStr;

use super::state::MIN_ALLOCATION_SIZE;

/// Requests up to this size are "small" for [`SplitPolicy::PyTorch`] (PyTorch's `kSmallSize`).
const SMALL_REQUEST: usize = 1 << 20;

/// When the BFC cuts the free chunk it found for a request, keeping the rest free.
///
/// Not splitting wastes the remainder for as long as the block lives (internal fragmentation);
/// splitting leaves a free remainder that may be too small to reuse until its neighbour is freed
/// (external fragmentation). The default keeps internal waste small:
///
/// | policy | splits when the remainder is | name in `bfc.split` |
/// |---|---|---|
/// | [`Remainder(256)`](Self::Remainder) (default) | at least one 256-byte chunk | `remainder:256B` |
/// | [`PyTorch`](Self::PyTorch) | >= 512 B for requests up to 1 MiB, > 1 MiB above | `pytorch` |
/// | [`TensorFlow`](Self::TensorFlow) | >= the rounded request, or >= `max_internal_fragmentation` | `tensorflow` |
///
/// ```
/// use tensormem_allocators::SplitPolicy;
///
/// assert_eq!("tensorflow".parse::<SplitPolicy>(), Ok(SplitPolicy::TensorFlow));
/// assert_eq!("remainder:4096".parse::<SplitPolicy>(), Ok(SplitPolicy::Remainder(4096)));
/// assert_eq!(SplitPolicy::default(), SplitPolicy::Remainder(256));
/// // PyTorch keeps a 3 MiB block whole for a 2.5 MiB request (0.5 MiB left), but splits 4 MiB.
/// assert!(!SplitPolicy::PyTorch.splits(3 << 20, 5 << 19, 0));
/// assert!(SplitPolicy::PyTorch.splits(4 << 20, 5 << 19, 0));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SplitPolicy {
    /// Split whenever the remainder is at least this many bytes (rounded up to 256).
    Remainder(usize),
    /// PyTorch's caching allocator: split a block for a request up to 1 MiB when at least 512 B
    /// remain, for a larger request when more than 1 MiB remains.
    PyTorch,
    /// TensorFlow's BFC: split when the chunk is at least twice the rounded request, or when the
    /// remainder reaches `max_internal_fragmentation_bytes` (128 MiB by default).
    TensorFlow,
}

impl Default for SplitPolicy {
    fn default() -> Self {
        Self::Remainder(MIN_ALLOCATION_SIZE)
    }
}

impl SplitPolicy {
    /// Whether a free chunk of `chunk` bytes handed out for a request rounded to `rounded`
    /// bytes (`chunk >= rounded`) is split; `max_internal_fragmentation` is TensorFlow's cap.
    pub fn splits(self, chunk: usize, rounded: usize, max_internal_fragmentation: usize) -> bool {
        let rest = chunk.saturating_sub(rounded);
        if rest < MIN_ALLOCATION_SIZE {
            return false;
        }
        match self {
            Self::Remainder(min) => rest >= min,
            Self::PyTorch if rounded <= SMALL_REQUEST => rest >= 512,
            Self::PyTorch => rest > SMALL_REQUEST,
            Self::TensorFlow => chunk >= rounded.saturating_mul(2) || rest >= max_internal_fragmentation,
        }
    }
}

impl fmt::Display for SplitPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Remainder(n) => write!(f, "remainder:{n}B"),
            Self::PyTorch => f.write_str("pytorch"),
            Self::TensorFlow => f.write_str("tensorflow"),
        }
    }
}

/// A `bfc.split` value that is not a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseSplitPolicyError;

impl fmt::Display for ParseSplitPolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("expected tensorflow, pytorch, or remainder:<bytes>")
    }
}

impl std::error::Error for ParseSplitPolicyError {}

impl FromStr for SplitPolicy {
    type Err = ParseSplitPolicyError;

    /// `tensorflow`, `pytorch`, or `remainder:<bytes>` (a plain byte count, `B` optional;
    /// rounded up to 256, at least 256). Case-insensitive.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "tensorflow" | "tf" => Ok(Self::TensorFlow),
            "pytorch" | "torch" => Ok(Self::PyTorch),
            _ => {
                let n = s.strip_prefix("remainder:").ok_or(ParseSplitPolicyError)?;
                let n: usize = n.trim().trim_end_matches('b').trim().parse().map_err(|_| ParseSplitPolicyError)?;
                let n = n
                    .max(MIN_ALLOCATION_SIZE)
                    .checked_next_multiple_of(MIN_ALLOCATION_SIZE)
                    .ok_or(ParseSplitPolicyError)?;
                Ok(Self::Remainder(n))
            }
        }
    }
}
