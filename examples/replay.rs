//! Replays allocation traces on every allocator and prints peak memory against what was requested,
//! fragmentation at the peak, failures and time per operation.
//!
//! ```text
//! cargo run --release --example replay [-- <trace.json>...]   # default: every trace in benches/traces
//! ```
//!
//! `use/req` is peak in use / peak requested (rounding and unsplit chunks), `resvd/req` peak
//! reserved / peak requested (all memory taken from the system). The BFC rows: `bfc` is the
//! default (`memory_limit` + `allow_growth`, nothing else set: expandable, need-sized growth,
//! 256-byte splits, first fit above 64 KiB, and on Linux a 4% peak headroom: the pages of large
//! free chunks trapped between live blocks move to where the region would grow); `bfc (no headroom)`
//! the same with `peak_headroom(None)` (reserved follows the placement, as with PyTorch's
//! expandable segments); `bfc (tensorflow)` is
//! TensorFlow's allocator (regions doubling from 2 MiB, its split rule, best fit). `pool over
//! system` is the default pool (its large blocks in transparent huge pages), `pool, 4 KiB pages`
//! the same with `huge_pages(false)`.

use std::sync::Arc;

use tensormem::{AllocationTrace, Allocator, BfcAllocator, PoolAllocator, ReplayReport, SystemAllocator, replay};

fn traces() -> Vec<String> {
    let given: Vec<String> = std::env::args().skip(1).collect();
    if !given.is_empty() {
        return given;
    }
    let mut all: Vec<String> = std::fs::read_dir("benches/traces")
        .map(|d| {
            d.filter_map(|e| e.ok()).map(|e| e.path().display().to_string()).filter(|p| p.ends_with(".json")).collect()
        })
        .unwrap_or_default();
    all.sort();
    all
}

type Subjects = Vec<(&'static str, Arc<dyn Allocator>)>;

fn subjects() -> Result<Subjects, Box<dyn std::error::Error>> {
    let system: Arc<dyn Allocator> = Arc::new(SystemAllocator::new());
    let mut v: Subjects = vec![("system", Arc::clone(&system))];
    #[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
    v.push(("jemalloc", Arc::new(tensormem::JemallocAllocator::new())));
    v.push(("bfc", Arc::new(BfcAllocator::builder().memory_limit(64 << 30).allow_growth(true).build()?)));
    v.push((
        "bfc (no headroom)",
        Arc::new(BfcAllocator::builder().memory_limit(64 << 30).allow_growth(true).peak_headroom(None).build()?),
    ));
    v.push((
        "bfc (tensorflow)",
        Arc::new(BfcAllocator::builder().memory_limit(64 << 30).allow_growth(true).tensorflow_policies().build()?),
    ));
    v.push(("pool over system", Arc::new(PoolAllocator::builder(system.clone()).build()?)));
    v.push(("pool, 4 KiB pages", Arc::new(PoolAllocator::builder(system).huge_pages(false).build()?)));
    Ok(v)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for path in traces() {
        let trace = AllocationTrace::from_json(&std::fs::read_to_string(&path)?)?;
        println!("\n{path}: {} events\n  {}", trace.events.len(), trace.description);
        println!("{}", ReplayReport::table_header());
        for (name, a) in subjects()? {
            println!("{}", replay(&trace, &*a).table_row(name));
        }
    }
    Ok(())
}
