//! The process's [`Observer`]: attributes live allocations to leak checks and scope tags
//! (dashmaps: shared across threads, off the unobserved hot path), keeps per-tag totals, and
//! feeds the history recorder.

use std::backtrace::Backtrace;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use dashmap::{DashMap, DashSet};

use super::tags::TagLedger;
use crate::allocators::observe::{self, Action, Event, Observer, Tag};

/// One live allocation that a leak check or a tag needs to know about.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    pub(crate) id: u64,
    pub(crate) requested: usize,
    pub(crate) allocated: usize,
    /// The allocator's name, interned.
    pub(crate) allocator: Tag,
    pub(crate) tag: Option<Tag>,
    /// The live leak checks it counts against, outermost first.
    pub(crate) checks: Vec<u64>,
    pub(crate) description: Option<Box<str>>,
    pub(crate) backtrace: Option<Arc<Backtrace>>,
}

pub(crate) struct Hub {
    pub(crate) records: DashMap<usize, Record>,
    /// The leak checks not finished yet.
    pub(crate) checks: DashSet<u64>,
    pub(crate) tags: TagLedger,
    next_id: AtomicU64,
    /// `TENSORMEM_BACKTRACE=1` when the newest leak check started.
    pub(crate) backtraces: AtomicBool,
}

/// The hub, installed as the allocators' observer on first use.
pub(crate) fn hub() -> &'static Hub {
    static HUB: OnceLock<Hub> = OnceLock::new();
    static INSTALLED: OnceLock<()> = OnceLock::new();
    let hub = HUB.get_or_init(|| Hub {
        records: DashMap::new(),
        checks: DashSet::new(),
        tags: TagLedger::default(),
        next_id: AtomicU64::new(1),
        backtraces: AtomicBool::new(false),
    });
    INSTALLED.get_or_init(|| {
        observe::set_observer(hub);
    });
    hub
}

impl Hub {
    fn on_alloc(&self, e: &Event<'_>) {
        let checks: Vec<u64> = if e.checked {
            observe::thread_checks().into_iter().filter(|id| self.checks.contains(id)).collect()
        } else {
            Vec::new()
        };
        if let Some(tag) = e.tag {
            self.tags.alloc(tag, e.allocated);
        }
        if checks.is_empty() && e.tag.is_none() {
            return;
        }
        let backtrace =
            (!checks.is_empty() && self.backtraces.load(Relaxed)).then(|| Arc::new(Backtrace::force_capture()));
        let record = Record {
            id: self.next_id.fetch_add(1, Relaxed),
            requested: e.requested,
            allocated: e.allocated,
            allocator: Tag::intern(e.allocator),
            tag: e.tag,
            checks,
            description: None,
            backtrace,
        };
        // A stale record at this address (its free went unreported) is replaced.
        if let Some(old) = self.records.insert(e.address, record) {
            if let Some(tag) = old.tag {
                self.tags.free(tag, old.allocated);
            }
        } else {
            observe::add_records(1);
        }
    }

    fn on_free(&self, address: usize) {
        if let Some((_, r)) = self.records.remove(&address) {
            observe::add_records(-1);
            if let Some(tag) = r.tag {
                self.tags.free(tag, r.allocated);
            }
        }
    }

    /// Drops `check` from every record; records left with no check and no tag go.
    pub(crate) fn detach_check(&self, check: u64) {
        let mut dropped = 0isize;
        self.records.retain(|_, r| {
            r.checks.retain(|&c| c != check);
            let keep = !r.checks.is_empty() || r.tag.is_some();
            if !keep {
                dropped += 1;
            }
            keep
        });
        if dropped > 0 {
            observe::add_records(-dropped);
        }
    }
}

impl Observer for Hub {
    fn event(&self, e: &Event<'_>) {
        match e.action {
            Action::Alloc => self.on_alloc(e),
            Action::Free => self.on_free(e.address),
            _ => {}
        }
        if observe::recording() {
            crate::history::record(e);
        }
    }

    fn describe(&self, address: usize, description: &dyn Fn() -> String) {
        if let Some(mut r) = self.records.get_mut(&address) {
            r.description = Some(description().into());
        }
        if observe::recording() {
            crate::history::describe(address, description);
        }
    }
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").field("records", &self.records.len()).field("checks", &self.checks.len()).finish()
    }
}
