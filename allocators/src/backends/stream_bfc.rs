//! [`StreamOrderedBfc`]: stream-ordered allocation over BFC arenas, one per device stream, as
//! PyTorch's caching allocator keeps its blocks per stream ([`StreamOrdered`] says the rule
//! each side keeps).

use core::alloc::Layout;
use core::fmt;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::observe::{self, Layer};
use crate::{
    AllocError, AllocErrorKind, AllocationAttributes, Allocator, AllocatorStats, BfcAllocator, BfcBuilder, BuildError,
    MemorySpace, StreamError, StreamEvents, StreamId, StreamOrdered,
};

/// Stream-ordered device memory: a [`BfcAllocator`] arena per stream, built from one
/// configuration, over events `E` ([`CudaEvents`](crate::cuda::CudaEvents) on a GPU).
///
/// - A request names its stream in [`AllocationAttributes::stream`] (the legacy stream by
///   default, whose arena is built with the allocator: callers that name no stream use it as a
///   plain BFC). A freed block goes back to its stream's arena at once and is reused by that
///   stream's later requests without any synchronisation; other streams never get it while it
///   is cached.
/// - [`record_stream`](StreamOrdered::record_stream) marks a block as used on another stream;
///   freeing it then records an event on each such stream and keeps the block pending until
///   they have completed: every allocation polls the pending blocks first (without blocking,
///   oldest first, and not past an event that has not completed on the same stream, since a
///   stream's events complete in order).
/// - When a request is refused, the allocator waits for the pending blocks, gives the other
///   arenas' cached memory back (their memory unmaps only after the device's queued work, so
///   nothing in flight loses memory) and tries once more.
///
/// Each arena takes up to the configured limit; the device's own capacity bounds them all.
/// The figures are the arenas' summed (peaks summed too: an upper bound when streams peak at
/// different times; exact with one stream). The frees of pending blocks are reported to leak
/// checks and history when the caller frees them.
pub struct StreamOrderedBfc<E: StreamEvents> {
    name: String,
    template: BfcBuilder,
    events: E,
    legacy: BfcAllocator,
    /// The arenas of the other streams, built at their first request.
    arenas: RwLock<Vec<(StreamId, Arc<BfcAllocator>)>>,
    /// The live blocks of the other streams: address -> stream (legacy blocks are not listed).
    owners: Mutex<HashMap<usize, StreamId>>,
    owned: AtomicUsize,
    /// Streams other than their own that live blocks are used on.
    uses: Mutex<HashMap<usize, Vec<StreamId>>>,
    recorded: AtomicUsize,
    /// Freed blocks waiting for events, oldest first.
    pending: Mutex<VecDeque<Pending<E::Event>>>,
    waiting: AtomicUsize,
}

/// A freed block waiting for the work of other streams.
struct Pending<Ev> {
    address: usize,
    layout: Layout,
    stream: StreamId,
    events: Vec<(StreamId, Ev)>,
}

impl<E: StreamEvents> StreamOrderedBfc<E> {
    /// Arenas configured by `template` (its name, limit, sub-allocator and policies, for every
    /// stream's arena), with the legacy stream's built now.
    ///
    /// # Errors
    /// The legacy arena's [`BuildError`].
    pub fn new(template: BfcBuilder, events: E) -> Result<Self, BuildError> {
        let legacy = template.clone().build()?;
        Ok(Self {
            name: legacy.name().to_owned(),
            template,
            events,
            legacy,
            arenas: RwLock::new(Vec::new()),
            owners: Mutex::new(HashMap::new()),
            owned: AtomicUsize::new(0),
            uses: Mutex::new(HashMap::new()),
            recorded: AtomicUsize::new(0),
            pending: Mutex::new(VecDeque::new()),
            waiting: AtomicUsize::new(0),
        })
    }

    /// The legacy stream's arena (memory dumps, invariants).
    pub fn legacy(&self) -> &BfcAllocator {
        &self.legacy
    }

    /// The streams with an arena, the legacy stream first.
    pub fn streams(&self) -> Vec<StreamId> {
        core::iter::once(StreamId::LEGACY).chain(self.arenas.read().iter().map(|(s, _)| *s)).collect()
    }

    /// The events.
    pub fn events(&self) -> &E {
        &self.events
    }

    fn other_arena(&self, stream: StreamId) -> Option<Arc<BfcAllocator>> {
        self.arenas.read().iter().find(|(s, _)| *s == stream).map(|(_, a)| a.clone())
    }

    /// The arena of `stream`, built if it has none yet.
    fn arena_for(&self, stream: StreamId, layout: Layout) -> Result<Arc<BfcAllocator>, AllocError> {
        if let Some(a) = self.other_arena(stream) {
            return Ok(a);
        }
        let mut arenas = self.arenas.write();
        if let Some((_, a)) = arenas.iter().find(|(s, _)| *s == stream) {
            return Ok(a.clone());
        }
        let arena = self.template.clone().build().map(Arc::new).map_err(|e| {
            tracing::error!(allocator = %self.name, ?stream, %e, "no arena for the stream");
            AllocError::new(AllocErrorKind::OutOfMemory, layout, &self.name)
        })?;
        arenas.push((stream, arena.clone()));
        Ok(arena)
    }

    /// Which stream the block at `address` belongs to (the legacy stream if not listed).
    fn owner(&self, address: usize) -> StreamId {
        if self.owned.load(Relaxed) == 0 {
            return StreamId::LEGACY;
        }
        self.owners.lock().get(&address).copied().unwrap_or(StreamId::LEGACY)
    }

    fn with_arena<R>(&self, stream: StreamId, f: impl FnOnce(&BfcAllocator) -> R) -> Option<R> {
        if stream == StreamId::LEGACY {
            return Some(f(&self.legacy));
        }
        self.other_arena(stream).map(|a| f(&a))
    }

    fn try_allocate(&self, layout: Layout, attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        if attrs.stream == StreamId::LEGACY {
            return self.legacy.allocate_raw(layout, attrs);
        }
        let arena = self.arena_for(attrs.stream, layout)?;
        let p = arena.allocate_raw(layout, attrs)?;
        if layout.size() > 0 {
            self.owners.lock().insert(p.as_ptr() as usize, attrs.stream);
            self.owned.fetch_add(1, Relaxed);
        }
        Ok(p)
    }

    /// Gives back the cached memory of every arena but `except`'s.
    fn release_arenas(&self, except: Option<StreamId>) -> usize {
        let mut released = 0;
        if except != Some(StreamId::LEGACY) {
            released += self.legacy.release_cached();
        }
        let others: Vec<Arc<BfcAllocator>> =
            self.arenas.read().iter().filter(|(s, _)| Some(*s) != except).map(|(_, a)| a.clone()).collect();
        released + others.iter().map(|a| a.release_cached()).sum::<usize>()
    }

    /// Returns pending blocks to their arenas (their frees were reported already).
    fn free_pending(&self, ready: Vec<Pending<E::Event>>) -> usize {
        let n = ready.len();
        for p in ready {
            for (_, ev) in p.events {
                self.events.destroy(ev);
            }
            let Some(ptr) = NonNull::new(p.address as *mut u8) else { continue };
            // Reported when the caller freed it: the arena's own report is a nested call's.
            // SAFETY: the block came from this arena with `layout` and was freed by its caller;
            // its events have completed, so no queued work uses it.
            let freed = observe::nested(|| self.with_arena(p.stream, |a| unsafe { a.deallocate_raw(ptr, p.layout) }));
            if freed.is_none() {
                tracing::error!(allocator = %self.name, stream = ?p.stream, "a pending block's arena is gone");
            }
        }
        n
    }
}

// SAFETY: every block comes from one of the BFC arenas (each keeps the `Allocator` contract) and
// goes back to the arena it came from: the legacy arena unless `owners` lists another stream.
// Blocks with uses recorded on other streams go back only after those streams' events complete.
unsafe impl<E: StreamEvents> Allocator for StreamOrderedBfc<E> {
    fn name(&self) -> &str {
        &self.name
    }

    fn memory_space(&self) -> MemorySpace {
        self.legacy.memory_space()
    }

    fn allocate_raw(&self, layout: Layout, attrs: &AllocationAttributes) -> Result<NonNull<u8>, AllocError> {
        if self.waiting.load(Relaxed) > 0 {
            self.process_events();
        }
        match self.try_allocate(layout, attrs) {
            Err(e) if matches!(e.kind(), AllocErrorKind::OutOfMemory | AllocErrorKind::LimitExceeded) => {
                let arenas = self.arenas.read().len();
                if self.waiting.load(Relaxed) == 0 && arenas == 0 {
                    return Err(e);
                }
                let freed = self.synchronize() + self.release_arenas(Some(attrs.stream));
                if freed == 0 { Err(e) } else { self.try_allocate(layout, attrs) }
            }
            r => r,
        }
    }

    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        let address = ptr.as_ptr() as usize;
        let stream = if self.owned.load(Relaxed) == 0 {
            StreamId::LEGACY
        } else {
            match self.owners.lock().remove(&address) {
                Some(s) => {
                    self.owned.fetch_sub(1, Relaxed);
                    s
                }
                None => StreamId::LEGACY,
            }
        };
        let used_on = if self.recorded.load(Relaxed) == 0 {
            None
        } else {
            self.uses.lock().remove(&address).inspect(|_| {
                self.recorded.fetch_sub(1, Relaxed);
            })
        };
        let Some(used_on) = used_on else {
            // SAFETY: the caller's promise: a live block of ours with `layout`, from this arena.
            let freed = self.with_arena(stream, |a| unsafe { a.deallocate_raw(ptr, layout) });
            if freed.is_none() {
                tracing::error!(allocator = %self.name, ?stream, address, "free of a block whose arena is gone");
            }
            return;
        };
        observe::freed(Layer::Caching, &self.name, address, layout.size());
        let mut events = Vec::with_capacity(used_on.len());
        for s in used_on {
            match self.events.record(s) {
                Ok(ev) => events.push((s, ev)),
                Err(e) => {
                    // Without the event nothing can tell when the other stream is done with the
                    // block: it is never reused (lost, not corrupted).
                    tracing::error!(allocator = %self.name, stream = ?s, %e, address, "event not recorded: the block is not reused");
                    for (_, ev) in events {
                        self.events.destroy(ev);
                    }
                    return;
                }
            }
        }
        let mut queue = self.pending.lock();
        queue.push_back(Pending { address, layout, stream, events });
        self.waiting.store(queue.len(), Relaxed);
    }

    fn tracks_allocation_sizes(&self) -> bool {
        true
    }

    fn requested_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        self.with_arena(self.owner(ptr.as_ptr() as usize), |a| a.requested_size(ptr)).flatten()
    }

    fn allocated_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        self.with_arena(self.owner(ptr.as_ptr() as usize), |a| a.allocated_size(ptr)).flatten()
    }

    fn allocation_id(&self, ptr: NonNull<u8>) -> Option<u64> {
        self.with_arena(self.owner(ptr.as_ptr() as usize), |a| a.allocation_id(ptr)).flatten()
    }

    fn stats(&self) -> Option<AllocatorStats> {
        let mut total = self.legacy.stats()?;
        let arenas = self.arenas.read();
        for (_, a) in arenas.iter() {
            let Some(s) = a.stats() else { continue };
            total.num_allocs += s.num_allocs;
            total.num_frees += s.num_frees;
            total.bytes_in_use += s.bytes_in_use;
            total.peak_bytes_in_use += s.peak_bytes_in_use;
            total.largest_alloc_size = total.largest_alloc_size.max(s.largest_alloc_size);
            total.bytes_reserved += s.bytes_reserved;
            total.peak_bytes_reserved += s.peak_bytes_reserved;
            total.largest_free_block_bytes = total.largest_free_block_bytes.max(s.largest_free_block_bytes);
            total.num_alloc_retries += s.num_alloc_retries;
            total.num_ooms += s.num_ooms;
            total.total_bytes_allocated = total.total_bytes_allocated.zip(s.total_bytes_allocated).map(|(a, b)| a + b);
        }
        if !arenas.is_empty() {
            // As a BFC reports it: 1 - largest free block / free bytes, over all arenas.
            let free = total.bytes_reserved.saturating_sub(total.bytes_in_use);
            total.fragmentation = Some(match total.largest_free_block_bytes {
                Some(largest) if free > 0 => 1.0 - largest as f64 / free as f64,
                _ => 0.0,
            });
        }
        Some(total)
    }

    fn clear_stats(&self) -> bool {
        self.legacy.clear_stats();
        for (_, a) in self.arenas.read().iter() {
            a.clear_stats();
        }
        true
    }

    /// The legacy stream's arena: memory dumps and what else only a BFC knows.
    fn backend(&self) -> Option<&dyn core::any::Any> {
        Some(&self.legacy)
    }

    fn stream_ordered(&self) -> Option<&dyn StreamOrdered> {
        Some(self)
    }

    /// Frees the blocks whose events have completed, then gives back every arena's cached
    /// memory.
    fn release_cached(&self) -> usize {
        self.process_events();
        self.release_arenas(None)
    }
}

impl<E: StreamEvents> StreamOrdered for StreamOrderedBfc<E> {
    fn record_stream(&self, ptr: NonNull<u8>, stream: StreamId) -> Result<(), StreamError> {
        let address = ptr.as_ptr() as usize;
        let Some(own) = self.block_stream(ptr) else {
            return Err(StreamError::NotLive { allocator: self.name.clone(), address });
        };
        if own == stream {
            return Ok(());
        }
        let mut uses = self.uses.lock();
        let list = uses.entry(address).or_insert_with(|| {
            self.recorded.fetch_add(1, Relaxed);
            Vec::new()
        });
        if !list.contains(&stream) {
            list.push(stream);
        }
        Ok(())
    }

    fn block_stream(&self, ptr: NonNull<u8>) -> Option<StreamId> {
        let address = ptr.as_ptr() as usize;
        if self.owned.load(Relaxed) > 0
            && let Some(&s) = self.owners.lock().get(&address)
        {
            return Some(s);
        }
        self.legacy.requested_size(ptr).map(|_| StreamId::LEGACY)
    }

    fn pending_frees(&self) -> usize {
        self.waiting.load(Relaxed)
    }

    fn process_events(&self) -> usize {
        let ready = {
            let mut queue = self.pending.lock();
            // A stream's events complete in order: past one that has not, none has.
            let mut busy: Vec<StreamId> = Vec::new();
            let mut ready = Vec::new();
            let mut keep = VecDeque::with_capacity(queue.len());
            for p in queue.drain(..) {
                let done = p.events.iter().all(|(s, ev)| {
                    if busy.contains(s) {
                        return false;
                    }
                    match self.events.query(ev) {
                        Ok(true) => true,
                        Ok(false) => {
                            busy.push(*s);
                            false
                        }
                        Err(e) => {
                            tracing::error!(allocator = %self.name, stream = ?s, %e, "event query failed");
                            busy.push(*s);
                            false
                        }
                    }
                });
                if done { ready.push(p) } else { keep.push_back(p) }
            }
            *queue = keep;
            self.waiting.store(queue.len(), Relaxed);
            ready
        };
        self.free_pending(ready)
    }

    fn synchronize(&self) -> usize {
        let all: Vec<Pending<E::Event>> = {
            let mut queue = self.pending.lock();
            self.waiting.store(0, Relaxed);
            queue.drain(..).collect()
        };
        for p in &all {
            for (s, ev) in &p.events {
                if let Err(e) = self.events.wait(ev) {
                    tracing::error!(allocator = %self.name, stream = ?s, %e, "event wait failed");
                }
            }
        }
        self.free_pending(all)
    }
}

impl<E: StreamEvents> Drop for StreamOrderedBfc<E> {
    fn drop(&mut self) {
        // Pending blocks go back to their arenas before the arenas go.
        self.synchronize();
    }
}

impl<E: StreamEvents> fmt::Debug for StreamOrderedBfc<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamOrderedBfc")
            .field("name", &self.name)
            .field("streams", &self.streams())
            .field("pending_frees", &self.pending_frees())
            .finish()
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::{AllocatorExt, FakeDeviceSubAllocator, FakeStreams};

    const G: usize = 64 << 10;
    const S1: StreamId = StreamId::from_raw(0x1000);
    const S2: StreamId = StreamId::from_raw(0x2000);

    fn device(units: usize) -> (Arc<FakeDeviceSubAllocator>, StreamOrderedBfc<FakeStreams>) {
        let sub = Arc::new(FakeDeviceSubAllocator::new(G, units * G));
        let template = BfcAllocator::builder()
            .name("fake:0")
            .memory_limit((units * G) as u64)
            .allow_growth(true)
            .sub_allocator(sub.clone());
        (sub, StreamOrderedBfc::new(template, FakeStreams::new()).unwrap())
    }

    fn on(stream: StreamId) -> AllocationAttributes {
        AllocationAttributes::DEFAULT.on_stream(stream)
    }

    fn alloc(a: &StreamOrderedBfc<FakeStreams>, bytes: usize, stream: StreamId) -> NonNull<u8> {
        a.allocate_raw(Layout::from_size_align(bytes, 256).unwrap(), &on(stream)).unwrap()
    }

    fn free(a: &StreamOrderedBfc<FakeStreams>, p: NonNull<u8>, bytes: usize) {
        // SAFETY: the tests free each block once, with the size it was allocated with.
        unsafe { a.deallocate_raw(p, Layout::from_size_align(bytes, 256).unwrap()) };
    }

    #[test]
    fn blocks_are_reused_on_their_own_stream_only() {
        let (sub, a) = device(64);
        let x = alloc(&a, 5000, S1);
        assert_eq!(a.block_stream(x), Some(S1));
        free(&a, x, 5000);
        // The same stream gets the block back at once: its work is queued after the last use.
        let y = alloc(&a, 5000, S1);
        assert_eq!(y, x);
        // Another stream never gets a block cached for S1.
        let z = alloc(&a, 5000, S2);
        assert_ne!(z, x);
        assert_eq!(a.block_stream(z), Some(S2));
        // Callers that name no stream use the legacy arena, as a plain BFC.
        let w = a.allocate::<u8>(5000).unwrap();
        assert_eq!(a.block_stream(w.cast()), Some(StreamId::LEGACY));
        assert_eq!(a.streams(), [StreamId::LEGACY, S1, S2]);
        assert_eq!(a.stats().unwrap().bytes_in_use, 3 * 5120);
        assert_eq!(a.requested_size(z), Some(5000));
        for (p, n) in [(y, 5000), (z, 5000), (w.cast(), 5000)] {
            free(&a, p, n);
        }
        assert_eq!(a.stats().unwrap().bytes_in_use, 0);
        assert_eq!(a.pending_frees(), 0);
        drop(a);
        let d = sub.memory().driver();
        assert_eq!((d.used_bytes(), d.mappings()), (0, 0));
        assert!(d.violations().is_empty(), "{:?}", d.violations());
    }

    #[test]
    fn a_block_used_on_another_stream_waits_for_that_work() {
        let (_sub, a) = device(64);
        let x = alloc(&a, 5000, S1);
        // A kernel on S2 reads the block; the caller records the use, then frees it.
        a.events().enqueue(S2);
        a.record_stream(x, S2).unwrap();
        a.record_stream(x, S2).unwrap();
        a.record_stream(x, S1).unwrap();
        free(&a, x, 5000);
        assert_eq!(a.pending_frees(), 1);
        assert_eq!(a.events().live_events(), 1, "one event, on S2 only");
        // S1's next request cannot get it while S2's kernel may still read it.
        let y = alloc(&a, 5000, S1);
        assert_ne!(y, x);
        assert_eq!(a.pending_frees(), 1);
        // Once S2's work completes, the next allocation's poll frees it, and S1 reuses it.
        a.events().complete(S2);
        free(&a, y, 5000);
        let z = alloc(&a, 5000, S1);
        assert_eq!(a.pending_frees(), 0);
        assert_eq!(a.events().live_events(), 0);
        let again = alloc(&a, 5000, S1);
        assert!(z == x || again == x, "the block is back in S1's free lists");
        free(&a, z, 5000);
        free(&a, again, 5000);
        assert_eq!(a.stats().unwrap().bytes_in_use, 0);
    }

    #[test]
    fn pending_frees_are_polled_in_order_without_looking_past_a_busy_stream() {
        let (_sub, a) = device(64);
        let blocks: Vec<_> = (0..3).map(|_| alloc(&a, 1000, S1)).collect();
        for &b in &blocks {
            a.events().enqueue(S2);
            a.record_stream(b, S2).unwrap();
            free(&a, b, 1000);
        }
        assert_eq!(a.pending_frees(), 3);
        // The first kernel on S2 is done: the first block goes back; the second's event is not
        // done, so the third's (later on the same stream) is not even asked.
        a.events().complete_one(S2);
        let before = a.events().queries();
        assert_eq!(a.process_events(), 1);
        assert_eq!(a.events().queries() - before, 2);
        assert_eq!(a.pending_frees(), 2);
        // Waiting frees the rest.
        assert_eq!(a.synchronize(), 2);
        assert_eq!((a.pending_frees(), a.events().live_events()), (0, 0));
        assert_eq!(a.stats().unwrap().bytes_in_use, 0);
    }

    #[test]
    fn stream_uses_of_what_is_not_live_are_refused() {
        let (_sub, a) = device(64);
        let x = alloc(&a, 1000, S1);
        free(&a, x, 1000);
        let e = a.record_stream(x, S2).unwrap_err();
        assert!(matches!(e, StreamError::NotLive { .. }), "{e}");
        assert!(e.to_string().contains("fake:0") && e.to_string().contains("not a live block"), "{e}");
        assert_eq!(a.block_stream(x), None);
    }

    #[test]
    fn a_refused_request_waits_for_pending_blocks_and_takes_other_streams_cache() {
        // A device of 16 units; each arena may take all of it.
        let (sub, a) = device(16);
        // S1 caches 8 units' worth after its block is freed.
        let x = alloc(&a, 8 * G, S1);
        free(&a, x, 8 * G);
        // S2 holds a block used on S1 by unfinished work, then frees it: pending.
        let y = alloc(&a, 4 * G, S2);
        a.events().enqueue(S1);
        a.record_stream(y, S1).unwrap();
        free(&a, y, 4 * G);
        assert_eq!(a.pending_frees(), 1);
        // A request of the legacy stream for 12 units fits only once S1's cache is given back
        // and the pending block has been waited for and S2's cache given back too.
        let z = alloc(&a, 12 * G, StreamId::LEGACY);
        assert_eq!(a.pending_frees(), 0);
        assert!(sub.memory().driver().used_bytes() <= 16 * G);
        free(&a, z, 12 * G);
        // Without anything to wait for or give back, a refusal stays a refusal.
        let too_big = a.allocate_raw(Layout::from_size_align(17 * G, 256).unwrap(), &on(S1)).unwrap_err();
        assert!(matches!(too_big.kind(), AllocErrorKind::OutOfMemory | AllocErrorKind::LimitExceeded), "{too_big}");
    }
}
