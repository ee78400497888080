//! `tensormem replay`: a recorded allocation trace replayed on fresh allocators.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tensormem::{AllocConf, AllocationTrace, Allocator, BfcAllocator, ReplayReport, SystemAllocator, replay};

use crate::Outcome;

/// Options of `tensormem replay`.
#[derive(clap::Args, Debug)]
pub(crate) struct ReplayArgs {
    /// The trace file (JSON, `tensormem::AllocationTrace`).
    trace: PathBuf,
    /// Allocators to replay on (repeatable): system, jemalloc, pool, bfc, bfc-tensorflow, and
    /// cuda:N (a BFC over device N's expandable memory; feature `cuda`).
    /// Default: all. Pool and bfc honour TENSORMEM_ALLOC_CONF (bfc without it: a 64 GiB
    /// limit, growing on demand).
    #[arg(long = "allocator")]
    allocators: Vec<String>,
}

const NAMES: [&str; 5] = ["system", "jemalloc", "pool", "bfc", "bfc-tensorflow"];

/// A fresh allocator for `name`.
fn make(name: &str, conf: &AllocConf) -> Result<Arc<dyn Allocator>, String> {
    let err = |e: &dyn std::fmt::Display| format!("cannot build allocator '{name}': {e}");
    Ok(match name {
        "system" | "cpu" => Arc::new(SystemAllocator::new()),
        #[cfg(not(target_env = "msvc"))]
        "jemalloc" => Arc::new(tensormem::JemallocAllocator::new()),
        "pool" => Arc::new(conf.build_pool(Arc::new(SystemAllocator::new())).map_err(|e| err(&e))?),
        "bfc" if conf.configures_bfc() => Arc::new(conf.build_bfc().map_err(|e| err(&e))?),
        // Not configured: the default BFC with room to grow, as `examples/replay` uses.
        "bfc" => {
            Arc::new(BfcAllocator::builder().memory_limit(64 << 30).allow_growth(true).build().map_err(|e| err(&e))?)
        }
        "bfc-tensorflow" => Arc::new(
            BfcAllocator::builder()
                .memory_limit(64 << 30)
                .allow_growth(true)
                .tensorflow_policies()
                .build()
                .map_err(|e| err(&e))?,
        ),
        other if other.starts_with("cuda:") => return device(other, conf),
        other => return Err(format!("unknown allocator '{other}' (known: {}, cuda:N)", NAMES.join(", "))),
    })
}

/// A BFC over expandable memory of device N, limited as `cuda:N` in the registry.
#[cfg(feature = "cuda")]
fn device(name: &str, conf: &AllocConf) -> Result<Arc<dyn Allocator>, String> {
    use tensormem::allocators::cuda::{CudaDevice, CudaSubAllocator};
    let ordinal: u32 = name["cuda:".len()..].parse().map_err(|_| format!("'{name}': expected cuda:<device number>"))?;
    let device = CudaDevice::open(ordinal).map_err(|e| format!("{name}: {e}"))?;
    let total = device.memory_info().map_err(|e| format!("{name}: {e}"))?.1;
    let bfc = BfcAllocator::builder()
        .name(name)
        .memory_limit(conf.cuda_limit(total))
        .allow_growth(true)
        .sub_allocator(Arc::new(CudaSubAllocator::new(device)))
        .build()
        .map_err(|e| format!("{name}: {e}"))?;
    Ok(Arc::new(bfc))
}

#[cfg(not(feature = "cuda"))]
fn device(name: &str, _conf: &AllocConf) -> Result<Arc<dyn Allocator>, String> {
    Err(format!(
        "'{name}': this tensormem was built without the cuda feature (cargo run -p tensormem-cli --features cuda)"
    ))
}

pub(crate) fn run(args: ReplayArgs) -> Outcome {
    let text =
        std::fs::read_to_string(&args.trace).map_err(|e| format!("cannot read {}: {e}", args.trace.display()))?;
    let trace = AllocationTrace::from_json(&text).map_err(|e| format!("{}: {e}", args.trace.display()))?;
    let conf = AllocConf::from_env().map_err(|e| e.to_string())?;
    let names: Vec<String> =
        if args.allocators.is_empty() { NAMES.iter().map(|s| (*s).to_owned()).collect() } else { args.allocators };
    // Build every allocator first, so a bad name fails before any work.
    let subjects: Vec<(String, Arc<dyn Allocator>)> =
        names.iter().map(|n| make(n, &conf).map(|a| (n.clone(), a))).collect::<Result<_, _>>()?;
    println!("{}: {} events\n  {}", args.trace.display(), trace.events.len(), trace.description);
    let bar = ProgressBar::new(subjects.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} replaying on {msg} [{bar:20}] {pos}/{len}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(100));
    let mut rows = Vec::new();
    for (name, allocator) in &subjects {
        bar.set_message(name.clone());
        rows.push((name, replay(&trace, &**allocator)));
        bar.inc(1);
    }
    bar.finish_and_clear();
    println!("{}", ReplayReport::table_header());
    for (name, r) in rows {
        println!("{}", r.table_row(name));
    }
    Ok(())
}
