//! What was live at a point of a [`History`]: [`History::live_at`] and, at the most bytes live
//! at once, [`History::peak`], grouped by scope and by what the blocks hold.

use std::collections::HashMap;
use std::sync::Arc;

use super::History;
use crate::allocators::observe::Action;

/// One allocation live at a point of a history.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LiveAllocation {
    /// The index of its `alloc` event in [`History::events`].
    pub event: usize,
    /// When it was allocated (nanoseconds since recording started).
    pub time_ns: u64,
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
    /// The allocations, oldest first.
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

impl History {
    /// The allocations live right after event `event` (0 = after the first event), as far as
    /// the history knows: a block allocated before recording started, or whose `alloc` event the
    /// ring buffer dropped, is not in it. `None` when the history has no such event.
    pub fn live_at(&self, event: usize) -> Option<LiveSet> {
        let e = self.events.get(event)?;
        let mut live: HashMap<(&str, u64), Vec<usize>> = HashMap::new();
        for (i, e) in self.events[..=event].iter().enumerate() {
            match e.action {
                Action::Alloc => live.entry((&e.allocator, e.address)).or_default().push(i),
                Action::Free => {
                    if let Some(v) = live.get_mut(&(&*e.allocator, e.address)) {
                        v.pop();
                    }
                }
                _ => {}
            }
        }
        let mut indices: Vec<usize> = live.into_values().flatten().collect();
        indices.sort_unstable();
        let allocations: Vec<LiveAllocation> = indices
            .into_iter()
            .map(|i| {
                let a = &self.events[i];
                LiveAllocation {
                    event: i,
                    time_ns: a.time_ns,
                    address: a.address,
                    size: a.size,
                    allocator: Arc::clone(&a.allocator),
                    tag: a.tag.clone(),
                    description: a.description.clone(),
                    backtrace: a.backtrace.clone(),
                }
            })
            .collect();
        let bytes = allocations.iter().fold(0u64, |s, a| s.saturating_add(a.size));
        Some(LiveSet { event, time_ns: e.time_ns, bytes, allocations })
    }

    /// The allocations live when the most bytes were (the first time that many were): the peak
    /// of the history's in-use line. `None` when nothing was ever allocated in it.
    pub fn peak(&self) -> Option<LiveSet> {
        let mut sizes: HashMap<(&str, u64), Vec<u64>> = HashMap::new();
        let (mut in_use, mut best) = (0u128, None::<(u128, usize)>);
        for (i, e) in self.events.iter().enumerate() {
            match e.action {
                Action::Alloc => {
                    in_use += u128::from(e.size);
                    sizes.entry((&e.allocator, e.address)).or_default().push(e.size);
                    if best.is_none_or(|(b, _)| in_use > b) {
                        best = Some((in_use, i));
                    }
                }
                Action::Free => {
                    if let Some(size) = sizes.get_mut(&(&*e.allocator, e.address)).and_then(Vec::pop) {
                        in_use -= u128::from(size);
                    }
                }
                _ => {}
            }
        }
        best.and_then(|(_, i)| self.live_at(i))
    }
}
