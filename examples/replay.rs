//! Replays an allocation trace on every allocator and prints peak memory, fragmentation at the
//! peak, failures and time per operation.
//!
//! ```text
//! cargo run --release --example replay [-- <trace.json>]   # default: the shipped transformer trace
//! ```

use std::sync::Arc;

use tensormem::{
    AllocationTrace, Allocator, BfcAllocator, ByteSize, PoolAllocator, ReplayReport, SystemAllocator, replay,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| "benches/traces/transformer_inference.json".to_owned());
    let trace = AllocationTrace::from_json(&std::fs::read_to_string(&path)?)?;
    println!("{path}: {} events, {}", trace.events.len(), trace.description);
    let system: Arc<dyn Allocator> = Arc::new(SystemAllocator::new());
    let mut subjects: Vec<(&str, Arc<dyn Allocator>)> = vec![("system", Arc::clone(&system))];
    #[cfg(feature = "jemalloc")]
    subjects.push(("jemalloc", Arc::new(tensormem::JemallocAllocator::new())));
    subjects
        .push(("bfc (growth)", Arc::new(BfcAllocator::builder().memory_limit(2 << 30).allow_growth(true).build()?)));
    subjects.push(("bfc (1 GiB region)", Arc::new(BfcAllocator::builder().memory_limit(1 << 30).build()?)));
    subjects.push(("pool over system", Arc::new(PoolAllocator::builder(system).size_limit(256 << 20).build()?)));
    println!(
        "{:<20} {:>12} {:>12} {:>12} {:>9} {:>9} {:>7} {:>9} {:>12}",
        "allocator",
        "requested",
        "peak in use",
        "peak resvd",
        "resvd/use",
        "frag@peak",
        "failed",
        "ns/op",
        "page faults"
    );
    for (name, a) in subjects {
        let r: ReplayReport = replay(&trace, &*a);
        println!(
            "{name:<20} {:>12} {:>12} {:>12} {:>9} {:>9} {:>7} {:>9.1} {:>12}",
            ByteSize(r.peak_requested).to_string(),
            ByteSize(r.peak_in_use).to_string(),
            ByteSize(r.peak_reserved).to_string(),
            if r.peak_reserved > 0 {
                format!("{:.3}", r.peak_reserved as f64 / r.peak_in_use as f64)
            } else {
                "-".into()
            },
            r.fragmentation_at_peak.map_or("-".into(), |f| format!("{f:.3}")),
            r.failed_allocations,
            r.ns_per_operation,
            r.minor_page_faults.map_or("-".into(), |f| f.to_string())
        );
    }
    Ok(())
}
