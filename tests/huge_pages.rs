//! A large tensor made on the default path (no allocator chosen) lands in the default pool's
//! transparent huge pages, read from `/proc/self/smaps` where Linux has them at `madvise` or
//! `always`. With `TENSORMEM_ALLOC_CONF=pool.huge_pages=false` it fails: that is the 4 KiB path.

use tensormem::AllocatorRegistry;
use tensormem_tensor::{DType, Tensor};

/// Bytes of `AnonHugePages` in this process's mappings that overlap `lo..lo + len`.
fn huge_bytes(lo: usize, len: usize) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let (mut overlaps, mut total) = (false, 0);
    for line in smaps.lines() {
        let range = line.split_whitespace().next().and_then(|r| r.split_once('-'));
        if let Some((a, b)) = range
            && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
        {
            overlaps = a < lo + len && lo < b;
        } else if overlaps && let Some(kb) = line.strip_prefix("AnonHugePages:") {
            total += kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok()? * 1024;
        }
    }
    Some(total)
}

#[test]
fn a_large_default_tensor_is_in_huge_pages() {
    assert_eq!(AllocatorRegistry::global().get().name(), "pool", "the default path's allocator");
    let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if !(mode.contains("[madvise]") || mode.contains("[always]")) {
        eprintln!("transparent huge pages are not given here ({:?}): nothing to check", mode.trim());
        return;
    }
    let x = Tensor::ones(&[4 << 20], DType::F32).unwrap(); // 16 MiB, written by `ones`
    let at = x.as_slice::<f32>().unwrap().as_ptr() as usize;
    let huge = huge_bytes(at, 16 << 20).unwrap();
    assert!(huge >= 4 << 21, "16 MiB tensor at {at:#x}: {huge} B in huge pages");
    assert_eq!(x.sum().unwrap().item::<f32>().unwrap(), (4 << 20) as f32);
}
