//! The Prometheus collector: the exposition pinned by a golden text, left-out metrics, contained
//! panics, and registration into a prometheus::Registry.
#![cfg(feature = "prometheus")]

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

use tensormem::telemetry::AllocatorCollector;
use tensormem::{AllocError, AllocationAttributes, Allocator, AllocatorRegistry, AllocatorStats};

/// An allocator that allocates nothing and reports fixed stats (or panics when asked).
#[derive(Debug)]
struct Fixed(Option<AllocatorStats>);

// SAFETY: it never hands out memory.
unsafe impl Allocator for Fixed {
    fn name(&self) -> &str {
        "fixed"
    }
    fn allocate_raw(&self, layout: Layout, _: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        Err(AllocError::new(tensormem::AllocErrorKind::OutOfMemory, layout, "fixed"))
    }
    unsafe fn deallocate_raw(&self, _: NonNull<u8>, _: Layout) {}
    fn stats(&self) -> Option<AllocatorStats> {
        match &self.0 {
            Some(s) => Some(s.clone()),
            None => panic!("stats() blew up"),
        }
    }
}

fn registry() -> Arc<AllocatorRegistry> {
    let r = Arc::new(AllocatorRegistry::new());
    let caching = AllocatorStats::build(|s| {
        s.num_allocs = 120;
        s.num_frees = 100;
        s.bytes_in_use = 5 << 20;
        s.peak_bytes_in_use = 7 << 20;
        s.largest_alloc_size = 1 << 20;
        s.bytes_limit = Some(1 << 30);
        s.bytes_reserved = 8 << 20;
        s.peak_bytes_reserved = 16 << 20;
        s.largest_free_block_bytes = Some(2 << 20);
        s.fragmentation = Some(0.25);
        s.num_alloc_retries = 3;
        s.num_ooms = 1;
        s.total_bytes_allocated = None;
    });
    let plain = AllocatorStats::build(|s| {
        s.num_allocs = 10;
        s.num_frees = 9;
        s.bytes_in_use = 4096;
        s.peak_bytes_in_use = 8192;
        s.largest_alloc_size = 4096;
    });
    r.register("bfc", 0, Arc::new(Fixed(Some(caching)))).unwrap();
    r.register("cpu", 0, Arc::new(Fixed(Some(plain)))).unwrap();
    r.register("broken", 0, Arc::new(Fixed(None))).unwrap();
    r
}

/// The exposition without the process-wide figures of jemalloc and of the CUDA devices (where
/// there are any), which vary from run to run.
fn stable(text: &str) -> String {
    text.lines()
        .filter(|l| !l.contains("tensormem_jemalloc_") && !l.contains("tensormem_device_memory_"))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn the_exposition_matches_the_golden_text() {
    let c = AllocatorCollector::for_registry(registry());
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let text = stable(&c.render());
    std::panic::set_hook(prev);
    let golden = include_str!("../golden/exposition.txt");
    assert_eq!(text, golden, "the exposition changed; if on purpose, update tests/golden/exposition.txt:\n{text}");
}

#[test]
fn a_panicking_allocator_is_left_out_and_counted() {
    let c = AllocatorCollector::for_registry(registry());
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let first = c.render();
    let second = c.render();
    std::panic::set_hook(prev);
    assert!(!first.contains("allocator=\"broken\""));
    assert!(first.contains("tensormem_allocator_in_use_bytes{allocator=\"cpu\"} 4096"));
    assert!(first.contains("tensormem_collector_stats_panics_total 1"));
    assert!(second.contains("tensormem_collector_stats_panics_total 2"));
}

#[test]
fn it_registers_into_a_prometheus_registry_and_the_default_one() {
    let prom = prometheus::Registry::new();
    prom.register(Box::new(AllocatorCollector::for_registry(registry()))).unwrap();
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let families = prom.gather();
    std::panic::set_hook(prev);
    let in_use = families.iter().find(|f| f.name() == "tensormem_allocator_in_use_bytes").unwrap();
    assert_eq!(in_use.get_metric().len(), 2);
    // A second collector over the same metric names is refused by the same registry.
    assert!(prom.register(Box::new(AllocatorCollector::global())).is_err());
    prometheus::register(Box::new(AllocatorCollector::global())).unwrap();
    assert!(prometheus::gather().iter().any(|f| f.name() == "tensormem_allocator_in_use_bytes"));
}

#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[test]
fn jemalloc_process_figures_are_exported() {
    let text = AllocatorCollector::global().render();
    for name in ["allocated", "active", "metadata", "resident", "mapped", "retained"] {
        assert!(text.contains(&format!("\ntensormem_jemalloc_{name}_bytes ")), "missing {name}:\n{text}");
    }
    assert!(text.contains("tensormem_allocator_in_use_bytes{allocator=\"jemalloc\"}"));
    assert!(!text.contains("tensormem_allocator_limit_bytes{allocator=\"jemalloc\"}"), "no limit, no series");
}

#[test]
fn a_name_registered_at_two_priorities_exports_the_registration_that_serves() {
    let r = Arc::new(AllocatorRegistry::new());
    let builtin = AllocatorStats::build(|s| {
        s.bytes_in_use = 111;
        s.peak_bytes_in_use = 111;
    });
    let override_ = AllocatorStats::build(|s| {
        s.bytes_in_use = 222;
        s.peak_bytes_in_use = 222;
    });
    r.register("cpu", 0, Arc::new(Fixed(Some(builtin)))).unwrap();
    r.register("cpu", 100, Arc::new(Fixed(Some(override_)))).unwrap();
    let text = AllocatorCollector::for_registry(r).render();
    assert!(text.contains("tensormem_allocator_in_use_bytes{allocator=\"cpu\"} 222"), "{text}");
    assert!(text.contains("tensormem_allocator_peak_in_use_bytes{allocator=\"cpu\"} 222"), "{text}");
    assert!(!text.contains(" 111"), "the unused registration's figures were exported: {text}");
}

#[test]
fn reserved_bytes_are_exported_whenever_the_allocator_knows_them() {
    let r = Arc::new(AllocatorRegistry::new());
    // Knows what it holds, not its largest hole.
    let holding = AllocatorStats::build(|s| {
        s.bytes_in_use = 10;
        s.peak_bytes_in_use = 10;
        s.bytes_reserved = 4096;
        s.peak_bytes_reserved = 8192;
    });
    r.register("holding", 0, Arc::new(Fixed(Some(holding)))).unwrap();
    let text = AllocatorCollector::for_registry(r).render();
    assert!(text.contains("tensormem_allocator_reserved_bytes{allocator=\"holding\"} 4096"), "{text}");
    assert!(text.contains("tensormem_allocator_peak_reserved_bytes{allocator=\"holding\"} 8192"), "{text}");
}

#[test]
fn a_retry_allocator_over_one_without_stats_reports_none() {
    let retry = tensormem::RetryAllocator::new(Arc::new(NoStats));
    assert!(retry.stats().is_none(), "figures the allocator cannot answer are left out, not zeros");
    let r = Arc::new(AllocatorRegistry::new());
    r.register("nostats", 0, Arc::new(retry)).unwrap();
    let text = AllocatorCollector::for_registry(r).render();
    assert!(!text.contains("allocator=\"nostats\""), "{text}");
}

/// An allocator that keeps no stats.
#[derive(Debug)]
struct NoStats;

// SAFETY: forwarded to the system allocator.
unsafe impl Allocator for NoStats {
    fn name(&self) -> &str {
        "nostats"
    }
    fn allocate_raw(&self, layout: Layout, attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        tensormem::SystemAllocator::new().allocate_raw(layout, attrs)
    }
    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: forwarded with the caller's promise; the system allocator keeps no per-instance state.
        unsafe { tensormem::SystemAllocator::new().deallocate_raw(ptr, layout) }
    }
}
