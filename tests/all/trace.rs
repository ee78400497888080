//! Trace recording, the trace file format and its bad inputs, the shipped trace, and replay.

use std::sync::Arc;

use tensormem::{
    AllocationTrace, AllocatorExt, BfcAllocator, PreparedTrace, SystemAllocator, TRACE_VERSION, TraceError, TraceEvent,
    TraceRecorder, replay,
};

const SHIPPED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/traces/transformer_inference.json");

#[test]
fn a_recorded_trace_round_trips_through_json() {
    let rec = TraceRecorder::new(Arc::new(SystemAllocator::new()), "unit");
    let a = rec.allocate::<u64>(100).unwrap();
    let b = rec.allocate::<u8>(3).unwrap();
    let z = rec.allocate::<u8>(0).unwrap(); // zero-size: not recorded
    // SAFETY: each freed once with its count.
    unsafe {
        rec.deallocate(a, 100);
        rec.deallocate(z, 0);
    }
    let trace = rec.trace();
    assert_eq!(trace.version, TRACE_VERSION);
    assert_eq!(trace.description, "unit");
    let shape: Vec<(u64, Option<(usize, usize)>)> = trace
        .events
        .iter()
        .map(|e| match *e {
            TraceEvent::Alloc(_, id, size, align) => (id, Some((size, align))),
            TraceEvent::Free(_, id) => (id, None),
        })
        .collect();
    assert_eq!(shape, vec![(1, Some((800, 8))), (2, Some((3, 1))), (1, None)]);
    assert!(trace.events.windows(2).all(|w| w[0].time_us() <= w[1].time_us()));
    let json = trace.to_json();
    assert_eq!(AllocationTrace::from_json(&json).unwrap(), trace);
    // SAFETY: freed once with its count.
    unsafe { rec.deallocate(b, 3) };
}

fn err(json: &str) -> String {
    AllocationTrace::from_json(json).unwrap_err().to_string()
}

#[test]
fn truncated_and_malformed_files_are_refused_clearly() {
    let good = r#"{"version":1,"description":"d","events":[[0,1,64,8],[1,1]]}"#;
    assert!(AllocationTrace::from_json(good).is_ok());
    let cut = &good[..good.len() - 5];
    let e = err(cut);
    assert!(e.starts_with("the trace ends early (a file cut short?)"), "{e}");
    assert!(e.contains("EOF"), "{e}");
    assert!(err("not json").starts_with("the trace is not valid JSON"));
    let three = err(r#"{"version":1,"description":"d","events":[[0,1,64]]}"#);
    assert!(
        three.contains("an event is [t_us, id, size, align] (an allocation) or [t_us, id] (a free), not 3 numbers"),
        "{three}"
    );
    assert!(!three.contains("untagged"), "{three}");
    let history = err(r#"{"version":1,"start_unix_ms":0,"capacity":8,"dropped":0,"events":[]}"#);
    assert!(history.starts_with("not a tensormem allocation trace"), "{history}");
    assert!(matches!(AllocationTrace::from_json(r#"{"version":1,"events":[]}"#), Err(TraceError::Json(_))));
    assert_eq!(
        err(r#"{"version":7,"description":"d","events":[]}"#),
        "trace version 7 is not supported (this reads version 1)"
    );
}

#[test]
fn events_that_break_the_rules_are_named() {
    let case = |events: &str| err(&format!(r#"{{"version":1,"description":"d","events":[{events}]}}"#));
    assert_eq!(case("[0,1,64,8],[1,2]"), "event 1 [1,2] is invalid: the id 2 was never allocated");
    assert_eq!(case("[0,1,64,8],[1,1],[2,1]"), "event 2 [2,1] is invalid: the id 1 was freed before");
    assert_eq!(case("[0,1,64,8],[1,1,64,8]"), "event 1 [1,1,64,8] is invalid: the id 1 was allocated before");
    assert_eq!(
        case("[5,1,64,8],[4,1]"),
        "event 1 [4,1] is invalid: its time 4 us is earlier than the event before (5 us)"
    );
    assert_eq!(case("[0,1,64,3]"), "event 0 [0,1,64,3] is invalid: the alignment 3 is not a power of two");
    assert_eq!(
        case("[0,1,9223372036854775807,4096]"),
        "event 0 [0,1,9223372036854775807,4096] is invalid: the size 9223372036854775807 rounded up to the \
         alignment 4096 passes isize::MAX (9223372036854775807)"
    );
}

// The generators of the shipped traces, compiled into this test: regenerating a trace runs no
// `cargo` and no other process.
#[path = "../../tools/transformer_trace.rs"]
#[allow(dead_code)]
mod transformer_trace;

#[path = "../../tools/kv_stress_trace.rs"]
#[allow(dead_code)]
mod kv_stress_trace;

#[test]
fn the_shipped_trace_is_a_transformer_inference_run() {
    let json = std::fs::read_to_string(SHIPPED).unwrap();
    assert!(json.len() < 2 << 20, "the shipped trace must stay under 2 MB ({} bytes)", json.len());
    let trace = AllocationTrace::from_json(&json).unwrap();
    assert!(trace.description.contains("transformer"));
    assert!(trace.allocations() > 20_000);
    // The first allocation (the token embedding, ~47 MiB) lives until the end.
    let TraceEvent::Alloc(_, first, size, _) = trace.events[0] else { panic!("starts with an allocation") };
    assert_eq!(size, 32_000 * 768 * 2);
    let freed_at = trace.events.iter().position(|e| matches!(e, TraceEvent::Free(_, id) if *id == first)).unwrap();
    assert!(freed_at > trace.events.len() * 9 / 10);
    // Sizes of many kinds, from tens of bytes to tens of MiB.
    let mut sizes: Vec<usize> = trace
        .events
        .iter()
        .filter_map(|e| if let TraceEvent::Alloc(_, _, s, _) = e { Some(*s) } else { None })
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    assert!(sizes.len() > 1000 && sizes[0] < 256 && *sizes.last().unwrap() > 32 << 20);
    // Regenerating gives the same file.
    assert!(transformer_trace::trace().to_json() == json, "tools/transformer_trace.rs no longer makes this file");
}

#[test]
fn replay_on_bfc_reports_peaks_close_to_what_was_requested() {
    let trace = AllocationTrace::from_json(&std::fs::read_to_string(SHIPPED).unwrap()).unwrap();
    let bfc = BfcAllocator::builder().memory_limit(2 << 30).allow_growth(true).build().unwrap();
    let r = replay(&trace, &bfc);
    assert_eq!(r.operations, trace.events.len());
    assert_eq!(r.failed_allocations, 0);
    assert!(r.peak_in_use >= r.peak_requested);
    assert!(r.peak_in_use as f64 <= r.peak_requested as f64 * 1.10, "{r:?}");
    // The memory target: peak reserved / peak in use <= 1.10 on this trace.
    assert!(r.peak_reserved as f64 / r.peak_in_use as f64 <= 1.10, "{r:?}");
    assert!(r.fragmentation_at_peak.is_some());
    assert!(r.ns_per_operation > 0.0);
    assert_eq!(tensormem::Allocator::stats(&bfc).unwrap().bytes_in_use, 0, "replay freed everything");
}

#[test]
fn replay_counts_refused_allocations_and_skips_their_frees() {
    let trace = AllocationTrace::from_json(
        r#"{"version":1,"description":"d","events":[[0,1,600000,8],[1,2,600000,8],[2,2],[3,1]]}"#,
    )
    .unwrap();
    let small = BfcAllocator::builder()
        .memory_limit(1 << 20)
        .split(tensormem::allocators::SplitPolicy::TensorFlow)
        .build()
        .unwrap();
    let r = replay(&trace, &small);
    assert_eq!(r.failed_allocations, 1);
    assert_eq!(r.peak_in_use, 1 << 20, "600 KB took the whole 1 MiB chunk (not split under 2x)");
}

#[test]
fn the_shipped_kv_cache_stress_is_regenerated_exactly() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/traces/kv_cache_stress.json");
    let json = std::fs::read_to_string(path).unwrap();
    let trace = AllocationTrace::from_json(&json).unwrap();
    assert!(trace.description.contains("KV caches growing by reallocation"));
    assert!(kv_stress_trace::trace().to_json() == json, "tools/kv_stress_trace.rs no longer makes this file");
}

#[test]
fn an_unvalidated_trace_with_duplicate_ids_replays_without_panic_or_leak() {
    use tensormem::{PreparedTrace, SystemAllocator};
    // Built in code, not read with from_json: id 1 allocated twice while live, id 2 freed twice,
    // id 9 freed though never allocated, a layout that cannot exist.
    let trace = AllocationTrace {
        version: tensormem::TRACE_VERSION,
        description: "bad".into(),
        events: vec![
            TraceEvent::Alloc(0, 1, 100, 8),
            TraceEvent::Alloc(1, 1, 200, 8),
            TraceEvent::Alloc(2, 2, 300, 8),
            TraceEvent::Free(3, 2),
            TraceEvent::Free(4, 2),
            TraceEvent::Free(5, 9),
            TraceEvent::Alloc(6, 3, 10, 3),
            TraceEvent::Free(7, 1),
        ],
    };
    assert!(trace.validate().is_err());
    let prepared = PreparedTrace::new(&trace);
    assert_eq!(prepared.len(), 4, "two allocations and their frees are replayable");
    let cpu = SystemAllocator::new();
    let r = replay(&trace, &cpu);
    assert_eq!((r.operations, r.failed_allocations, r.peak_requested), (4, 0, 400));
    let s = tensormem::Allocator::stats(&cpu).unwrap();
    // Three passes (measured, warm-up, timed) of two allocations each.
    assert_eq!((s.bytes_in_use, s.num_allocs, s.num_frees), (0, 6, 6), "nothing leaked, nothing freed twice");
}

#[test]
fn the_page_writing_replay_writes_one_byte_in_every_page_of_every_block_and_frees_them() {
    // One block of 5 pages and 100 bytes, and a one-byte block.
    let json = r#"{"version":1,"description":"pages","events":[[0,1,20580,256],[1,2,1,1],[2,1],[3,2]]}"#;
    let prepared = PreparedTrace::new(&AllocationTrace::from_json(json).unwrap());
    let bfc = BfcAllocator::builder().memory_limit(1 << 20).build().unwrap();
    let _ = prepared.run_timed_writing_pages(&bfc);
    let stats = tensormem::Allocator::stats(&bfc).unwrap();
    assert_eq!((stats.bytes_in_use, stats.num_allocs), (0, 2));
    // The BFC hands the same fresh (zero-filled) block out again, as the replay left it.
    let p = bfc.allocate::<u8>(20580).unwrap();
    // SAFETY: `p` holds 20,580 initialised bytes (fresh pages, then the replay's writes).
    let bytes = unsafe { core::slice::from_raw_parts(p.as_ptr(), 20580) };
    let written: Vec<usize> = bytes.iter().enumerate().filter(|(_, b)| **b == 1).map(|(i, _)| i).collect();
    assert_eq!(written, [0, 4096, 8192, 12288, 16384, 20480]);
    // SAFETY: freed once with its count.
    unsafe { bfc.deallocate(p, 20580) };
}
