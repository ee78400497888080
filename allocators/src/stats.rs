//! [`AllocatorStats`]: the figures every allocator reports (TensorFlow's `AllocatorStats`).

use core::fmt;

use crate::ByteSize;

/// A snapshot of an allocator's statistics.
///
/// Sizes are in bytes. Fields an allocator cannot answer are `None` (for the optional ones) or 0.
/// `peak_bytes_in_use` is never below `bytes_in_use`, and `peak_bytes_reserved` never below
/// `bytes_reserved`.
///
/// New figures may be added (the struct is `#[non_exhaustive]`, so that is not a breaking
/// change): outside this crate, build one with [`AllocatorStats::build`] or from
/// `AllocatorStats::default()` by setting fields.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct AllocatorStats {
    /// Allocations granted since the allocator was made or its stats were last cleared.
    pub num_allocs: u64,
    /// Frees since the allocator was made or its stats were last cleared.
    pub num_frees: u64,
    /// Bytes handed out and not yet freed.
    pub bytes_in_use: u64,
    /// The highest `bytes_in_use` since the allocator was made or its stats were last cleared.
    ///
    /// Exact when one thread allocates at a time and for allocators that count under a lock
    /// (BFC, tracking with a limit). The lock-free counters of the system, jemalloc and pool
    /// allocators and of [`StatsCounters`](crate::StatsCounters) may report a peak up to
    /// `(threads - 1) x 4 MiB` below the true one while several threads allocate at once
    /// ([`FLUSH_BYTES`](crate::FLUSH_BYTES) per thread); it is never below `bytes_in_use`.
    pub peak_bytes_in_use: u64,
    /// The largest single allocation since the allocator was made or its stats were last cleared.
    pub largest_alloc_size: u64,
    /// The most bytes the allocator may hand out at once, if it has a limit.
    pub bytes_limit: Option<u64>,
    /// Bytes the allocator holds from its backing memory (a BFC's regions, a pool's cache);
    /// 0 for allocators that hold nothing beyond what is in use.
    pub bytes_reserved: u64,
    /// The highest `bytes_reserved`.
    pub peak_bytes_reserved: u64,
    /// The largest block that could be handed out without taking more backing memory, if known.
    pub largest_free_block_bytes: Option<u64>,
    /// `(free bytes - largest free block) / free bytes` over the reserved memory, if known.
    pub fragmentation: Option<f64>,
    /// Allocations that had to wait for memory to be freed and try again.
    pub num_alloc_retries: u64,
    /// Allocations refused for lack of memory or for the limit.
    pub num_ooms: u64,
    /// Bytes ever allocated (not restarted by `clear_stats`), if the allocator counts them;
    /// bytes freed are this less `bytes_in_use`.
    #[serde(default)]
    pub total_bytes_allocated: Option<u64>,
}

impl AllocatorStats {
    /// The figures `set` fills in, the rest at their defaults (0 or `None`): how a custom
    /// allocator builds its stats.
    ///
    /// ```
    /// use tensormem_allocators::AllocatorStats;
    /// let s = AllocatorStats::build(|s| {
    ///     s.num_allocs = 3;
    ///     s.bytes_in_use = 2048;
    ///     s.peak_bytes_in_use = 4096;
    /// });
    /// assert_eq!((s.num_allocs, s.num_frees), (3, 0));
    /// ```
    pub fn build(set: impl FnOnce(&mut Self)) -> Self {
        let mut s = Self::default();
        set(&mut s);
        s
    }
}

impl fmt::Display for AllocatorStats {
    /// A table, one figure a line, for people:
    ///
    /// ```
    /// use tensormem_allocators::AllocatorStats;
    /// let s = AllocatorStats::build(|s| (s.num_allocs, s.bytes_in_use, s.peak_bytes_in_use) = (3, 2048, 4096));
    /// let text = s.to_string();
    /// assert!(text.contains("bytes in use          2.0 KiB (2048)"));
    /// assert!(text.contains("peak bytes in use     4.0 KiB (4096)"));
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = |f: &mut fmt::Formatter<'_>, label: &str, v: u64| writeln!(f, "{label:<21} {} ({v})", ByteSize(v));
        writeln!(f, "{:<21} {}", "allocations", self.num_allocs)?;
        writeln!(f, "{:<21} {}", "frees", self.num_frees)?;
        bytes(f, "bytes in use", self.bytes_in_use)?;
        bytes(f, "peak bytes in use", self.peak_bytes_in_use)?;
        bytes(f, "largest allocation", self.largest_alloc_size)?;
        match self.bytes_limit {
            Some(l) => bytes(f, "limit", l)?,
            None => writeln!(f, "{:<21} none", "limit")?,
        }
        bytes(f, "bytes reserved", self.bytes_reserved)?;
        bytes(f, "peak bytes reserved", self.peak_bytes_reserved)?;
        if let Some(b) = self.largest_free_block_bytes {
            bytes(f, "largest free block", b)?;
        }
        if let Some(r) = self.fragmentation {
            writeln!(f, "{:<21} {r:.3}", "fragmentation")?;
        }
        writeln!(f, "{:<21} {}", "retries", self.num_alloc_retries)?;
        write!(f, "{:<21} {}", "out-of-memory errors", self.num_ooms)
    }
}
