//! Memory mapped from files (model weights: `Tensor::from_file`, safetensors), accounted where
//! users look for memory: [`mapped_memory`], snapshots, the Prometheus export (as allocator
//! `mmap`) and the memory summary. In an inference engine the weights are usually the largest
//! user of memory, and no allocator sees them.

use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use dashmap::DashMap;

use crate::allocators::AllocatorStats;

/// One file with mappings alive.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MappedFile {
    /// The file. Written to JSON as text, with any bytes that are not UTF-8 shown as U+FFFD (a
    /// path's raw bytes cannot be JSON, and a snapshot must never fail to serialise).
    #[serde(serialize_with = "path_as_text")]
    pub path: PathBuf,
    /// Bytes of it mapped now (overlapping mappings count each time).
    pub bytes: u64,
    /// How many mappings of it are alive.
    pub mappings: u64,
}

fn path_as_text<S: serde::Serializer>(path: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&path.to_string_lossy())
}

/// Everything mapped from files now.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MappedMemory {
    /// Bytes mapped now, all files together.
    pub bytes: u64,
    /// The most bytes mapped at once.
    pub peak_bytes: u64,
    /// The files, largest first.
    pub files: Vec<MappedFile>,
}

struct Ledger {
    /// Live mappings by id: `(file, bytes)`.
    live: DashMap<u64, (PathBuf, u64)>,
    next_id: AtomicU64,
    bytes: AtomicU64,
    peak: AtomicU64,
    maps: AtomicU64,
    unmaps: AtomicU64,
    largest: AtomicU64,
}

static LEDGER: LazyLock<Ledger> = LazyLock::new(|| Ledger {
    live: DashMap::new(),
    next_id: AtomicU64::new(1),
    bytes: AtomicU64::new(0),
    peak: AtomicU64::new(0),
    maps: AtomicU64::new(0),
    unmaps: AtomicU64::new(0),
    largest: AtomicU64::new(0),
});

/// A live mapping in the ledger; unlisted when dropped.
#[derive(Debug)]
#[must_use = "the mapping is unlisted when the record drops: keep it as long as the mapping"]
pub struct MappingRecord {
    id: u64,
    bytes: u64,
}

/// Lists a mapping of `bytes` of `path` in the ledger of mapped files ([`mapped_memory`],
/// snapshots, the `mmap` series of the Prometheus export, the memory summary) until the returned
/// record is dropped: the hook through which any engine accounts the files it maps (tensormem's
/// tensors use it for safetensors weights).
///
/// ```
/// use std::path::Path;
/// use tensormem::telemetry::{mapped_memory, record_mapping};
///
/// let before = mapped_memory().bytes;
/// let record = record_mapping(Path::new("/models/w.bin"), 4096);
/// assert!(mapped_memory().files.iter().any(|f| f.path == Path::new("/models/w.bin")));
/// drop(record);
/// assert!(mapped_memory().files.iter().all(|f| f.path != Path::new("/models/w.bin")));
/// # let _ = before;
/// ```
pub fn record_mapping(path: &Path, bytes: u64) -> MappingRecord {
    let l = &*LEDGER;
    let id = l.next_id.fetch_add(1, Relaxed);
    l.live.insert(id, (path.to_path_buf(), bytes));
    let now = l.bytes.fetch_add(bytes, Relaxed) + bytes;
    l.peak.fetch_max(now, Relaxed);
    l.maps.fetch_add(1, Relaxed);
    l.largest.fetch_max(bytes, Relaxed);
    tracing::debug!(path = %path.display(), bytes, mapped = now, "tensormem: mapped a file");
    MappingRecord { id, bytes }
}

impl Drop for MappingRecord {
    fn drop(&mut self) {
        let l = &*LEDGER;
        l.live.remove(&self.id);
        l.bytes.fetch_sub(self.bytes, Relaxed);
        l.unmaps.fetch_add(1, Relaxed);
    }
}

/// What is mapped from files now, per file (largest first).
///
/// ```
/// let m = tensormem::telemetry::mapped_memory();
/// assert!(m.peak_bytes >= m.bytes);
/// assert_eq!(m.files.iter().map(|f| f.bytes).sum::<u64>(), m.bytes);
/// ```
pub fn mapped_memory() -> MappedMemory {
    let l = &*LEDGER;
    let mut files: Vec<MappedFile> = Vec::new();
    for entry in l.live.iter() {
        let (path, bytes) = entry.value();
        match files.iter_mut().find(|f| &f.path == path) {
            Some(f) => {
                f.bytes += bytes;
                f.mappings += 1;
            }
            None => files.push(MappedFile { path: path.clone(), bytes: *bytes, mappings: 1 }),
        }
    }
    files.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.path.cmp(&b.path)));
    let bytes = files.iter().map(|f| f.bytes).sum();
    MappedMemory { bytes, peak_bytes: l.peak.load(Relaxed).max(bytes), files }
}

/// The mapped memory as the stats of a pseudo-allocator `mmap` (in use = bytes mapped, an
/// allocation = a mapping); `None` while nothing was ever mapped.
pub fn mapped_stats() -> Option<AllocatorStats> {
    let l = &*LEDGER;
    let maps = l.maps.load(Relaxed);
    if maps == 0 {
        return None;
    }
    let in_use = l.bytes.load(Relaxed);
    Some(AllocatorStats::build(|s| {
        s.num_allocs = maps;
        s.num_frees = l.unmaps.load(Relaxed);
        s.bytes_in_use = in_use;
        s.peak_bytes_in_use = l.peak.load(Relaxed).max(in_use);
        s.largest_alloc_size = l.largest.load(Relaxed);
    }))
}
