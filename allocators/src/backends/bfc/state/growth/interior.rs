//! Free pages inside an expandable region: which spans of them count, giving them back as
//! decommitted holes (`release_cached`, and a peak headroom over memory that cannot move pages),
//! moving them to where a block needs memory (a peak headroom over memory that can), and the
//! headroom rule that decides when.

use core::ops::Range;
use core::ptr::NonNull;

use super::super::{Handle, State};
use super::Growth;
use crate::ExpandableMemory;
use crate::observe::{self, Action};

/// The least span of whole free granules a chunk needs for
/// [`peak_headroom`](crate::BfcBuilder::peak_headroom) to decommit inside it (or a sixteenth of
/// the limit, if less): a chunk this large left between live blocks is worth a move (a system
/// call), or the `madvise` and the page faults when it is used again.
const TRAPPED_SPAN: usize = 64 << 20;

/// The span one host page table maps (2 MiB on x86-64 and arm64 with 4 KiB pages): pages that
/// move to the same offset within it as theirs move as whole tables, not entry by entry (about
/// 10x less time per move).
const PAGE_TABLE_SPAN: usize = 2 << 20;

/// A peak headroom first moves (and gives back) free pages in whole units of this size, counted
/// from the reservation's base, taking from a chunk's edges only what that leaves short.
/// Pages that move keep their own memory mapping (they cannot merge with their new neighbours),
/// so every boundary a move cuts stays, and a system call that moves a range pays for each
/// mapping in it. On the training stream, with moves cut anywhere the process came to 560
/// mappings, many of one page; in 2 MiB units, to 237 (a 2 MiB mapping each where pages went
/// back and forth); in 16 MiB units with the edges taken as they are, to 76-145 (over 200
/// replays, going up and down).
const MOVE_UNIT: usize = 16 << 20;

/// Free pages move only where their first [`RESIDENCY_SAMPLE`] bytes suggest at least this many
/// resident bytes in the piece: about as many page faults (128 of 4 KiB) as one move costs in
/// system calls. Pages that were never touched (a workload that writes little of its blocks)
/// are given back instead and fresh ones committed where the block needs them: the same bytes
/// reserved, two cheaper calls instead of the move (`docs/peak-headroom.md`).
const RESIDENT_WORTH_A_MOVE: usize = 512 << 10;

/// How much of a piece [`RESIDENT_WORTH_A_MOVE`] looks at: one page table's span, a 512-byte
/// `mincore` answer: larger samples make `mincore` a visible part of a replay's time
/// (`docs/peak-headroom.md`).
const RESIDENCY_SAMPLE: usize = 2 << 20;

impl State {
    /// The unit in which a peak headroom moves and gives back pages first: [`MOVE_UNIT`] if it
    /// is a multiple of the granule and the trapped span holds one, else the granule.
    pub(super) fn move_unit(&self) -> usize {
        let Growth::Expandable(e) = &self.growth else { return MOVE_UNIT };
        if MOVE_UNIT.is_multiple_of(e.granule) && MOVE_UNIT <= self.trapped_span() { MOVE_UNIT } else { e.granule }
    }

    /// [`PAGE_TABLE_SPAN`] if it is a multiple of the granule, else the granule: pages move to
    /// the same offset within it as theirs, and hole parts a block needs are committed in it.
    pub(super) fn page_table_unit(&self) -> usize {
        let Growth::Expandable(e) = &self.growth else { return PAGE_TABLE_SPAN };
        if PAGE_TABLE_SPAN.is_multiple_of(e.granule) { PAGE_TABLE_SPAN } else { e.granule }
    }

    /// The whole `unit`s (a multiple of the granule, counted from the reservation's base) of
    /// free chunks, as `(start, end)` spans of at least `min_span` bytes: large chunks from the
    /// highest address down, then small ones. The addresses `spare` stay: in a chunk that holds
    /// them, only the units after them count.
    fn free_spans(&self, min_span: usize, unit: usize, spare: Range<usize>) -> Vec<(usize, usize)> {
        let Growth::Expandable(e) = &self.growth else { return Vec::new() };
        let span = |(ptr, size, _): (usize, usize, Handle)| {
            let (mut lo, hi) = (e.unit_ceil(ptr, unit), e.unit_floor(ptr + size, unit));
            if spare.start < ptr + size && ptr < spare.end {
                lo = lo.max(e.unit_ceil(spare.end, unit));
            }
            (hi > lo && hi - lo >= min_span.max(1)).then_some((lo, hi))
        };
        self.by_address.iter().rev().chain(self.by_size.iter()).filter_map(span).collect()
    }

    /// Takes committed free granules out of free chunks, each becoming a hole, until `want`
    /// bytes went or none are left: spans of whole `unit`s of at least `min_span` bytes in the
    /// order [`free_spans`](Self::free_spans) gives them, and the committed pieces of each from
    /// its end (first fit takes the lowest addresses, so the highest are the last to be used
    /// again). `pick(piece_start, piece_end, left)` chooses the granule-aligned part of a piece
    /// to take (`None`: none of it); `give(start, end, taken)` hands that part's memory over
    /// and returns false (nothing given) to stop. Returns the bytes taken.
    fn take_free_granules(
        &mut self,
        want: usize,
        min_span: usize,
        unit: usize,
        spare: Range<usize>,
        mut pick: impl FnMut(usize, usize, usize) -> Option<(usize, usize)>,
        mut give: impl FnMut(usize, usize, usize) -> bool,
    ) -> usize {
        let spans = self.free_spans(min_span, unit, spare);
        let Growth::Expandable(e) = &mut self.growth else { return 0 };
        let mut taken = 0;
        'spans: for (lo, hi) in spans {
            for (pa, pb) in e.committed_in(lo, hi).into_iter().rev() {
                if taken >= want {
                    break 'spans;
                }
                let Some((a, b)) = pick(pa, pb, want - taken) else { continue };
                if !give(a, b, taken) {
                    break 'spans;
                }
                e.add_hole(a, b);
                observe::segment(Action::SegmentFree, &self.name, a, b - a);
                taken += b - a;
            }
        }
        taken
    }

    /// Decommits the committed parts of free granules, taken as
    /// [`take_free_granules`](Self::take_free_granules) takes them, until `want` bytes (rounded
    /// up to the granule) went or none are left: first in whole `unit`s (a multiple of the
    /// granule; up to `want` rounded up to it), then, if that was not enough, in granules.
    /// Returns the bytes decommitted.
    pub(super) fn punch(
        &mut self,
        memory: &dyn ExpandableMemory,
        want: usize,
        min_span: usize,
        unit: usize,
        spare: Range<usize>,
    ) -> usize {
        let Growth::Expandable(e) = &self.growth else { return 0 };
        let granule = e.granule;
        let tail_of = |pa: usize, pb: usize, left: usize| Some((pb - (pb - pa).min(left), pb));
        let decommit = |a: usize, b: usize, _| {
            if let Some(p) = NonNull::new(a as *mut u8) {
                // SAFETY: `a..b` is granule-aligned (so are the units of the spans, the holes and
                // what is wanted), committed (inside the committed part, in no hole) and inside a
                // free chunk, so nothing uses it; this memory decommits any granule-aligned part.
                unsafe { memory.decommit(p, b - a) };
            }
            true
        };
        let first = want.next_multiple_of(unit);
        let mut punched = self.take_free_granules(first, min_span, unit, spare.clone(), tail_of, decommit);
        if punched < want && unit > granule {
            let rest = (want - punched).next_multiple_of(granule);
            punched += self.take_free_granules(rest, min_span, granule, spare, tail_of, decommit);
        }
        self.reserved -= punched;
        if punched > 0 {
            tracing::debug!(punched, committed = self.reserved, "bfc: decommitted free granules");
        }
        punched
    }

    /// Bytes by which committing `bytes` more, for a block that needs `in_use` bytes in use,
    /// would lift reserved above both its high-water mark and the peak in use plus the
    /// headroom (0 without a headroom).
    pub(super) fn over_headroom(&self, bytes: usize, in_use: usize) -> usize {
        let Some(headroom) = self.options.peak_headroom else { return 0 };
        let peak = self.peak_in_use.max(in_use);
        let allowed = self.high_water.max(peak.saturating_add((peak as f64 * headroom) as usize));
        self.reserved.saturating_add(bytes).saturating_sub(allowed)
    }

    /// Whether free pages can move to where a block needs them instead of being given back
    /// and committed again.
    pub(crate) fn moves_pages(memory: &dyn ExpandableMemory) -> bool {
        memory.relocates() && memory.decommits_partially()
    }

    /// Gives back about `over` committed free bytes before more are committed: the free tail
    /// (unless the block takes addresses `spare` in it), then spans of at least
    /// [`TRAPPED_SPAN`] (or a sixteenth of the limit) whole free granules, highest first: a
    /// chunk left between live blocks, or the free end of the block's own chunk.
    pub(super) fn give_back(&mut self, memory: &dyn ExpandableMemory, over: usize, spare: Range<usize>) {
        let tail = self.free_tail().map(|h| self.chunks[h as usize]);
        let tail_is_spare = tail.is_some_and(|c| spare.start < c.ptr + c.size && c.ptr < spare.end);
        let gone = if tail_is_spare { 0 } else { self.decommit_tail(memory, over) };
        if gone < over && memory.decommits_partially() {
            self.punch(memory, over - gone, self.trapped_span(), self.move_unit(), spare);
        }
    }

    /// The least span of free granules worth giving back or moving: [`TRAPPED_SPAN`], or a
    /// sixteenth of the limit if less.
    fn trapped_span(&self) -> usize {
        TRAPPED_SPAN.min(self.growth.usable_limit() / 16)
    }

    /// Moves free pages to `to..` to cover `need` bytes of it, one piece after the other,
    /// taken as [`take_free_granules`](Self::take_free_granules) takes them from spans of at
    /// least the trapped span, each piece at the same offset within a page table's span as its
    /// destination: first from whole [move units](Self::move_unit) (up to `need` rounded up to
    /// one, at most `room` bytes), then, if that was not enough, from whole granules for the
    /// rest (rounded up to a page table's span, at most `room`). What they leave becomes holes.
    /// Reserved does not change. Stops at the first move the memory refuses. Returns the bytes
    /// moved (a multiple of the granule, at most `room`): `to..to + moved` is committed now.
    ///
    /// `to..to + room` must be an uncommitted, granule-aligned part of the reservation (past
    /// the committed end, or in a hole) outside `spare`.
    pub(super) fn relocate_into(
        &mut self,
        memory: &dyn ExpandableMemory,
        to: usize,
        need: usize,
        room: usize,
        spare: Range<usize>,
    ) -> usize {
        let Growth::Expandable(e) = &self.growth else { return 0 };
        let (granule, unit) = (e.granule, self.move_unit());
        let mut moved = self.relocate_in(memory, to, need.next_multiple_of(unit).min(room), unit, spare.clone());
        if moved < need && unit > granule {
            // A chunk's edges: moved as they are, not given back and committed again elsewhere
            // (pages committed fresh are a mapping of their own too, and they would move next).
            let rest = (need - moved).next_multiple_of(self.page_table_unit()).min(room - moved);
            moved += self.relocate_in(memory, to + moved, rest, granule, spare);
        }
        if moved > 0 {
            observe::segment(Action::SegmentAlloc, &self.name, to, moved);
            tracing::debug!(moved, to, "bfc: moved free pages to where a block needs them");
        }
        moved
    }

    /// Whether the pages of free piece `a..a + n` are worth a move rather than being given back
    /// (and fresh ones committed where they are needed): enough of them resident, judged from
    /// the piece's first [`RESIDENCY_SAMPLE`] bytes, or the memory cannot tell. `n > 0`.
    fn worth_moving(memory: &dyn ExpandableMemory, a: usize, n: usize) -> bool {
        let window = n.min(RESIDENCY_SAMPLE);
        let Some(resident) = NonNull::new(a as *mut u8).and_then(|p| memory.resident(p, window)) else { return true };
        // Scaled to the piece: resident * n / window >= the bound, in 128 bits (no overflow).
        (resident as u128 * n as u128) >= RESIDENT_WORTH_A_MOVE as u128 * window as u128
    }

    /// One pass of [`relocate_into`](Self::relocate_into): up to `want` bytes (rounded down to
    /// the granule) from spans of whole `unit`s, to `to..`; pieces under a page table's span
    /// are not worth a move (unless less than that is left to move), nor pieces with too few
    /// resident pages ([`worth_moving`](Self::worth_moving)): the caller gives those back.
    /// Returns the bytes moved.
    fn relocate_in(
        &mut self,
        memory: &dyn ExpandableMemory,
        to: usize,
        want: usize,
        unit: usize,
        spare: Range<usize>,
    ) -> usize {
        let Growth::Expandable(e) = &self.growth else { return 0 };
        let want = want / e.granule * e.granule;
        // Same offset modulo `step` keeps granule alignment as well.
        let step = self.page_table_unit();
        // The top `left` bytes of the piece, shifted down so that they start at the same offset
        // within a page table's span as their destination; if the piece is too short for that,
        // from its first such address up. Pieces under `step` are not worth a move, nor pieces
        // whose pages were never touched.
        let aligned = |pa: usize, pb: usize, left: usize| {
            let phase = |x: usize| x.wrapping_sub(to + want - left) % step;
            let top = pb.saturating_sub(left).max(pa);
            let a = if top - pa >= phase(top) { top - phase(top) } else { pa + (step - phase(pa)) % step };
            let n = pb.saturating_sub(a).min(left);
            (n >= left.min(step) && Self::worth_moving(memory, a, n)).then_some((a, a + n))
        };
        let relocate = |a: usize, b: usize, taken: usize| {
            let (Some(from), Some(dst)) = (NonNull::new(a as *mut u8), NonNull::new((to + taken) as *mut u8)) else {
                return false;
            };
            // SAFETY: `a..b` is committed (inside the committed part, in no hole), granule-aligned
            // and inside a free chunk that the block being placed does not use (`spare`), so
            // nothing uses it; `to + taken..` lies in `to..to + want`, which the caller promises
            // is an uncommitted, granule-aligned part of the reservation, so it cannot overlap
            // `a..b`, which is committed.
            match unsafe { memory.relocate(from, dst, b - a) } {
                Ok(()) => true,
                Err(error) => {
                    tracing::debug!(memory = memory.name(), bytes = b - a, %error, "bfc: moving free pages refused");
                    false
                }
            }
        };
        self.take_free_granules(want, self.trapped_span(), unit, spare, aligned, relocate)
    }
}
