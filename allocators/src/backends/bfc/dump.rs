//! [`MemoryDump`]: everything a BFC allocator knows about its memory, as TensorFlow's
//! `TF_BFC_MEMORY_DUMP` writes it, plus a picture of each region.

use core::fmt::Write as _;

use crate::{AllocatorStats, ByteSize};

/// Totals for one bin's size class: chunks whose size falls in bin `bin` (`256 << bin` bytes and
/// up), in use or free.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BinSummary {
    /// The bin number, 0 to 20.
    pub bin: usize,
    /// Bytes of chunks of this size class that are in use.
    pub bytes_in_use: u64,
    /// Bytes of all chunks of this size class.
    pub bytes_in_bin: u64,
    /// Chunks of this size class that are in use.
    pub chunks_in_use: u64,
    /// All chunks of this size class.
    pub chunks_in_bin: u64,
}

/// One region taken from the sub-allocator.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RegionInfo {
    /// Its address.
    pub base: usize,
    /// Its usable size in bytes.
    pub size: usize,
}

/// One chunk, in use or free.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChunkInfo {
    /// Index of its region in [`MemoryDump::regions`].
    pub region: usize,
    /// Its offset in the region.
    pub offset: usize,
    /// Its size (a multiple of 256).
    pub size: usize,
    /// The size asked for (0 when free).
    pub requested_size: usize,
    /// The bin it waits in, when free.
    pub bin: Option<usize>,
    /// Whether it is handed out.
    pub in_use: bool,
    /// Its allocation id, when in use.
    pub allocation_id: Option<u64>,
}

/// The reservation of an expandable BFC (see [`ExpandableMemory`](crate::ExpandableMemory)).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExpandableInfo {
    /// Bytes of address space reserved.
    pub reserved_address_space: u64,
    /// Bytes committed (backed by memory) from its start.
    pub committed: u64,
    /// How many commits make up the committed part.
    pub pieces: usize,
    /// The memory's granule.
    pub granule: u64,
}

/// A BFC allocator's memory at one moment: stats, per-bin totals, every chunk, and a text
/// picture of each region's occupancy (`#` in use, `.` free, `+` a cell holding both).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MemoryDump {
    /// The allocator's name.
    pub allocator: String,
    /// Its statistics.
    pub stats: AllocatorStats,
    /// One entry per bin, 0 to 20.
    pub bins: Vec<BinSummary>,
    /// Its regions, by address.
    pub regions: Vec<RegionInfo>,
    /// Every chunk, region by region, by address.
    pub chunks: Vec<ChunkInfo>,
    /// One line per region, 64 cells wide.
    pub occupancy: Vec<String>,
    /// The reservation, for an expandable allocator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expandable: Option<ExpandableInfo>,
}

/// Cells per region line of the occupancy picture.
const CELLS: usize = 64;

impl MemoryDump {
    pub(crate) fn new(
        allocator: String,
        stats: AllocatorStats,
        bins: Vec<BinSummary>,
        regions: Vec<RegionInfo>,
        chunks: Vec<ChunkInfo>,
    ) -> Self {
        let occupancy = regions
            .iter()
            .enumerate()
            .map(|(ri, r)| {
                // Per cell: bytes in use and bytes free that fall into it.
                let mut used = [0usize; CELLS];
                let mut free = [0usize; CELLS];
                let cell = r.size.div_ceil(CELLS).max(1);
                for c in chunks.iter().filter(|c| c.region == ri) {
                    let (mut at, end) = (c.offset, c.offset + c.size);
                    while at < end {
                        let i = (at / cell).min(CELLS - 1);
                        let upto = ((i + 1) * cell).min(end);
                        if c.in_use {
                            used[i] += upto - at
                        } else {
                            free[i] += upto - at
                        }
                        at = upto;
                    }
                }
                let picture: String = (0..CELLS)
                    .map(|i| match (used[i] > 0, free[i] > 0) {
                        (true, false) => '#',
                        (false, true) => '.',
                        (true, true) => '+',
                        (false, false) => ' ',
                    })
                    .collect();
                format!("region {ri} at {:#x}, {}: |{picture}|", r.base, ByteSize(r.size as u64))
            })
            .collect();
        Self { allocator, stats, bins, regions, chunks, occupancy, expandable: None }
    }

    pub(crate) fn with_expandable(mut self, expandable: Option<ExpandableInfo>) -> Self {
        self.expandable = expandable;
        self
    }

    /// A short report for people: totals, non-empty bins, and the occupancy picture.
    pub fn render(&self) -> String {
        let s = &self.stats;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "allocator '{}': {} in use of {} reserved (limit {}), largest free block {}, fragmentation {:.3}",
            self.allocator,
            ByteSize(s.bytes_in_use),
            ByteSize(s.bytes_reserved),
            ByteSize(s.bytes_limit.unwrap_or(0)),
            ByteSize(s.largest_free_block_bytes.unwrap_or(0)),
            s.fragmentation.unwrap_or(0.0)
        );
        for b in self.bins.iter().filter(|b| b.chunks_in_bin > 0) {
            let _ = writeln!(
                out,
                "bin {:>2} ({:>9}+): {} chunks, {} in use; {} in bin, {} in use",
                b.bin,
                ByteSize(256u64 << b.bin).to_string(),
                b.chunks_in_bin,
                b.chunks_in_use,
                ByteSize(b.bytes_in_bin),
                ByteSize(b.bytes_in_use)
            );
        }
        if let Some(e) = &self.expandable {
            let _ = writeln!(
                out,
                "expandable: {} committed in {} pieces of {} reserved (granule {})",
                ByteSize(e.committed),
                e.pieces,
                ByteSize(e.reserved_address_space),
                ByteSize(e.granule)
            );
        }
        for line in &self.occupancy {
            let _ = writeln!(out, "{line}");
        }
        out
    }
}
