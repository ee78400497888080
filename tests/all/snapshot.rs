//! Memory snapshots: stats of every allocator, live chunks of trackers, dumps of BFC allocators,
//! panics contained.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

use tensormem::telemetry::{MemorySnapshot, snapshot_of};
use tensormem::{
    AllocError, AllocationAttributes, Allocator, AllocatorExt, AllocatorRegistry, AllocatorStats, AllocatorWrapper,
    BfcAllocator, RetryAllocator, SystemAllocator, TrackingAllocator,
};

#[derive(Debug)]
struct Exploding;

// SAFETY: it never hands out memory.
unsafe impl Allocator for Exploding {
    fn name(&self) -> &str {
        "exploding"
    }
    fn allocate_raw(&self, layout: Layout, _: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        Err(AllocError::new(tensormem::AllocErrorKind::OutOfMemory, layout, "exploding"))
    }
    unsafe fn deallocate_raw(&self, _: NonNull<u8>, _: Layout) {}
    fn stats(&self) -> Option<AllocatorStats> {
        panic!("no stats today")
    }
}

#[test]
fn a_snapshot_holds_stats_chunks_and_dumps() {
    let r = AllocatorRegistry::new();
    let tracked = Arc::new(TrackingAllocator::new(Arc::new(SystemAllocator::new())));
    let bfc = Arc::new(BfcAllocator::builder().memory_limit(1 << 20).build().unwrap());
    r.register("cpu", 0, Arc::new(SystemAllocator::new())).unwrap();
    r.register("tracked", 1, tracked.clone()).unwrap();
    // Decorators pass the dump through.
    r.register("bfc", 2, Arc::new(AllocatorWrapper::new(Arc::new(RetryAllocator::new(bfc.clone()))))).unwrap();
    r.register("exploding", 3, Arc::new(Exploding)).unwrap();
    let a = tracked.allocate::<u32>(100).unwrap();
    let b = bfc.allocate::<u8>(1000).unwrap();

    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let snap = snapshot_of(&r);
    std::panic::set_hook(prev);

    let names: Vec<&str> = snap.allocators.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["cpu", "tracked", "bfc", "exploding"]);
    let [cpu, tr, bf, ex] = &snap.allocators[..] else { panic!() };
    assert_eq!(cpu.stats.as_ref().unwrap().bytes_in_use, 0);
    assert!(cpu.live_chunks.is_none() && cpu.memory_dump.is_none());
    let chunks = tr.live_chunks.as_ref().unwrap();
    assert_eq!((chunks.len(), chunks[0].requested_size, chunks[0].allocation_id), (1, 400, 1));
    assert_eq!(chunks[0].address, a.as_ptr() as usize);
    let dump = bf.memory_dump.as_ref().unwrap();
    assert_eq!(dump.chunks.iter().filter(|c| c.in_use).count(), 1);
    assert_eq!(bf.stats.as_ref().unwrap().bytes_in_use, 1024);
    assert_eq!(ex.error.as_deref(), Some("no stats today"));
    assert!(ex.stats.is_none());
    assert!(snap.taken_at_unix_ms > 1_600_000_000_000);

    let json = serde_json::to_string(&snap).unwrap();
    assert_eq!(serde_json::from_str::<MemorySnapshot>(&json).unwrap(), snap);
    // SAFETY: each freed once with its count.
    unsafe {
        tracked.deallocate(a, 100);
        bfc.deallocate(b, 1000);
    }
    assert!(snapshot_of(&r).allocators[1].live_chunks.as_ref().unwrap().is_empty());
}

#[test]
fn a_mapped_file_whose_path_is_not_utf8_still_serialises() {
    use std::os::unix::ffi::OsStrExt;
    let file = tensormem::telemetry::MappedFile {
        path: std::path::PathBuf::from(std::ffi::OsStr::from_bytes(b"/models/w\xff.safetensors")),
        bytes: 4096,
        mappings: 1,
    };
    let json = serde_json::to_string(&file).expect("a path that is not UTF-8 is written as text");
    assert!(json.contains("/models/w\u{fffd}.safetensors"), "{json}");
}
