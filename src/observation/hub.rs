//! The process's [`Observer`]: attributes live allocations to leak checks and scope tags
//! (dashmaps: shared across threads, off the unobserved hot path), keeps per-tag totals, and
//! feeds the history recorder.

use std::backtrace::Backtrace;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use dashmap::DashMap;

use super::tags::TagLedger;
use crate::allocators::observe::{self, Action, Event, Observer, Refusal, Tag};

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

/// The bytes a leak check's allocations hold now and at most, counted when they are attributed
/// to it and freed (requested sizes, on whatever thread they are freed): exact, since every
/// change is one atomic add and the peak one `fetch_max` of the total it produced.
#[derive(Debug, Default)]
pub(crate) struct CheckBytes {
    live: AtomicU64,
    peak: AtomicU64,
}

impl CheckBytes {
    fn add(&self, bytes: usize) {
        let now = self.live.fetch_add(bytes as u64, Relaxed).saturating_add(bytes as u64);
        self.peak.fetch_max(now, Relaxed);
    }

    fn sub(&self, bytes: usize) {
        // Saturating: never below zero, whatever order a stale record's replacement and a free
        // of the same block come in.
        let _ = self.live.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(bytes as u64)));
    }

    /// The most bytes held at once so far.
    pub(crate) fn peak(&self) -> u64 {
        self.peak.load(Relaxed)
    }
}

pub(crate) struct Hub {
    pub(crate) records: DashMap<usize, Record>,
    /// The leak checks not finished yet, with the bytes their allocations hold.
    pub(crate) checks: DashMap<u64, Arc<CheckBytes>>,
    pub(crate) tags: TagLedger,
    next_id: AtomicU64,
    /// `TENSORMEM_BACKTRACE=1` when the newest leak check started.
    pub(crate) backtraces: AtomicBool,
}

/// The hub, installed as the allocators' observer on first use.
pub(crate) fn hub() -> &'static Hub {
    // Made once, unobserved: its maps are the observer's, not the program's.
    observe::unobserved(make_hub)
}

fn make_hub() -> &'static Hub {
    static HUB: OnceLock<Hub> = OnceLock::new();
    static INSTALLED: OnceLock<()> = OnceLock::new();
    let hub = HUB.get_or_init(|| Hub {
        records: DashMap::new(),
        checks: DashMap::new(),
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
        // The thread's open checks, each counting the block's bytes.
        let mut checks = Vec::new();
        if e.checked {
            for id in observe::thread_checks() {
                if let Some(bytes) = self.checks.get(&id) {
                    bytes.add(e.requested);
                    checks.push(id);
                }
            }
        }
        if checks.is_empty() && e.tag.is_none() {
            return;
        }
        let allocator = Tag::intern(e.allocator);
        if let Some(tag) = e.tag {
            self.tags.alloc(tag, allocator, e.allocated);
        }
        let backtrace =
            (!checks.is_empty() && self.backtraces.load(Relaxed)).then(|| Arc::new(Backtrace::force_capture()));
        let record = Record {
            id: self.next_id.fetch_add(1, Relaxed),
            requested: e.requested,
            allocated: e.allocated,
            allocator,
            tag: e.tag,
            checks,
            description: None,
            backtrace,
        };
        // A stale record at this address (its free went unreported) is replaced.
        if let Some(old) = self.records.insert(e.address, record) {
            self.release(&old);
        } else {
            observe::add_records(1);
        }
    }

    fn on_free(&self, address: usize) {
        if let Some((_, r)) = self.records.remove(&address) {
            observe::add_records(-1);
            self.release(&r);
        }
    }

    /// Takes a record that is gone off its tag's and its checks' totals.
    fn release(&self, r: &Record) {
        if let Some(tag) = r.tag {
            self.tags.free(tag, r.allocator, r.allocated);
        }
        for id in &r.checks {
            if let Some(bytes) = self.checks.get(id) {
                bytes.sub(r.requested);
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

    fn refused(&self, refusal: &Refusal<'_>) {
        crate::observation::oom::report(self, refusal);
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
