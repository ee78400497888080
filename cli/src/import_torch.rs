//! `tensormem import-torch`: a PyTorch memory snapshot (`torch.cuda.memory._snapshot()` as
//! pickled by `_dump_snapshot`) turned into a tensormem trace, so that a workload recorded in
//! PyTorch can be replayed, tuned and drawn here.
//!
//! The snapshot is a plain dict; its `device_traces` holds, per device, the events recorded by
//! `_record_memory_history`: dicts with `action`, `addr`, `size`, `stream`, `time_us` (and
//! `frames`). The requests are its `alloc` and `free_requested` events (`free_completed` where a
//! trace has no `free_requested`): the program's own calls, before the caching allocator waits for
//! stream events. Segment events, OOMs and snapshots are the allocator's, not requests, and are
//! left out. Frees of blocks allocated before recording started are left out and counted.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde_pickle::{DeOptions, HashableValue, Value};
use tensormem::{AllocationTrace, TRACE_VERSION, TraceEvent};

use crate::Outcome;
use crate::output::sayln;

/// Options of `tensormem import-torch`.
#[derive(clap::Args, Debug)]
pub(crate) struct ImportArgs {
    /// The snapshot file (a pickle written by `torch.cuda.memory._dump_snapshot`).
    snapshot: PathBuf,
    /// Where to write the trace (JSON); an existing file only with --force.
    #[arg(short = 'o', long = "out")]
    out: PathBuf,
    /// The device whose trace to convert (its index in `device_traces`).
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Overwrite OUT if it exists.
    #[arg(long)]
    force: bool,
}

/// The alignment given to every allocation: PyTorch's blocks are multiples of 512 bytes and
/// start on 512-byte boundaries; the shipped traces ask for 256, what a BFC chunk is aligned to.
const ALIGN: usize = 256;

/// What the conversion found, for the summary line.
#[derive(Debug, Default, PartialEq, Eq)]
struct Counts {
    allocs: usize,
    frees: usize,
    /// Frees of blocks allocated before the recording started.
    unmatched_frees: usize,
    /// Events that are not requests (segments, OOMs, completed frees of requested ones, ...).
    skipped: usize,
}

fn key<'a>(d: &'a BTreeMap<HashableValue, Value>, k: &str) -> Option<&'a Value> {
    d.get(&HashableValue::String(k.to_owned()))
}

fn uint(v: &Value) -> Option<u64> {
    match v {
        Value::I64(n) => u64::try_from(*n).ok(),
        Value::Int(n) => u64::try_from(n).ok(),
        _ => None,
    }
}

/// The trace of device `device` in the unpickled `snapshot`, with what was counted; an error
/// names what is wrong and where.
fn convert(snapshot: &Value, device: usize) -> Result<(Vec<TraceEvent>, Counts), String> {
    let Value::Dict(top) = snapshot else {
        return Err("not a PyTorch memory snapshot: the pickle holds no dict".into());
    };
    let Some(Value::List(devices)) = key(top, "device_traces") else {
        return Err("not a PyTorch memory snapshot: no 'device_traces' list (record with \
                    torch.cuda.memory._record_memory_history before _dump_snapshot)"
            .into());
    };
    let Some(trace) = devices.get(device) else {
        return Err(format!("no device {device}: the snapshot has traces for {} device(s)", devices.len()));
    };
    let Value::List(events) = trace else {
        return Err(format!("device_traces[{device}] is not a list of events"));
    };
    // Which free marks a request: `free_requested` when the trace has it.
    let has_requested = events.iter().any(
        |e| matches!(e, Value::Dict(d) if matches!(key(d, "action"), Some(Value::String(a)) if a == "free_requested")),
    );
    let free_action = if has_requested { "free_requested" } else { "free_completed" };
    let mut out = Vec::new();
    let mut counts = Counts::default();
    let mut live: HashMap<u64, u64> = HashMap::new();
    let (mut t0, mut last) = (None, 0u64);
    for (i, e) in events.iter().enumerate() {
        let at = || format!("device_traces[{device}][{i}]");
        let Value::Dict(d) = e else { return Err(format!("{}: an event is a dict, not {e:?}", at())) };
        let Some(Value::String(action)) = key(d, "action") else {
            return Err(format!("{}: no 'action' string", at()));
        };
        let field = |name: &str| {
            key(d, name)
                .and_then(uint)
                .ok_or_else(|| format!("{}: '{action}' has no non-negative integer '{name}'", at()))
        };
        let time = field("time_us")?;
        let start = *t0.get_or_insert(time);
        let t = time
            .checked_sub(start)
            .filter(|&t| t >= last)
            .ok_or_else(|| format!("{}: time_us {time} is earlier than the event before it", at()))?;
        last = t;
        if action == "alloc" {
            let (addr, size) = (field("addr")?, field("size")?);
            let size = usize::try_from(size).map_err(|_| format!("{}: size {size} does not fit this machine", at()))?;
            let id = counts.allocs as u64 + 1;
            if live.insert(addr, id).is_some() {
                return Err(format!("{}: a block is allocated at {addr:#x}, which is already live", at()));
            }
            out.push(TraceEvent::Alloc(t, id, size, ALIGN));
            counts.allocs += 1;
        } else if action == free_action {
            match live.remove(&field("addr")?) {
                Some(id) => {
                    out.push(TraceEvent::Free(t, id));
                    counts.frees += 1;
                }
                None => counts.unmatched_frees += 1,
            }
        } else {
            counts.skipped += 1;
        }
    }
    Ok((out, counts))
}

pub(crate) fn run(args: ImportArgs) -> Outcome {
    if crate::same_file(&args.snapshot, &args.out) {
        return Err(
            format!("{} is the snapshot being read: choose another file for the trace", args.out.display()).into()
        );
    }
    if args.out.is_file() && !args.force {
        return Err(
            format!("{} exists: pass --force to overwrite it, or choose another file", args.out.display()).into()
        );
    }
    let file = |e: &dyn std::fmt::Display| format!("{}: {e}", args.snapshot.display());
    let bytes = std::fs::read(&args.snapshot).map_err(|e| file(&e))?;
    // Data only: a pickle that names a class or a function (anything but plain containers,
    // numbers and strings) is refused, never run.
    let snapshot = serde_pickle::value_from_slice(&bytes, DeOptions::new())
        .map_err(|e| file(&format!("not a readable pickle of plain data ({e})")))?;
    let (events, counts) = convert(&snapshot, args.device).map_err(|e| file(&e))?;
    let description = format!(
        "imported from the PyTorch memory snapshot {}, device {}: {} allocations, {} frees{}",
        file_name(&args.snapshot),
        args.device,
        counts.allocs,
        counts.frees,
        if counts.unmatched_frees > 0 {
            format!(" ({} frees of blocks allocated before the recording left out)", counts.unmatched_frees)
        } else {
            String::new()
        }
    );
    let trace = AllocationTrace { version: TRACE_VERSION, description, events };
    trace.validate().map_err(|e| file(&e))?;
    std::fs::write(&args.out, trace.to_json()).map_err(|e| format!("cannot write {}: {e}", args.out.display()))?;
    sayln!(
        "{}: {} events of device {} -> {} ({} allocations, {} frees; {} other events left out)",
        args.snapshot.display(),
        counts.allocs + counts.frees + counts.unmatched_frees + counts.skipped,
        args.device,
        args.out.display(),
        counts.allocs,
        counts.frees,
        counts.skipped + counts.unmatched_frees
    );
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(action: &str, addr: i64, size: i64, t: i64) -> Value {
        let mut d = BTreeMap::new();
        for (k, v) in [
            ("action", Value::String(action.into())),
            ("addr", Value::I64(addr)),
            ("size", Value::I64(size)),
            ("time_us", Value::I64(t)),
            ("stream", Value::I64(0)),
        ] {
            d.insert(HashableValue::String(k.into()), v);
        }
        Value::Dict(d)
    }

    fn snapshot(events: Vec<Value>) -> Value {
        let mut d = BTreeMap::new();
        d.insert(HashableValue::String("device_traces".into()), Value::List(vec![Value::List(events)]));
        Value::Dict(d)
    }

    #[test]
    fn requests_become_events_and_the_rest_is_counted() {
        let s = snapshot(vec![
            ev("segment_alloc", 0x1000, 1 << 20, 100),
            ev("free_requested", 0x9000, 0, 101), // allocated before the recording
            ev("alloc", 0x1000, 512, 103),
            ev("alloc", 0x1200, 1024, 105),
            ev("free_requested", 0x1000, 0, 110),
            ev("free_completed", 0x1000, 0, 111),
            ev("alloc", 0x1000, 256, 120), // the address again, after its free
            ev("oom", 0, 1 << 40, 130),
        ]);
        let (events, counts) = convert(&s, 0).unwrap();
        assert_eq!(
            events,
            [
                TraceEvent::Alloc(3, 1, 512, ALIGN),
                TraceEvent::Alloc(5, 2, 1024, ALIGN),
                TraceEvent::Free(10, 1),
                TraceEvent::Alloc(20, 3, 256, ALIGN)
            ]
        );
        assert_eq!(counts, Counts { allocs: 3, frees: 1, unmatched_frees: 1, skipped: 3 });
    }

    #[test]
    fn without_free_requested_the_completed_frees_count() {
        let s = snapshot(vec![ev("alloc", 0x1000, 512, 0), ev("free_completed", 0x1000, 0, 4)]);
        assert_eq!(convert(&s, 0).unwrap().0, [TraceEvent::Alloc(0, 1, 512, ALIGN), TraceEvent::Free(4, 1)]);
    }

    #[test]
    fn bad_snapshots_say_what_is_wrong_and_where() {
        let err = |s: Value, device| convert(&s, device).unwrap_err();
        assert!(err(Value::List(vec![]), 0).contains("holds no dict"));
        assert!(err(Value::Dict(BTreeMap::new()), 0).contains("no 'device_traces' list"));
        assert!(err(snapshot(vec![]), 3).contains("no device 3: the snapshot has traces for 1 device(s)"));
        let e = err(snapshot(vec![ev("alloc", 0x10, 512, 5), ev("alloc", 0x10, 512, 6)]), 0);
        assert!(e.contains("device_traces[0][1]: a block is allocated at 0x10, which is already live"), "{e}");
        let e = err(snapshot(vec![ev("alloc", 0x10, 512, 5), ev("alloc", 0x20, 512, 4)]), 0);
        assert!(e.contains("device_traces[0][1]: time_us 4 is earlier"), "{e}");
        let e = err(snapshot(vec![ev("alloc", 0x10, -5, 5)]), 0);
        assert!(e.contains("device_traces[0][0]: 'alloc' has no non-negative integer 'size'"), "{e}");
        assert!(err(snapshot(vec![Value::I64(3)]), 0).contains("an event is a dict"));
    }
}
