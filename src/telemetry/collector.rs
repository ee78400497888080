//! [`AllocatorCollector`]: a `prometheus` collector that reads every allocator of an
//! [`AllocatorRegistry`] when Prometheus scrapes, and adds nothing to the allocation path.

use std::collections::HashMap;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

use crate::AllocatorRegistry;
use crate::allocators::AllocatorStats;
use crate::telemetry::global_alloc;

/// How a family's value is read from the stats; `None` leaves the allocator out of the family.
type Reader = fn(&AllocatorStats) -> Option<f64>;

/// The per-allocator families: name, help, counter (else gauge), reader.
const FAMILIES: [(&str, &str, bool, Reader); 12] = [
    ("tensormem_allocator_in_use_bytes", "Bytes handed out and not yet freed.", false, |s| Some(s.bytes_in_use as f64)),
    (
        "tensormem_allocator_peak_in_use_bytes",
        "Highest bytes in use since start or the last clear_stats.",
        false,
        |s| Some(s.peak_bytes_in_use as f64),
    ),
    ("tensormem_allocator_reserved_bytes", "Bytes held from backing memory (caching allocators only).", false, |s| {
        knows_reserve(s).then_some(s.bytes_reserved as f64)
    }),
    ("tensormem_allocator_peak_reserved_bytes", "Highest bytes reserved (caching allocators only).", false, |s| {
        knows_reserve(s).then_some(s.peak_bytes_reserved as f64)
    }),
    ("tensormem_allocator_limit_bytes", "Most bytes the allocator may hand out.", false, |s| {
        s.bytes_limit.map(|l| l as f64)
    }),
    (
        "tensormem_allocator_largest_allocation_bytes",
        "Largest single allocation since start or the last clear_stats.",
        false,
        |s| Some(s.largest_alloc_size as f64),
    ),
    (
        "tensormem_allocator_largest_free_block_bytes",
        "Largest block available without taking more backing memory.",
        false,
        |s| s.largest_free_block_bytes.map(|b| b as f64),
    ),
    (
        "tensormem_allocator_fragmentation_ratio",
        "(free bytes - largest free block) / free bytes of the reserved memory.",
        false,
        |s| s.fragmentation,
    ),
    ("tensormem_allocator_allocations_total", "Allocations granted.", true, |s| Some(s.num_allocs as f64)),
    ("tensormem_allocator_deallocations_total", "Allocations freed.", true, |s| Some(s.num_frees as f64)),
    ("tensormem_allocator_retries_total", "Allocations that waited for memory and tried again.", true, |s| {
        Some(s.num_alloc_retries as f64)
    }),
    ("tensormem_allocator_ooms_total", "Allocations refused for lack of memory or for the limit.", true, |s| {
        Some(s.num_ooms as f64)
    }),
];

/// Whether an allocator reports what it holds from its backing memory: a caching allocator
/// (it knows its largest free block, or has held something). Plain allocators report 0.
fn knows_reserve(s: &AllocatorStats) -> bool {
    s.largest_free_block_bytes.is_some() || s.bytes_reserved > 0 || s.peak_bytes_reserved > 0
}

/// How a jemalloc family's value is read.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
type JemallocReader = fn(&crate::JemallocStats) -> u64;

/// jemalloc's process-wide families.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
const JEMALLOC: [(&str, &str, JemallocReader); 6] = [
    ("tensormem_jemalloc_allocated_bytes", "Bytes allocated by the application from jemalloc.", |s| s.allocated),
    ("tensormem_jemalloc_active_bytes", "Bytes in jemalloc's active pages.", |s| s.active),
    ("tensormem_jemalloc_metadata_bytes", "Bytes of jemalloc's own metadata.", |s| s.metadata),
    ("tensormem_jemalloc_resident_bytes", "Bytes in physically resident pages mapped by jemalloc.", |s| s.resident),
    ("tensormem_jemalloc_mapped_bytes", "Bytes in active extents mapped by jemalloc.", |s| s.mapped),
    ("tensormem_jemalloc_retained_bytes", "Bytes of virtual memory jemalloc retains for reuse.", |s| s.retained),
];

const PANICS: (&str, &str) = (
    "tensormem_collector_stats_panics_total",
    "Panics of an allocator's stats() during scrapes, one per allocator per scrape (its figures were left out).",
);

/// The registry a collector reads.
#[derive(Clone)]
enum Source {
    Global,
    Shared(Arc<AllocatorRegistry>),
}

/// The series name of the process heap, and the one used when an allocator is registered under
/// it.
const HEAP_NAMES: [&str; 2] = ["global", "global_heap"];

/// Reads every allocator of a registry at scrape time into the `tensormem_allocator_*` metric
/// families (label `allocator` = the registry name; a name registered at several priorities is
/// the registration [`get_by_name`](AllocatorRegistry::get_by_name) serves, the highest), plus
/// jemalloc's process figures, and, for the global registry (or when asked with
/// [`with_process_heap`](Self::with_process_heap)), the process-wide heap of a
/// [`GlobalAllocator`](crate::GlobalAllocator) when installed, as allocator
/// `global` (`global_heap` if an allocator is registered as `global`).
///
/// An allocator whose `stats()` panics is left out of that scrape and counted in
/// `tensormem_collector_stats_panics_total`; the others are still reported.
///
/// ```
/// use std::sync::Arc;
/// use tensormem::telemetry::AllocatorCollector;
/// use tensormem::{AllocatorExt, AllocatorRegistry, SystemAllocator};
///
/// let registry = Arc::new(AllocatorRegistry::new());
/// registry.register("cpu", 0, Arc::new(SystemAllocator::new()))?;
/// let p = registry.get().allocate::<u8>(4096)?;
///
/// let collector = AllocatorCollector::for_registry(Arc::clone(&registry));
/// let text = collector.render();
/// assert!(text.contains("tensormem_allocator_in_use_bytes{allocator=\"cpu\"} 4096"));
///
/// // Or into your own prometheus::Registry:
/// let prom = prometheus::Registry::new();
/// prom.register(Box::new(collector))?;
/// assert!(prom.gather().iter().any(|f| f.name() == "tensormem_allocator_allocations_total"));
/// // SAFETY: `p` came from `allocate::<u8>(4096)` on this allocator.
/// unsafe { registry.get().deallocate(p, 4096) };
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AllocatorCollector {
    source: Source,
    descs: Vec<Desc>,
    panics: Arc<AtomicU64>,
    process_heap: bool,
    /// Export per-scope series for this many tags (largest peak first); 0: none.
    scope_top: usize,
}

/// Per-scope families (label `scope`), exported when asked with
/// [`AllocatorCollector::with_scope_metrics`].
const SCOPE_FAMILIES: [(&str, &str, bool); 3] = [
    ("tensormem_scope_in_use_bytes", "Bytes allocated under the scope and not yet freed.", false),
    ("tensormem_scope_peak_in_use_bytes", "Highest bytes in use under the scope.", false),
    ("tensormem_scope_allocations_total", "Allocations made under the scope.", true),
];

impl AllocatorCollector {
    /// A collector of the [global registry](AllocatorRegistry::global), with the process heap.
    pub fn global() -> Self {
        Self::new(Source::Global, true)
    }

    /// A collector of `registry` (without the process heap: see
    /// [`with_process_heap`](Self::with_process_heap)).
    pub fn for_registry(registry: Arc<AllocatorRegistry>) -> Self {
        Self::new(Source::Shared(registry), false)
    }

    /// Adds (or leaves out) the process heap of an installed
    /// [`GlobalAllocator`](crate::GlobalAllocator).
    #[must_use]
    pub fn with_process_heap(mut self, on: bool) -> Self {
        self.process_heap = on;
        self
    }

    /// Exports per-scope series (label `scope`) for the `top` tags with the largest peak,
    /// the rest summed under `scope="other"`; 0 (the default) exports none. Bounded so that
    /// the label's values stay few, as Prometheus wants.
    #[must_use]
    pub fn with_scope_metrics(mut self, top: usize) -> Self {
        self.scope_top = top;
        if top > 0 && !self.descs.iter().any(|d| d.fq_name == SCOPE_FAMILIES[0].0) {
            for (name, help, _) in SCOPE_FAMILIES {
                self.descs.extend(Desc::new(name.into(), help.into(), vec!["scope".into()], HashMap::new()));
            }
        }
        self
    }

    fn new(source: Source, process_heap: bool) -> Self {
        let mut descs = Vec::new();
        for (name, help, _, _) in FAMILIES {
            descs.extend(Desc::new(name.into(), help.into(), vec!["allocator".into()], HashMap::new()));
        }
        descs.extend(Desc::new(PANICS.0.into(), PANICS.1.into(), vec![], HashMap::new()));
        #[cfg(feature = "cuda")]
        for (name, help) in DEVICE_FAMILIES {
            descs.extend(Desc::new(name.into(), help.into(), vec!["device".into()], HashMap::new()));
        }
        #[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
        for (name, help, _) in JEMALLOC {
            descs.extend(Desc::new(name.into(), help.into(), vec![], HashMap::new()));
        }
        Self { source, descs, panics: Arc::new(AtomicU64::new(0)), process_heap, scope_top: 0 }
    }

    fn registry(&self) -> &AllocatorRegistry {
        match &self.source {
            Source::Global => AllocatorRegistry::global(),
            Source::Shared(r) => r,
        }
    }

    /// Every allocator's stats, by registry name (panicking ones left out and counted).
    fn read(&self) -> Vec<(String, AllocatorStats)> {
        let registry = self.registry();
        let mut names: Vec<String> = Vec::new();
        for entry in registry.entries() {
            if !names.contains(&entry.name) {
                names.push(entry.name);
            }
        }
        let mut out = Vec::new();
        for name in &names {
            // One series per name: the registration `get_by_name` serves.
            let Some(allocator) = registry.get_by_name(name) else { continue };
            match catch_unwind(AssertUnwindSafe(|| allocator.stats())) {
                Ok(Some(stats)) => out.push((name.clone(), stats)),
                Ok(None) => {}
                Err(_) => {
                    self.panics.fetch_add(1, Relaxed);
                }
            }
        }
        if let Some(stats) = super::mapped_stats()
            && !names.iter().any(|n| n == "mmap")
        {
            out.push(("mmap".to_owned(), stats));
        }
        if self.process_heap {
            let free = HEAP_NAMES.iter().find(|n| !names.iter().any(|m| m == *n));
            if let (Some(name), Some(stats)) = (free, global_alloc::global_stats()) {
                out.push(((*name).to_owned(), stats));
            }
        }
        out
    }

    /// The text exposition (Prometheus format 0.0.4) of this collector's metrics.
    pub fn render(&self) -> String {
        let families = self.collect();
        prometheus::TextEncoder::new().encode_to_string(&families).unwrap_or_default()
    }
}

fn label(allocator: &str) -> Vec<LabelPair> {
    label_named("allocator", allocator)
}

fn label_named(name: &str, value: &str) -> Vec<LabelPair> {
    let mut l = LabelPair::default();
    l.set_name(name.to_owned());
    l.set_value(value.to_owned());
    vec![l]
}

/// Per device, the driver's total and free memory (`cuMemGetInfo`), label `device="cuda:N"`.
#[cfg(feature = "cuda")]
const DEVICE_FAMILIES: [(&str, &str); 2] = [
    ("tensormem_device_memory_total_bytes", "The device's memory, as the CUDA driver reports it."),
    ("tensormem_device_memory_free_bytes", "The device's free memory, as the CUDA driver reports it."),
];

#[cfg(feature = "cuda")]
fn device_families() -> Vec<MetricFamily> {
    let mut rows = Vec::new();
    for d in crate::device::devices() {
        if let Ok((free, total)) = d.memory_info() {
            rows.push((format!("cuda:{}", d.ordinal()), [total as f64, free as f64]));
        }
    }
    if rows.is_empty() {
        return Vec::new();
    }
    DEVICE_FAMILIES
        .iter()
        .enumerate()
        .map(|(k, (name, help))| {
            let metrics = rows.iter().map(|(dev, v)| sample(label_named("device", dev), v[k], false)).collect();
            family(name, help, false, metrics)
        })
        .collect()
}

/// The top `top` tags by peak, and the rest as `other`.
fn scope_families(top: usize) -> Vec<MetricFamily> {
    let tags = crate::tag_stats();
    let mut rows: Vec<(String, [f64; 3])> = Vec::new();
    let mut other = [0.0; 3];
    for (i, t) in tags.iter().enumerate() {
        let v = [t.bytes_in_use as f64, t.peak_bytes_in_use as f64, t.num_allocs as f64];
        if i < top {
            rows.push((t.tag.clone(), v));
        } else {
            other[0] += v[0];
            other[1] += v[1];
            other[2] += v[2];
        }
    }
    if tags.len() > top {
        rows.push(("other".to_owned(), other));
    }
    if rows.is_empty() {
        return Vec::new();
    }
    SCOPE_FAMILIES
        .iter()
        .enumerate()
        .map(|(k, (name, help, counter))| {
            let metrics = rows.iter().map(|(tag, v)| sample(label_named("scope", tag), v[k], *counter)).collect();
            family(name, help, *counter, metrics)
        })
        .collect()
}

fn family(name: &str, help: &str, counter: bool, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_owned());
    f.set_help(help.to_owned());
    f.set_field_type(if counter { MetricType::COUNTER } else { MetricType::GAUGE });
    f.set_metric(metrics);
    f
}

fn sample(labels: Vec<LabelPair>, value: f64, counter: bool) -> Metric {
    let mut m = Metric::from_label(labels);
    if counter {
        let mut c = Counter::default();
        c.set_value(value);
        m.set_counter(c);
    } else {
        let mut g = Gauge::default();
        g.set_value(value);
        m.set_gauge(g);
    }
    m
}

impl Collector for AllocatorCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let stats = self.read();
        let mut families = Vec::new();
        for (name, help, counter, read) in FAMILIES {
            let metrics: Vec<Metric> = stats
                .iter()
                .filter_map(|(allocator, s)| read(s).map(|v| sample(label(allocator), v, counter)))
                .collect();
            if !metrics.is_empty() {
                families.push(family(name, help, counter, metrics));
            }
        }
        if self.scope_top > 0 {
            families.extend(scope_families(self.scope_top));
        }
        #[cfg(feature = "cuda")]
        families.extend(device_families());
        let panics = self.panics.load(Relaxed) as f64;
        families.push(family(PANICS.0, PANICS.1, true, vec![sample(vec![], panics, true)]));
        #[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
        if let Ok(js) = crate::JemallocAllocator::jemalloc_stats() {
            for (name, help, read) in JEMALLOC {
                families.push(family(name, help, false, vec![sample(vec![], read(&js) as f64, false)]));
            }
        }
        families
    }
}

impl fmt::Debug for AllocatorCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AllocatorCollector")
            .field("registry", &if matches!(self.source, Source::Global) { "global" } else { "shared" })
            .field("stats_panics", &self.panics.load(Relaxed))
            .finish()
    }
}
