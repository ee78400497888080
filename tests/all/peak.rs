//! What was live at a history's peak and at any event, grouped by scope and by description.

use std::sync::Arc;

use tensormem::ByteSize;
use tensormem::allocators::observe::Action;
use tensormem::history::{HISTORY_VERSION, History, HistoryEvent, LiveGroup};

fn event(t: u64, action: Action, address: u64, size: u64, tag: Option<&str>, what: Option<&str>) -> HistoryEvent {
    HistoryEvent {
        time_ns: t,
        action,
        address,
        size,
        allocator: Arc::from("bfc"),
        tag: tag.map(str::to_owned),
        description: what.map(str::to_owned),
        backtrace: None,
    }
}

fn history(events: Vec<HistoryEvent>) -> History {
    History { version: HISTORY_VERSION, start_unix_ms: 0, capacity: 1000, dropped: 0, events }
}

/// An encoder step: weights live throughout, activations come and go; the peak is inside
/// layer 1, where two activations and its attention scratch are live with the weights.
fn encoder() -> History {
    use Action::{Alloc, Free, SegmentAlloc};
    history(vec![
        event(0, SegmentAlloc, 0x10_0000, 1 << 20, None, None),
        event(1, Alloc, 0x10_0000, 4000, Some("weights"), Some("tensor f32 [1000]")),
        event(2, Alloc, 0x20_0000, 800, Some("layer0"), Some("tensor f32 [200]")),
        event(3, Free, 0x20_0000, 800, None, None),
        event(4, Alloc, 0x30_0000, 800, Some("layer1"), Some("tensor f32 [200]")),
        event(5, Alloc, 0x40_0000, 800, Some("layer1"), Some("tensor f32 [200]")),
        event(6, Alloc, 0x50_0000, 1200, Some("layer1/attn"), None),
        event(7, Free, 0x50_0000, 1200, None, None),
        event(8, Alloc, 0x60_0000, 1200, Some("layer1/attn"), None), // as high again: not a new peak
        event(9, Free, 0x30_0000, 800, None, None),
        event(10, Free, 0x40_0000, 800, None, None),
        event(11, Free, 0x60_0000, 1200, None, None),
    ])
}

#[test]
fn the_peak_is_the_first_event_with_the_most_bytes_live() {
    let h = encoder();
    let peak = h.peak().expect("allocations were made");
    assert_eq!((peak.event, peak.time_ns, peak.bytes), (6, 6, 4000 + 800 + 800 + 1200));
    let sizes: Vec<(u64, u64)> = peak.allocations.iter().map(|a| (a.address, a.size)).collect();
    assert_eq!(sizes, [(0x10_0000, 4000), (0x30_0000, 800), (0x40_0000, 800), (0x50_0000, 1200)]);
    assert_eq!(peak.allocations[0].event, Some(1), "each names its alloc event, oldest first");
    assert_eq!(peak.allocations[0].time_ns, Some(1));
}

#[test]
fn the_peak_groups_by_scope_and_by_description() {
    let peak = encoder().peak().unwrap();
    let group = |key: Option<&str>, bytes, count| LiveGroup { key: key.map(str::to_owned), bytes, count };
    assert_eq!(
        peak.by_scope(),
        [group(Some("weights"), 4000, 1), group(Some("layer1"), 1600, 2), group(Some("layer1/attn"), 1200, 1)]
    );
    assert_eq!(
        peak.by_description(),
        [group(Some("tensor f32 [1000]"), 4000, 1), group(Some("tensor f32 [200]"), 1600, 2), group(None, 1200, 1)]
    );
}

#[test]
fn live_at_any_event_follows_allocs_and_frees() {
    let h = encoder();
    let at = |i| h.live_at(i).unwrap();
    assert_eq!((at(0).bytes, at(0).allocations.len()), (0, 0), "a segment is reserved, not live");
    assert_eq!(at(2).bytes, 4800);
    assert_eq!(at(3).bytes, 4000);
    assert_eq!(at(8).bytes, 6800);
    assert_eq!(at(11).bytes, 4000, "the weights outlive the step");
    assert_eq!(at(11).by_scope().len(), 1);
    assert!(h.live_at(12).is_none(), "no event 12");
}

#[test]
fn empty_histories_and_frees_of_unknown_blocks_have_no_peak_to_invent() {
    assert!(history(Vec::new()).peak().is_none());
    assert!(history(Vec::new()).live_at(0).is_none());
    // A free of a block allocated before recording started: nothing was live, nothing goes negative.
    let h = history(vec![event(0, Action::Free, 0x1000, 64, None, None)]);
    assert!(h.peak().is_none());
    assert_eq!(h.live_at(0).unwrap().bytes, 0);
    // The same address allocated twice (by two allocators): each free takes its own.
    let mut twice = vec![
        event(0, Action::Alloc, 0x1000, 10, None, None),
        event(1, Action::Alloc, 0x1000, 20, None, None),
        event(2, Action::Free, 0x1000, 10, None, None),
    ];
    twice[1].allocator = Arc::from("pool");
    let h = history(twice);
    assert_eq!(h.peak().unwrap().bytes, 30);
    assert_eq!(h.live_at(2).unwrap().allocations[0].allocator.as_ref(), "pool");
}

#[test]
fn a_block_from_before_the_history_is_live_until_its_free() {
    use Action::{Alloc, Free};
    // Recording started while a 64-byte block was live; it is freed at event 2.
    let h = history(vec![
        event(0, Alloc, 0x2000, 10, Some("step"), None),
        event(1, Alloc, 0x3000, 20, Some("step"), None),
        event(2, Free, 0x1000, 64, None, None),
        event(3, Alloc, 0x4000, 40, Some("step"), None),
    ]);
    let peak = h.peak().unwrap();
    assert_eq!((peak.event, peak.bytes), (1, 64 + 10 + 20));
    let old = &peak.allocations[0];
    assert_eq!((old.event, old.time_ns, old.address, old.size), (None, None, 0x1000, 64));
    assert_eq!(peak.by_scope()[0], LiveGroup { key: None, bytes: 64, count: 1 });
    assert_eq!(h.live_at(3).unwrap().bytes, 70, "gone after its free");
}

#[test]
fn the_timeline_page_shows_the_same_peak() {
    use Action::{Alloc, Free};
    for h in [
        encoder(),
        history(vec![
            event(0, Alloc, 0x2000, 10, None, None),
            event(1, Free, 0x1000, 5000, None, None),
            event(2, Alloc, 0x4000, 40, None, None),
        ]),
    ] {
        let page = tensormem::timeline::render_html(&h);
        let bytes = h.peak().unwrap().bytes;
        assert!(page.contains(&format!("peak in use {}", ByteSize(bytes))), "{bytes}");
    }
}
