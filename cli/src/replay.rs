//! `tensormem replay`: a recorded allocation trace replayed on fresh allocators.

use std::path::PathBuf;
use std::sync::Arc;

use tensormem::{AllocConf, AllocationTrace, Allocator, BfcAllocator, ByteSize, ReplayReport, SystemAllocator, replay};

use crate::Outcome;
use crate::files::{self, FileKind};
use crate::output::sayln;

/// Options of `tensormem replay`.
#[derive(clap::Args, Debug)]
pub(crate) struct ReplayArgs {
    /// The trace file (JSON, `tensormem::AllocationTrace`).
    trace: PathBuf,
    /// Allocators to replay on (repeatable): system, jemalloc, pool, bfc, bfc-tensorflow, and
    /// cuda:N (a BFC over device N's expandable memory; feature `cuda`).
    /// Default: all. Pool and bfc honour TENSORMEM_ALLOC_CONF; both BFCs are limited to
    /// bfc.memory_limit, else to the machine's physical memory.
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
        "bfc" => Arc::new(conf.build_bfc().map_err(|e| err(&e))?),
        "bfc-tensorflow" => Arc::new(
            BfcAllocator::builder()
                .memory_limit(conf.bfc_limit())
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
    let text = files::read(&args.trace)?;
    files::expect(&args.trace, &text, FileKind::Trace)?;
    let trace = AllocationTrace::from_json(&text).map_err(|e| format!("{}: {e}", args.trace.display()))?;
    let conf = AllocConf::from_env().map_err(|e| e.to_string())?;
    let names: Vec<String> =
        if args.allocators.is_empty() { NAMES.iter().map(|s| (*s).to_owned()).collect() } else { args.allocators };
    // Build every allocator first, so a bad name fails before any work.
    let subjects: Vec<(String, Arc<dyn Allocator>)> =
        names.iter().map(|n| make(n, &conf).map(|a| (n.clone(), a))).collect::<Result<_, _>>()?;
    sayln!("{}: {} events\n  {}", args.trace.display(), trace.events.len(), trace.description);
    if conf.bfc_memory_limit.is_none() && names.iter().any(|n| n.starts_with("bfc")) {
        sayln!(
            "  bfc: no bfc.memory_limit in TENSORMEM_ALLOC_CONF; limited to the machine's memory, {}",
            ByteSize(conf.bfc_limit())
        );
    }
    let bar =
        crate::output::progress_bar(subjects.len() as u64, "{spinner} replaying on {msg} [{bar:20}] {pos}/{len}")?;
    let mut rows = Vec::new();
    for (name, allocator) in &subjects {
        bar.set_message(name.clone());
        rows.push((name, replay(&trace, &**allocator)));
        bar.inc(1);
    }
    bar.finish_and_clear();
    sayln!("{}", ReplayReport::table_header());
    let memory = tensormem::allocators::physical_memory();
    let mut lazy = Vec::new();
    for (name, r) in &rows {
        sayln!("{}", r.table_row(name));
        if r.peak_in_use > memory {
            lazy.push(format!("{name} ({})", ByteSize(r.peak_in_use)));
        }
    }
    sayln!("{}", ReplayReport::table_legend());
    if !lazy.is_empty() {
        sayln!(
            "note: {} held more than this machine's {} at the peak: the replay never writes to its blocks, so the \
             system gave addresses whose pages were never touched; a program that used them would not fit",
            lazy.join(", "),
            ByteSize(memory)
        );
    }
    Ok(())
}
