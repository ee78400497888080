//! Stream-ordered arenas as a user of leak checks, scopes and the figures sees them: a block
//! whose free waits for another stream's work is freed for the leak check when the caller frees
//! it, counted once, and its memory is reused only after that work (on a fake device that keeps
//! the driver's rules over host memory; the real device's test is in `cuda.rs`).

#![cfg(target_os = "linux")]

use std::alloc::Layout;
use std::sync::Arc;

use tensormem::allocators::{FakeDeviceSubAllocator, FakeStreams, StreamId, StreamOrderedBfc};
use tensormem::testing::LeakCheck;
use tensormem::{AllocationAttributes, Allocator, BfcAllocator};

const S1: StreamId = StreamId::from_raw(0x10);
const S2: StreamId = StreamId::from_raw(0x20);

#[test]
fn leak_checks_and_scopes_see_a_deferred_free_when_the_caller_frees() {
    let sub = Arc::new(FakeDeviceSubAllocator::new(64 << 10, 64 << 20));
    let template = BfcAllocator::builder()
        .name("fake-streams")
        .memory_limit(64 << 20)
        .allow_growth(true)
        .sub_allocator(sub.clone());
    let a: Arc<dyn Allocator> = Arc::new(StreamOrderedBfc::new(template, FakeStreams::new()).unwrap());
    let ordered = a.stream_ordered().expect("stream-ordered");
    let layout = Layout::from_size_align(10_000, 256).unwrap();
    let on = |s| AllocationAttributes::DEFAULT.on_stream(s);

    let check = LeakCheck::start();
    let x = {
        let _scope = tensormem::scope("decode");
        a.allocate_raw(layout, &on(S1)).unwrap()
    };
    let live = check.live();
    assert_eq!(live.leaks.len(), 1, "{live}");
    assert_eq!((live.leaks[0].tag.as_deref(), live.leaks[0].allocator.as_str()), (Some("decode"), "fake-streams"));

    // A kernel on S2 still reads the block when the caller frees it.
    let stats_before = a.stats().unwrap();
    ordered.record_stream(x, S2).unwrap();
    // SAFETY: `x` came from `a` with `layout`, freed once.
    unsafe { a.deallocate_raw(x, layout) };
    assert_eq!(ordered.pending_frees(), 1);
    // The caller is done with it: no leak, though the arena still holds it.
    let report = check.finish();
    assert!(report.is_empty(), "{report}");
    assert_eq!(a.stats().unwrap().bytes_in_use, stats_before.bytes_in_use, "held until S2's work is done");

    // Once it goes back (no second free is reported, nothing else is freed), S1 gets it again.
    let check = LeakCheck::start();
    assert_eq!(ordered.synchronize(), 1);
    assert_eq!(a.stats().unwrap().bytes_in_use, 0);
    let y = a.allocate_raw(layout, &on(S1)).unwrap();
    assert_eq!(y, x);
    // SAFETY: `y` came from `a` with `layout`, freed once.
    unsafe { a.deallocate_raw(y, layout) };
    let report = check.finish();
    assert!(report.is_empty(), "{report}");
    let s = a.stats().unwrap();
    assert_eq!((s.num_allocs, s.num_frees, s.bytes_in_use), (2, 2, 0));
    drop(a);
    let device = sub.memory().driver();
    assert!(device.violations().is_empty(), "{:?}", device.violations());
    assert_eq!(device.used_bytes(), 0);
}
