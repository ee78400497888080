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

/// Free pages move to an address at the same offset within this span as theirs: the span one
/// host page table maps (2 MiB on x86-64 and arm64 with 4 KiB pages), so that the system moves
/// whole tables instead of their entries one by one (about 10x less time per move).
const MOVE_PHASE: usize = 2 << 20;

impl State {
    /// The whole free granules of free chunks, as `(start, end)` spans of at least `min_span`
    /// bytes: large chunks from the highest address down, then small ones. The addresses
    /// `spare` stay: in a chunk that holds them, only the granules after them count.
    fn free_spans(&self, min_span: usize, spare: Range<usize>) -> Vec<(usize, usize)> {
        let Growth::Expandable(e) = &self.growth else { return Vec::new() };
        let g = e.granule;
        let span = |(ptr, size, _): (usize, usize, Handle)| {
            let (mut lo, hi) = (ptr.next_multiple_of(g), (ptr + size) / g * g);
            if spare.start < ptr + size && ptr < spare.end {
                lo = lo.max(spare.end.checked_next_multiple_of(g).unwrap_or(usize::MAX));
            }
            (hi > lo && hi - lo >= min_span.max(1)).then_some((lo, hi))
        };
        self.by_address.iter().rev().chain(self.by_size.iter()).filter_map(span).collect()
    }

    /// Takes committed free granules out of free chunks, each becoming a hole, until `want`
    /// bytes went or none are left: spans of at least `min_span` bytes in the order
    /// [`free_spans`](Self::free_spans) gives them, and the committed pieces of each from its
    /// end (first fit takes the lowest addresses, so the highest are the last to be used
    /// again). `pick(piece_start, piece_end, left)` chooses the granule-aligned part of a piece
    /// to take (`None`: none of it); `give(start, end, taken)` hands that part's memory over
    /// and returns false (nothing given) to stop. Returns the bytes taken.
    fn take_free_granules(
        &mut self,
        want: usize,
        min_span: usize,
        spare: Range<usize>,
        mut pick: impl FnMut(usize, usize, usize) -> Option<(usize, usize)>,
        mut give: impl FnMut(usize, usize, usize) -> bool,
    ) -> usize {
        let spans = self.free_spans(min_span, spare);
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
    /// up to the granule) went or none are left. Returns the bytes decommitted.
    pub(super) fn punch(
        &mut self,
        memory: &dyn ExpandableMemory,
        want: usize,
        min_span: usize,
        spare: Range<usize>,
    ) -> usize {
        let Growth::Expandable(e) = &self.growth else { return 0 };
        let want = want.next_multiple_of(e.granule);
        let tail_of = |pa: usize, pb: usize, left: usize| Some((pb - (pb - pa).min(left), pb));
        let decommit = |a: usize, b: usize, _| {
            if let Some(p) = NonNull::new(a as *mut u8) {
                // SAFETY: `a..b` is granule-aligned (so are the spans, the holes and `want`),
                // committed (inside the committed part, in no hole) and inside a free chunk, so
                // nothing uses it; this memory decommits any granule-aligned part.
                unsafe { memory.decommit(p, b - a) };
            }
            true
        };
        let punched = self.take_free_granules(want, min_span, spare, tail_of, decommit);
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
    pub(super) fn moves_pages(memory: &dyn ExpandableMemory) -> bool {
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
            self.punch(memory, over - gone, self.trapped_span(), spare);
        }
    }

    /// The least span of free granules worth giving back or moving: [`TRAPPED_SPAN`], or a
    /// sixteenth of the limit if less.
    fn trapped_span(&self) -> usize {
        TRAPPED_SPAN.min(self.growth.usable_limit() / 16)
    }

    /// Moves up to `want` bytes (rounded down to the granule) of committed free granules, taken
    /// as [`take_free_granules`](Self::take_free_granules) takes them (spans of at least the
    /// trapped span; at the same offset within 2 MiB as their destination, pieces under 2 MiB
    /// skipped), to `to..`, one after the other; what they leave becomes holes.
    /// Reserved does not change. Stops at the first move the memory refuses. Returns the bytes
    /// moved: `to..to + moved` is committed now.
    ///
    /// `to..to + want` must be an uncommitted, granule-aligned part of the reservation (past
    /// the committed end, or in a hole) outside `spare`.
    pub(super) fn relocate_into(
        &mut self,
        memory: &dyn ExpandableMemory,
        to: usize,
        want: usize,
        spare: Range<usize>,
    ) -> usize {
        let Growth::Expandable(e) = &self.growth else { return 0 };
        let want = want / e.granule * e.granule;
        // Same offset modulo `step` keeps granule alignment as well.
        let step = if MOVE_PHASE.is_multiple_of(e.granule) { MOVE_PHASE } else { e.granule };
        // The top `left` bytes of the piece, shifted down so that they start at the same offset
        // within a page table's span as their destination; if the piece is too short for that,
        // from its first such address up. Pieces under `step` are not worth a move.
        let aligned = |pa: usize, pb: usize, left: usize| {
            let phase = |x: usize| x.wrapping_sub(to + want - left) % step;
            let top = pb.saturating_sub(left).max(pa);
            let a = if top - pa >= phase(top) { top - phase(top) } else { pa + (step - phase(pa)) % step };
            let n = pb.saturating_sub(a).min(left);
            (n >= left.min(step)).then_some((a, a + n))
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
        let moved = self.take_free_granules(want, self.trapped_span(), spare, aligned, relocate);
        if moved > 0 {
            observe::segment(Action::SegmentAlloc, &self.name, to, moved);
            tracing::debug!(moved, to, "bfc: moved free pages to where a block needs them");
        }
        moved
    }
}
