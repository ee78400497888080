//! What was live at a point of a [`History`]: [`History::live_at`] and, at the most bytes live
//! at once, [`History::peak`], grouped by scope and by what the blocks hold.

use std::collections::HashMap;
use std::sync::Arc;

use super::History;
use crate::allocators::observe::Action;

/// One allocation live at a point of a history.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LiveAllocation {
    /// The index of its `alloc` event in [`History::events`]; `None` for a block allocated
    /// before the history starts (recording began, or the ring buffer dropped its `alloc`, while
    /// it was live), known from its `free`.
    pub event: Option<usize>,
    /// When it was allocated (nanoseconds since recording started); `None` when `event` is.
    pub time_ns: Option<u64>,
    /// Its address.
    pub address: u64,
    /// Its requested size in bytes.
    pub size: u64,
    /// The allocator that served it.
    pub allocator: Arc<str>,
    /// The scope it was allocated in.
    pub tag: Option<String>,
    /// What it holds (e.g. `tensor f32 [32, 32]`).
    pub description: Option<String>,
    /// Where it was allocated, when recorded with backtraces.
    pub backtrace: Option<String>,
}

/// The bytes and allocations of one group of a [`LiveSet`] (a scope, or a description).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LiveGroup {
    /// The scope path or description; `None` for allocations made outside any scope or never
    /// described.
    pub key: Option<String>,
    /// Requested bytes live in the group.
    pub bytes: u64,
    /// How many allocations.
    pub count: usize,
}

/// The allocations live right after one event of a history.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LiveSet {
    /// The event after which they were live.
    pub event: usize,
    /// That event's time.
    pub time_ns: u64,
    /// Requested bytes live, in all.
    pub bytes: u64,
    /// The allocations, oldest first (those from before the history first).
    pub allocations: Vec<LiveAllocation>,
}

impl LiveSet {
    /// The live bytes by scope, most bytes first (ties: by name).
    pub fn by_scope(&self) -> Vec<LiveGroup> {
        self.group(|a| a.tag.as_deref())
    }

    /// The live bytes by description (what the blocks hold), most bytes first (ties: by name).
    pub fn by_description(&self) -> Vec<LiveGroup> {
        self.group(|a| a.description.as_deref())
    }

    fn group<'a>(&'a self, key: impl Fn(&'a LiveAllocation) -> Option<&'a str>) -> Vec<LiveGroup> {
        let mut groups: HashMap<Option<&str>, (u64, usize)> = HashMap::new();
        for a in &self.allocations {
            let g = groups.entry(key(a)).or_default();
            g.0 = g.0.saturating_add(a.size);
            g.1 += 1;
        }
        let mut v: Vec<LiveGroup> = groups
            .into_iter()
            .map(|(k, (bytes, count))| LiveGroup { key: k.map(str::to_owned), bytes, count })
            .collect();
        v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.key.cmp(&b.key)));
        v
    }
}

/// A block of a history: where its `alloc` is (`None`: before the history) and where its `free`
/// is (`None`: still live at the end), with the event that tells its size.
struct Block {
    start: Option<usize>,
    end: Option<usize>,
    /// The `alloc` event, or for a block from before the history its `free`.
    known: usize,
}

impl Block {
    /// Live right after event `x`: allocated at or before it and not freed by then.
    fn live_after(&self, x: usize) -> bool {
        self.start.is_none_or(|s| s <= x) && self.end.is_none_or(|e| e > x)
    }
}

impl History {
    /// Every block of the history, matching each `free` to the latest live `alloc` of the same
    /// allocator and address (the timeline page draws the same blocks).
    fn blocks(&self) -> Vec<Block> {
        let mut blocks: Vec<Block> = Vec::new();
        let mut open: HashMap<(&str, u64), Vec<usize>> = HashMap::new();
        for (i, e) in self.events.iter().enumerate() {
            match e.action {
                Action::Alloc => {
                    open.entry((&e.allocator, e.address)).or_default().push(blocks.len());
                    blocks.push(Block { start: Some(i), end: None, known: i });
                }
                Action::Free => match open.get_mut(&(&*e.allocator, e.address)).and_then(Vec::pop) {
                    Some(b) => blocks[b].end = Some(i),
                    None => blocks.push(Block { start: None, end: Some(i), known: i }),
                },
                _ => {}
            }
        }
        blocks
    }

    /// The allocations live right after event `event` (0 = after the first event). A block
    /// allocated before the history starts is in it until its `free` (its size is the free's);
    /// one allocated before and never freed in the history cannot be known, and is not. `None`
    /// when the history has no such event.
    pub fn live_at(&self, event: usize) -> Option<LiveSet> {
        self.live_set(self.blocks(), event)
    }

    /// The live set after `event`, from the history's `blocks`.
    fn live_set(&self, blocks: Vec<Block>, event: usize) -> Option<LiveSet> {
        let at = self.events.get(event)?;
        let mut live: Vec<Block> = blocks.into_iter().filter(|b| b.live_after(event)).collect();
        // Oldest first: blocks from before the history (in the order of their frees), then by
        // their `alloc` events.
        live.sort_by_key(|b| (b.start.is_some(), b.start.unwrap_or(b.known)));
        let allocations: Vec<LiveAllocation> = live
            .iter()
            .map(|b| {
                let e = &self.events[b.known];
                let alloc = b.start.map(|_| e);
                LiveAllocation {
                    event: b.start,
                    time_ns: alloc.map(|e| e.time_ns),
                    address: e.address,
                    size: e.size,
                    allocator: Arc::clone(&e.allocator),
                    tag: alloc.and_then(|e| e.tag.clone()),
                    description: alloc.and_then(|e| e.description.clone()),
                    backtrace: alloc.and_then(|e| e.backtrace.clone()),
                }
            })
            .collect();
        let bytes = allocations.iter().fold(0u64, |s, a| s.saturating_add(a.size));
        Some(LiveSet { event, time_ns: at.time_ns, bytes, allocations })
    }

    /// The allocations live when the most bytes were (right after the first event at which that
    /// many were): the top of the timeline page's in-use line. `None` when no bytes were ever
    /// live in the history.
    pub fn peak(&self) -> Option<LiveSet> {
        let n = self.events.len();
        // Bytes coming live (+) and going (-) right after each event; blocks from before the
        // history are live from its start.
        let mut delta = vec![0i128; n + 1];
        let mut level = 0i128;
        let blocks = self.blocks();
        for b in &blocks {
            let size = i128::from(self.events[b.known].size);
            match b.start {
                Some(s) => delta[s] += size,
                None => level += size,
            }
            if let Some(e) = b.end {
                delta[e] -= size;
            }
        }
        let mut best: Option<(i128, usize)> = None;
        for (x, d) in delta.iter().take(n).enumerate() {
            level += d;
            if level > 0 && best.is_none_or(|(b, _)| level > b) {
                best = Some((level, x));
            }
        }
        best.and_then(|(_, x)| self.live_set(blocks, x))
    }
}
