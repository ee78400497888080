//! `tensormem tune`: a trace replayed over a grid of allocator configurations, ranked by how
//! much memory each reserves for what the trace asks, with the configuration line of the best.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use tensormem::{AllocConf, AllocationTrace, Allocator, ReplayReport, SystemAllocator, replay};

use crate::Outcome;
use crate::files::{self, FileKind};
use crate::output::sayln;

/// Options of `tensormem tune`.
#[derive(clap::Args, Debug)]
pub(crate) struct TuneArgs {
    /// The trace file (JSON, `tensormem::AllocationTrace`).
    trace: PathBuf,
    /// The speed bound: the recommendation is the configuration that reserves least among those
    /// at most this many times slower (ns per operation) than the fastest one, with no refusal.
    #[arg(long, default_value_t = 1.5)]
    max_slowdown: f64,
    /// Replays run at once (default: the machine's cores). The ns/op column is measured with
    /// that many replays sharing the machine; `--jobs 1` gives undisturbed timings.
    #[arg(long)]
    jobs: Option<usize>,
}

/// One configuration of the grid: the allocator it builds and its `TENSORMEM_ALLOC_CONF` items.
struct Candidate {
    allocator: &'static str,
    items: Vec<String>,
}

/// `bytes` as `TENSORMEM_ALLOC_CONF` writes sizes: the largest unit that divides it.
fn size_text(bytes: u64) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// The grid: BFC split policy, placement (first fit above 64 KiB or best fit), expandable or
/// not, growth granule, peak headroom and release threshold; pool rounding and limit.
fn grid(bfc_limit: u64) -> Vec<Candidate> {
    let mut grid = Vec::new();
    let limit = format!("bfc.memory_limit={}", size_text(bfc_limit));
    for split in ["pytorch", "tensorflow"] {
        for release in ["none", "1GiB"] {
            grid.push(Candidate {
                allocator: "bfc",
                items: vec![
                    limit.clone(),
                    format!("bfc.split={split}"),
                    "bfc.expandable=false".into(),
                    format!("bfc.release_threshold={release}"),
                ],
            });
        }
        for granule in ["2MiB", "20MiB"] {
            for headroom in ["none", "0.04"] {
                // Placement: first fit by address above 64 KiB (the default), or best fit always.
                for first_fit in ["64KiB", "none"] {
                    grid.push(Candidate {
                        allocator: "bfc",
                        items: vec![
                            limit.clone(),
                            format!("bfc.split={split}"),
                            format!("bfc.first_fit_above={first_fit}"),
                            "bfc.expandable=true".into(),
                            format!("bfc.growth_granule={granule}"),
                            format!("bfc.peak_headroom={headroom}"),
                        ],
                    });
                }
            }
        }
    }
    for rounding in ["power_of_two", "multiple:512", "exact"] {
        for size_limit in ["1GiB", "16GiB"] {
            grid.push(Candidate {
                allocator: "pool",
                items: vec![format!("pool.rounding={rounding}"), format!("pool.size_limit={size_limit}")],
            });
        }
    }
    grid
}

impl Candidate {
    fn line(&self) -> String {
        self.items.join(",")
    }

    fn build(&self) -> Result<Arc<dyn Allocator>, String> {
        let conf = AllocConf::parse(&self.line()).map_err(|e| e.to_string())?;
        Ok(match self.allocator {
            "bfc" => Arc::new(conf.build_bfc().map_err(|e| e.to_string())?),
            _ => Arc::new(conf.build_pool(Arc::new(SystemAllocator::new())).map_err(|e| e.to_string())?),
        })
    }
}

pub(crate) fn run(args: TuneArgs) -> Outcome {
    if !(args.max_slowdown >= 1.0 && args.max_slowdown.is_finite()) {
        return Err(format!("--max-slowdown must be a number of at least 1 (got {})", args.max_slowdown).into());
    }
    if args.jobs == Some(0) {
        return Err("--jobs must be at least 1".to_owned().into());
    }
    let text = files::read(&args.trace)?;
    files::expect(&args.trace, &text, FileKind::Trace)?;
    let trace = AllocationTrace::from_json(&text).map_err(|e| format!("{}: {e}", args.trace.display()))?;
    let conf = AllocConf::from_env().map_err(|e| e.to_string())?;
    let grid = grid(conf.bfc_limit());
    // Build every candidate first, so a configuration that cannot be built fails before any work.
    let subjects: Vec<Arc<dyn Allocator>> = grid.iter().map(Candidate::build).collect::<Result<_, _>>()?;
    sayln!("{}: {} events, {} configurations", args.trace.display(), trace.events.len(), grid.len());
    let jobs = args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let bar = crate::output::progress_bar(
        grid.len() as u64,
        "{spinner} replaying configurations [{bar:20}] {pos}/{len} {elapsed}",
    )?;
    let next = AtomicUsize::new(0);
    let mut results: Vec<Option<ReplayReport>> = (0..grid.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..jobs.min(grid.len()))
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Relaxed);
                        let Some(allocator) = subjects.get(i) else { break };
                        done.push((i, replay(&trace, &**allocator)));
                        bar.inc(1);
                    }
                    done
                })
            })
            .collect();
        for w in workers {
            // A replay does not panic on a refused allocation (it counts it); a panic here is a bug
            // in an allocator, and is reported as such.
            match w.join() {
                Ok(done) => done.into_iter().for_each(|(i, r)| results[i] = Some(r)),
                Err(_) => results.clear(),
            }
        }
    });
    bar.finish_and_clear();
    if results.len() != grid.len() {
        return Err("a replay panicked (see above): no ranking".to_owned().into());
    }
    let mut rows: Vec<(&Candidate, ReplayReport)> =
        grid.iter().zip(results).filter_map(|(c, r)| r.map(|r| (c, r))).collect();
    let key = |r: &ReplayReport| r.reserved_over_requested().unwrap_or(f64::INFINITY);
    rows.sort_by(|a, b| {
        (a.1.failed_allocations > 0)
            .cmp(&(b.1.failed_allocations > 0))
            .then(key(&a.1).total_cmp(&key(&b.1)))
            .then(a.1.ns_per_operation.total_cmp(&b.1.ns_per_operation))
    });
    let fastest = rows.iter().map(|r| r.1.ns_per_operation).fold(f64::INFINITY, f64::min);
    sayln!("rank allocator resvd/req use/req    ns/op failed  configuration");
    for (i, (c, r)) in rows.iter().enumerate() {
        let ratio = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
        sayln!(
            "{:>4} {:<9} {:>9} {:>7} {:>8.1} {:>6}  {}",
            i + 1,
            c.allocator,
            ratio(r.reserved_over_requested()),
            ratio(r.in_use_over_requested()),
            r.ns_per_operation,
            r.failed_allocations,
            c.items.iter().filter(|i| !i.starts_with("bfc.memory_limit=")).cloned().collect::<Vec<_>>().join(",")
        );
    }
    let bound = fastest * args.max_slowdown;
    let best = rows.iter().find(|(_, r)| r.failed_allocations == 0 && r.ns_per_operation <= bound);
    let Some((c, r)) = best else {
        return Err(format!(
            "no configuration replayed the trace without a refusal within {}x of the fastest ({fastest:.1} ns/op)",
            args.max_slowdown
        )
        .into());
    };
    sayln!(
        "best within {}x of the fastest ({fastest:.1} ns/op): {} at {:.3} reserved/requested, {:.1} ns/op",
        args.max_slowdown,
        c.allocator,
        key(r),
        r.ns_per_operation
    );
    sayln!("TENSORMEM_ALLOCATOR={} TENSORMEM_ALLOC_CONF={}", c.allocator, c.line());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_grid_line_parses_and_builds() {
        let grid = grid(8 << 30);
        assert_eq!(grid.len(), 26);
        for c in &grid {
            AllocConf::parse(&c.line()).unwrap_or_else(|e| panic!("{}: {e}", c.line()));
            c.build().unwrap_or_else(|e| panic!("{}: {e}", c.line()));
        }
        assert!(grid[0].line().starts_with("bfc.memory_limit=8GiB,"));
    }

    #[test]
    fn sizes_are_written_in_the_largest_unit_that_divides_them() {
        assert_eq!(size_text(8 << 30), "8GiB");
        assert_eq!(size_text(3 << 20), "3MiB");
        assert_eq!(size_text(1536 << 10), "1536KiB");
        assert_eq!(size_text(1000), "1000");
    }
}
