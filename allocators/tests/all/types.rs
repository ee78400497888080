//! Attributes, stats serialisation, and the counters' clear semantics.

use tensormem_allocators::{AllocationAttributes, AllocatorAttributes, AllocatorStats, ByteSize, StatsCounters};

#[test]
fn allocation_attributes_default_to_retry() {
    let a = AllocationAttributes::default();
    assert!(a.retry_on_failure);
    assert!(!a.allocation_will_be_logged);
    let no_retry = AllocationAttributes::NO_RETRY;
    assert_eq!((no_retry.retry_on_failure, no_retry.allocation_will_be_logged), (false, false));
}

#[test]
fn allocator_attributes_follow_tensorflow_bits() {
    let mut a = AllocatorAttributes::new();
    a.set_on_host(true);
    a.set_gpu_compatible(true);
    assert_eq!(a.bits(), 0b101);
    a.set_nic_compatible(true);
    a.set_track_sizes(true);
    assert_eq!(a.bits(), 0b1111);
    a.set_gpu_compatible(false);
    assert_eq!(a.bits(), 0b1011);
    a.set_device_specific(0xA5);
    assert_eq!(a.bits(), 0xA500_000B);
    assert_eq!(a.device_specific(), 0xA5);
    assert!(a.on_host() && a.nic_compatible() && !a.gpu_compatible() && a.track_sizes());
    assert_eq!(AllocatorAttributes::from_bits(0xA500_000B), a);
    let dbg = format!("{a:?}");
    assert!(dbg.contains("on_host: true") && dbg.contains("device_specific: 0xa5"), "{dbg}");
}

#[test]
fn merge_and_restrictiveness() {
    let host = AllocatorAttributes::new().with_on_host(true);
    let nic = AllocatorAttributes::new().with_nic_compatible(true);
    let both = host.merge(&nic);
    assert_eq!(both.bits(), 0b11);
    assert!(host.is_equal_or_less_restrictive_than(&both));
    assert!(nic.is_equal_or_less_restrictive_than(&both));
    assert!(both.is_equal_or_less_restrictive_than(&both));
    assert!(!both.is_equal_or_less_restrictive_than(&host));
    assert!(!host.is_equal_or_less_restrictive_than(&nic));
    assert!(AllocatorAttributes::new().is_equal_or_less_restrictive_than(&host));
    let dev = AllocatorAttributes::from_bits(0x0100_0000);
    assert_eq!(dev.merge(&host).bits(), 0x0100_0001);
    assert!(!dev.is_equal_or_less_restrictive_than(&host));
}

#[test]
fn stats_round_trip_through_json() {
    let s = AllocatorStats::build(|s| {
        s.num_allocs = 1;
        s.num_frees = 2;
        s.bytes_in_use = 3;
        s.peak_bytes_in_use = 4;
        s.largest_alloc_size = 5;
        s.bytes_limit = Some(6);
        s.bytes_reserved = 7;
        s.peak_bytes_reserved = 8;
        s.largest_free_block_bytes = Some(9);
        s.fragmentation = Some(0.25);
        s.num_alloc_retries = 10;
        s.num_ooms = 11;
        s.total_bytes_allocated = Some(12);
    });
    let json = serde_json::to_string(&s).unwrap();
    assert!(json.contains("\"bytes_limit\":6") && json.contains("\"fragmentation\":0.25"), "{json}");
    assert_eq!(serde_json::from_str::<AllocatorStats>(&json).unwrap(), s);
}

#[test]
fn byte_sizes_read_like_a_person_writes_them() {
    assert_eq!(ByteSize(0).to_string(), "0 B");
    assert_eq!(ByteSize(1023).to_string(), "1023 B");
    assert_eq!(ByteSize(1024).to_string(), "1.0 KiB");
    assert_eq!(ByteSize(5 << 20).to_string(), "5.0 MiB");
    assert_eq!(ByteSize(u64::MAX).to_string(), "16.0 EiB");
}

#[test]
fn counters_follow_tensorflow_clear_and_keep_totals() {
    let c = StatsCounters::new(None);
    c.record_alloc(100);
    c.record_alloc(5000);
    c.record_free(5000);
    c.record_oom();
    c.clear();
    let s = c.snapshot();
    assert_eq!((s.num_allocs, s.num_frees, s.largest_alloc_size), (0, 0, 0));
    assert_eq!((s.bytes_in_use, s.peak_bytes_in_use), (100, 100));
    assert_eq!((s.total_bytes_allocated, s.num_ooms), (5100, 1));
    c.record_alloc(50);
    let s = c.snapshot();
    assert_eq!((s.num_allocs, s.largest_alloc_size, s.peak_bytes_in_use), (1, 50, 150));
}

#[test]
fn counters_flush_large_deltas_and_survive_thread_exit() {
    let c = StatsCounters::new(None);
    // A thread allocates more than the flush threshold and exits without freeing: its shard is
    // handed back, and another thread frees the memory.
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..10 {
                c.record_alloc(1 << 20);
            }
        });
    });
    let s = c.snapshot();
    assert_eq!((s.num_allocs, s.bytes_in_use, s.peak_bytes_in_use), (10, 10 << 20, 10 << 20));
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..10 {
                c.record_free(1 << 20);
            }
        });
    });
    let s = c.snapshot();
    assert_eq!((s.num_frees, s.bytes_in_use, s.peak_bytes_in_use), (10, 0, 10 << 20));
}

#[test]
fn exited_threads_shards_are_reused() {
    let c = std::sync::Arc::new(StatsCounters::new(None));
    for _ in 0..100 {
        // `join` (unlike the end of `thread::scope`) waits until the thread's thread-local
        // destructors, which hand its shard back, have run.
        let c = c.clone();
        std::thread::spawn(move || c.record_alloc(8)).join().unwrap();
    }
    assert_eq!(c.snapshot().num_allocs, 100);
    assert_eq!(c.snapshot().bytes_in_use, 800);
    assert_eq!(c.shard_count(), 1, "shards of exited threads were not reused");
}
