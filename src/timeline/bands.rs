//! From a [`History`] to what the page draws: one band per large allocation, the rest summed into
//! an "other" series, the reserved (segment) total, and per-tag figures.

use std::collections::HashMap;

use serde::Serialize;

use crate::allocators::observe::Action;
use crate::history::History;

/// Allocations drawn as bands of their own; smaller ones are summed into "other".
pub(crate) const MAX_BANDS: usize = 2000;
/// Points kept of the "other" and reserved series (each bucket keeps its largest value).
const MAX_SERIES_POINTS: usize = 4000;

/// One allocation: `[start, end, size, tag, allocator, description, backtrace, address,
/// start_ns, end_ns]` with indices into the page's string tables (-1: none) and `end` the event
/// index of its free (the event count if still live).
pub(crate) type BandRow = (u64, u64, u64, i64, i64, i64, i64, u64, u64, u64);

#[derive(Serialize)]
pub(crate) struct PageData {
    /// Events in the history (the x axis runs over event indices).
    pub(crate) events: u64,
    /// Event times (ns) sampled at `time_step` intervals, for the time shown on hover.
    pub(crate) times: Vec<u64>,
    pub(crate) time_step: u64,
    pub(crate) bands: Vec<BandRow>,
    /// `[x, bytes]` of the allocations not drawn as bands.
    pub(crate) other: Vec<(u64, u64)>,
    /// How many allocations "other" sums.
    pub(crate) other_count: u64,
    /// `[x, bytes]` of segments taken from the allocators' sources.
    pub(crate) reserved: Vec<(u64, u64)>,
    pub(crate) ooms: Vec<u64>,
    /// The event right after which the most bytes were live (where the page marks the peak).
    pub(crate) peak_event: Option<u64>,
    pub(crate) strings: Vec<String>,
    /// The most bytes live at once (shown in the page's summary line).
    #[serde(skip)]
    pub(crate) peak: u64,
}

/// Per-tag figures for the summary table.
pub(crate) struct TagRow {
    pub(crate) tag: String,
    pub(crate) allocations: u64,
    pub(crate) bytes: u64,
    pub(crate) peak: u64,
    pub(crate) live_at_end: u64,
}

struct Alloc {
    start: u64,
    end: u64,
    size: u64,
    event: Option<usize>,
    address: u64,
}

struct Strings {
    list: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn id(&mut self, s: Option<&str>) -> i64 {
        let Some(s) = s else { return -1 };
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.list.len() as i64;
        self.list.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

/// A step series from `(x, delta)` changes, at most `MAX_SERIES_POINTS` points (the largest
/// value of each bucket, so peaks survive).
fn series(mut deltas: Vec<(u64, i128)>, n: u64) -> Vec<(u64, u64)> {
    deltas.sort_by_key(|d| d.0);
    let mut points: Vec<(u64, u64)> = Vec::new();
    let mut level: i128 = 0;
    let mut i = 0;
    while i < deltas.len() {
        let x = deltas[i].0;
        while i < deltas.len() && deltas[i].0 == x {
            level += deltas[i].1;
            i += 1;
        }
        points.push((x, clamp(level)));
    }
    if points.len() <= MAX_SERIES_POINTS {
        return points;
    }
    let bucket = n.div_ceil(MAX_SERIES_POINTS as u64 / 2).max(1);
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut before = 0u64;
    let mut j = 0;
    while j < points.len() {
        let b = points[j].0 / bucket;
        let mut peak = before;
        let mut last = before;
        while j < points.len() && points[j].0 / bucket == b {
            peak = peak.max(points[j].1);
            last = points[j].1;
            j += 1;
        }
        // The bucket's peak over its width, then where it ended.
        out.push((b * bucket, peak));
        out.push(((b + 1) * bucket - 1, last));
        before = last;
    }
    out
}

/// A sum of sizes as the page shows it: negative sums (frees of blocks allocated before the
/// history) as 0, sums past `u64::MAX` (only a forged history has them) as `u64::MAX`, so that the
/// header and the chart show the same figure.
fn clamp(level: i128) -> u64 {
    u64::try_from(level.max(0)).unwrap_or(u64::MAX)
}

/// Lays out `history`.
pub(crate) fn page_data(history: &History) -> (PageData, Vec<TagRow>) {
    let n = history.events.len() as u64;
    let mut allocs: Vec<Alloc> = Vec::new();
    let mut open: HashMap<u64, usize> = HashMap::new();
    let mut reserved: Vec<(u64, i128)> = Vec::new();
    let mut ooms = Vec::new();
    for (i, e) in history.events.iter().enumerate() {
        let x = i as u64;
        match e.action {
            Action::Alloc => {
                if let Some(prev) = open.insert(e.address, allocs.len()) {
                    allocs[prev].end = x;
                }
                allocs.push(Alloc { start: x, end: n, size: e.size, event: Some(i), address: e.address });
            }
            Action::Free => match open.remove(&e.address) {
                Some(a) => allocs[a].end = x,
                // Allocated before the history starts: live from its beginning.
                None => allocs.push(Alloc { start: 0, end: x, size: e.size, event: None, address: e.address }),
            },
            Action::SegmentAlloc => reserved.push((x, i128::from(e.size))),
            Action::SegmentFree => reserved.push((x, -i128::from(e.size))),
            Action::Oom => ooms.push(x),
        }
    }
    // The largest allocations get bands of their own.
    let mut order: Vec<usize> = (0..allocs.len()).collect();
    order.sort_by(|&a, &b| allocs[b].size.cmp(&allocs[a].size).then(a.cmp(&b)));
    let (banded, rest) = order.split_at(order.len().min(MAX_BANDS));
    let mut banded = banded.to_vec();
    banded.sort_unstable();
    let mut strings = Strings { list: Vec::new(), index: HashMap::new() };
    let time_at = |x: u64| {
        history.events.get(x as usize).map_or_else(|| history.events.last().map_or(0, |e| e.time_ns), |e| e.time_ns)
    };
    let bands = banded
        .iter()
        .map(|&a| {
            let a = &allocs[a];
            let e = a.event.map(|i| &history.events[i]);
            (
                a.start,
                a.end,
                a.size,
                strings.id(e.and_then(|e| e.tag.as_deref())),
                strings.id(e.map(|e| &*e.allocator)),
                strings.id(e.and_then(|e| e.description.as_deref())),
                strings.id(e.and_then(|e| e.backtrace.as_deref())),
                a.address,
                time_at(a.start),
                time_at(a.end),
            )
        })
        .collect();
    let other = series(
        rest.iter()
            .flat_map(|&a| {
                [(allocs[a].start, i128::from(allocs[a].size)), (allocs[a].end, -i128::from(allocs[a].size))]
            })
            .collect(),
        n,
    );
    let time_step = n.div_ceil(2000).max(1);
    let times = (0..n).step_by(time_step as usize).map(time_at).collect();
    let data = PageData {
        events: n,
        times,
        time_step,
        bands,
        other,
        other_count: rest.len() as u64,
        reserved: series(reserved, n),
        ooms,
        peak_event: None,
        strings: strings.list,
        peak: sweep(allocs.iter(), n).0,
    };
    (data, tag_rows(history, &allocs))
}

/// The highest sum of live sizes over `allocs`, and the sum still live at the end (frees
/// before allocations at the same index).
fn sweep<'a>(allocs: impl Iterator<Item = &'a Alloc>, n: u64) -> (u64, u64) {
    let mut d: Vec<(u64, i128)> = Vec::new();
    for a in allocs {
        d.push((a.start, i128::from(a.size)));
        if a.end < n {
            d.push((a.end, -i128::from(a.size)));
        }
    }
    d.sort_unstable();
    let (mut level, mut top) = (0i128, 0i128);
    for (_, delta) in d {
        level += delta;
        top = top.max(level);
    }
    (clamp(top), clamp(level))
}

/// Allocations, bytes, peak and live bytes per tag (allocations without one under `(none)`).
fn tag_rows(history: &History, allocs: &[Alloc]) -> Vec<TagRow> {
    let n = history.events.len() as u64;
    let mut per: HashMap<&str, Vec<&Alloc>> = HashMap::new();
    for a in allocs {
        let tag = a.event.and_then(|i| history.events[i].tag.as_deref()).unwrap_or("(none)");
        per.entry(tag).or_default().push(a);
    }
    let mut rows: Vec<TagRow> = per
        .into_iter()
        .map(|(tag, v)| {
            let (peak, live_at_end) = sweep(v.iter().copied(), n);
            let allocations = v.iter().filter(|a| a.event.is_some()).count() as u64;
            let bytes = v.iter().filter(|a| a.event.is_some()).fold(0u64, |sum, a| sum.saturating_add(a.size));
            TagRow { tag: tag.to_owned(), allocations, bytes, peak, live_at_end }
        })
        .collect();
    rows.sort_by(|a, b| b.peak.cmp(&a.peak).then_with(|| a.tag.cmp(&b.tag)));
    rows
}
