//! A small process exporting its allocators' metrics: runs an allocation workload through the
//! global registry's allocators in a loop and serves `GET /metrics` on the given port.
//!
//! ```text
//! cargo run --release --features http --example exporter -- <port> [seconds] [active_seconds]
//! ```
//!
//! It runs for `seconds` (default: until killed) and listens on 127.0.0.1 only. The workload
//! runs for the first `active_seconds` (default: all along) and then holds its memory still, so
//! that what Prometheus scraped and what the process reports can be compared exactly.
//! Configure the allocators as usual (`TENSORMEM_ALLOC_CONF=bfc.memory_limit=64MiB` adds `bfc`).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use tensormem::telemetry::MetricsServer;
use tensormem::{AllocationAttributes, Allocator, AllocatorRegistry};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(port) = args.next().and_then(|p| p.parse::<u16>().ok()) else {
        eprintln!("usage: exporter <port> [seconds]");
        return ExitCode::from(2);
    };
    let seconds = args.next().and_then(|s| s.parse::<u64>().ok());
    let active = args.next().and_then(|s| s.parse::<u64>().ok());
    run(port, seconds, active)
}

/// Serves on `port` for `seconds` (or until killed), the workload running for the first
/// `active` seconds (or all along).
pub fn run(port: u16, seconds: Option<u64>, active: Option<u64>) -> ExitCode {
    let server = match MetricsServer::start(("127.0.0.1", port)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("serving http://{}/metrics", server.local_addr());
    let registry = match AllocatorRegistry::global().try_get() {
        Ok(_) => AllocatorRegistry::global(),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let allocators: Vec<_> = registry.entries().into_iter().map(|e| e.allocator).collect();
    let start = Instant::now();
    let mut held: Vec<Vec<(std::ptr::NonNull<u8>, std::alloc::Layout)>> = vec![Vec::new(); allocators.len()];
    let mut round: usize = 0;
    while seconds.is_none_or(|s| start.elapsed() < Duration::from_secs(s)) {
        if active.is_some_and(|a| start.elapsed() >= Duration::from_secs(a)) {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        for (i, a) in allocators.iter().enumerate() {
            // Keep a working set that breathes: grow for a while, then free half.
            let size = 64 << ((round + i) % 12);
            let layout = std::alloc::Layout::from_size_align(size, 64).unwrap_or(std::alloc::Layout::new::<u64>());
            if let Ok(p) = a.allocate_raw(layout, &AllocationAttributes::NO_RETRY) {
                held[i].push((p, layout));
            }
            if held[i].len() > 64 {
                for (p, layout) in held[i].drain(..32) {
                    // SAFETY: allocated above on `a` with `layout`, freed once.
                    unsafe { a.deallocate_raw(p, layout) };
                }
            }
        }
        round += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    for (a, blocks) in allocators.iter().zip(held) {
        for (p, layout) in blocks {
            // SAFETY: as above.
            unsafe { a.deallocate_raw(p, layout) };
        }
    }
    drop(server);
    ExitCode::SUCCESS
}
