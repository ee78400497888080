//! [`FakeDevice`]: a [`UnitDriver`] over host memory that keeps a GPU's virtual memory rules,
//! so that device bookkeeping (unit mapping, relocation, a BFC's growth and give-back on device
//! memory, out of memory) is tested and measured on machines without a GPU. Linux only.
//!
//! Reservations are `PROT_NONE` mappings; the device's memory is one sparse `memfd` of its
//! capacity, a physical allocation a granule of it (its offset is the handle); mapping it is a
//! shared `MAP_FIXED` mapping of that part of the file with no access, which `set_access` opens
//! for reads and writes, and destroying it punches the granule out of the file. Mapping the same allocation at another address shows
//! the same bytes, as `cuMemMap` does. Every breach of the driver's rules (mapping over a
//! mapping, unmapping part of one, granting access where nothing is mapped, freeing a
//! reservation that still has mappings) is refused as the driver would and recorded in
//! [`FakeDevice::violations`], so a test can assert there were none.

use core::fmt;
use core::ptr::NonNull;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use crate::expandable::{reserve_again, reserve_aligned};
use crate::{ExpandableMemory, MemorySpace, StreamEvents, StreamId, SubAllocator, UnitDriver, UnitMemory};

/// A fake device: physical allocations of its granule up to a capacity, host-backed.
#[doc(hidden)]
pub struct FakeDevice {
    granule: usize,
    capacity: usize,
    name: String,
    state: Mutex<FakeState>,
}

struct FakeState {
    /// The device's memory: a sparse file of the capacity (-1 if it could not be made).
    fd: i32,
    /// Offsets of destroyed allocations, for the next ones.
    spare: Vec<u64>,
    /// The first offset never handed out.
    next: u64,
    /// Live reservations: start -> bytes.
    reservations: BTreeMap<usize, usize>,
    /// Mappings: start -> (bytes, allocation offset).
    mappings: BTreeMap<usize, (usize, u64)>,
    /// Physical allocations: offset -> (bytes, destroyed). A destroyed one lives on while it is
    /// mapped.
    handles: HashMap<u64, (usize, bool)>,
    /// Bytes of physical memory in use.
    used: usize,
    peak: usize,
    creates: u64,
    quiesces: u64,
    violations: Vec<String>,
}

impl FakeState {
    fn violation(&mut self, what: String) -> io::Error {
        self.violations.push(what.clone());
        io::Error::new(io::ErrorKind::InvalidInput, what)
    }

    /// Frees the physical memory of a destroyed allocation mapped nowhere.
    fn collect(&mut self, offset: u64) {
        let mapped = self.mappings.values().any(|&(_, o)| o == offset);
        if let Some(&(bytes, true)) = self.handles.get(&offset)
            && !mapped
        {
            self.handles.remove(&offset);
            self.used -= bytes;
            self.spare.push(offset);
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            // SAFETY: drops the pages of a part of our file that nothing maps any more.
            unsafe { libc::fallocate(self.fd, mode, offset as libc::off_t, bytes as libc::off_t) };
        }
    }
}

impl FakeDevice {
    /// A device with `capacity` bytes of memory in allocations of `granule` bytes (a multiple
    /// of the host page).
    pub fn new(granule: usize, capacity: usize) -> Self {
        // SAFETY: the name is a NUL-terminated literal.
        let fd = unsafe { libc::memfd_create(c"tensormem-fake-device".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: `fd` is the file just opened (or -1, which fails harmlessly); the file stays
        // sparse until written.
        if fd >= 0 && unsafe { libc::ftruncate(fd, capacity as libc::off_t) } != 0 {
            // SAFETY: as above, closed once; `create` then refuses.
            unsafe { libc::close(fd) };
        }
        let state = FakeState {
            fd,
            spare: Vec::new(),
            next: 0,
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
            handles: HashMap::new(),
            used: 0,
            peak: 0,
            creates: 0,
            quiesces: 0,
            violations: Vec::new(),
        };
        Self { granule, capacity, name: "fake:0".to_string(), state: Mutex::new(state) }
    }

    /// Physical bytes in use (allocations not destroyed, or destroyed but still mapped).
    pub fn used_bytes(&self) -> usize {
        self.state.lock().used
    }

    /// The most physical bytes in use at once.
    pub fn peak_bytes(&self) -> usize {
        self.state.lock().peak
    }

    /// How many physical allocations were created.
    pub fn creates(&self) -> u64 {
        self.state.lock().creates
    }

    /// How many times the device was asked to finish its queued work before an unmap.
    pub fn quiesces(&self) -> u64 {
        self.state.lock().quiesces
    }

    /// How many mappings exist now.
    pub fn mappings(&self) -> usize {
        self.state.lock().mappings.len()
    }

    /// The breaches of the driver's rules so far.
    pub fn violations(&self) -> Vec<String> {
        self.state.lock().violations.clone()
    }
}

// SAFETY: `reserve` makes fresh `PROT_NONE` mappings aligned to the granule; `map` replaces a
// granule-aligned, unmapped part of a live reservation (checked) with a shared mapping of the
// allocation's file, and `set_access` makes wholly mapped ranges readable and writable, so they
// are valid memory holding the file's bytes until `unmap` puts a `PROT_NONE` mapping back.
unsafe impl UnitDriver for FakeDevice {
    type Handle = u64;

    fn granule(&self) -> usize {
        self.granule
    }

    fn reserve(&self, bytes: usize) -> io::Result<NonNull<u8>> {
        let p = reserve_aligned(bytes, self.granule, false)?;
        self.state.lock().reservations.insert(p.as_ptr() as usize, bytes);
        Ok(p)
    }

    unsafe fn free_reservation(&self, ptr: NonNull<u8>, bytes: usize) {
        let start = ptr.as_ptr() as usize;
        let mut s = self.state.lock();
        if s.reservations.get(&start) != Some(&bytes) {
            let _ = s.violation(format!("free of {start:#x}+{bytes}, not a reservation"));
            return;
        }
        if s.mappings.range(start..start + bytes).next().is_some() {
            let _ = s.violation(format!("free of reservation {start:#x}+{bytes} with mappings left"));
            return;
        }
        s.reservations.remove(&start);
        // SAFETY: a reservation of ours with nothing mapped in it, unused from now on.
        unsafe { libc::munmap(ptr.as_ptr().cast(), bytes) };
    }

    fn create(&self, bytes: usize) -> io::Result<u64> {
        let mut s = self.state.lock();
        if bytes != self.granule {
            return Err(s.violation(format!("create of {bytes} bytes, not one granule of {}", self.granule)));
        }
        if s.fd < 0 || s.used + bytes > self.capacity {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("{}: out of memory ({} of {} bytes in use)", self.name, s.used, self.capacity),
            ));
        }
        let offset = match s.spare.pop() {
            Some(o) => o,
            None => {
                s.next += bytes as u64;
                s.next - bytes as u64
            }
        };
        s.handles.insert(offset, (bytes, false));
        s.used += bytes;
        s.peak = s.peak.max(s.used);
        s.creates += 1;
        Ok(offset)
    }

    unsafe fn destroy(&self, handle: u64) {
        let mut s = self.state.lock();
        match s.handles.get_mut(&handle) {
            Some((_, destroyed @ false)) => *destroyed = true,
            _ => {
                let _ = s.violation(format!("destroy of handle {handle}, not live"));
                return;
            }
        }
        s.collect(handle);
    }

    unsafe fn map(&self, at: NonNull<u8>, bytes: usize, handle: u64) -> io::Result<()> {
        let start = at.as_ptr() as usize;
        let mut s = self.state.lock();
        match s.handles.get(&handle).copied() {
            Some((size, false)) if size == bytes => {}
            other => return Err(s.violation(format!("map of handle {handle} ({other:?}) as {bytes} bytes"))),
        }
        let inside = s.reservations.range(..=start).next_back().is_some_and(|(&r, &n)| start + bytes <= r + n);
        let overlaps = s.mappings.range(..start + bytes).next_back().is_some_and(|(&m, &(n, _))| m + n > start);
        if !inside || overlaps || !start.is_multiple_of(self.granule) {
            return Err(s.violation(format!(
                "map at {start:#x}+{bytes}: {}",
                if !inside {
                    "outside any reservation"
                } else if overlaps {
                    "over a mapping"
                } else {
                    "unaligned"
                }
            )));
        }
        let flags = libc::MAP_SHARED | libc::MAP_FIXED;
        // SAFETY: the range is an unmapped part of a live reservation of ours (checked), so
        // `MAP_FIXED` replaces only our `PROT_NONE` placeholder; the allocation lies in the file.
        let p = unsafe { libc::mmap(at.as_ptr().cast(), bytes, libc::PROT_NONE, flags, s.fd, handle as libc::off_t) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        s.mappings.insert(start, (bytes, handle));
        Ok(())
    }

    fn quiesce(&self) {
        self.state.lock().quiesces += 1;
    }

    unsafe fn unmap(&self, at: NonNull<u8>, bytes: usize) {
        let start = at.as_ptr() as usize;
        let mut s = self.state.lock();
        let Some(&(n, offset)) = s.mappings.get(&start).filter(|&&(n, _)| n == bytes) else {
            let _ = s.violation(format!("unmap of {start:#x}+{bytes}, not one whole mapping"));
            return;
        };
        s.mappings.remove(&start);
        // SAFETY: one of our mappings inside a reservation; the caller promises nothing uses it.
        unsafe { reserve_again(at, n, false) };
        s.collect(offset);
    }

    unsafe fn set_access(&self, at: NonNull<u8>, bytes: usize) -> io::Result<()> {
        let (start, end) = (at.as_ptr() as usize, at.as_ptr() as usize + bytes);
        let mut s = self.state.lock();
        let mut covered = start;
        for (&m, &(n, _)) in s.mappings.range(..end) {
            if m + n > covered && m <= covered {
                covered = m + n;
            }
        }
        if covered < end {
            return Err(s.violation(format!("access to {start:#x}+{bytes}: {covered:#x} is not mapped")));
        }
        // SAFETY: the range is wholly mapped by our shared mappings (checked).
        if unsafe { libc::mprotect(at.as_ptr().cast(), bytes, libc::PROT_READ | libc::PROT_WRITE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn memory_space(&self) -> MemorySpace {
        MemorySpace::Host
    }
}

impl fmt::Debug for FakeDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.state.lock();
        f.debug_struct("FakeDevice")
            .field("granule", &self.granule)
            .field("capacity", &self.capacity)
            .field("used", &s.used)
            .field("mappings", &s.mappings.len())
            .finish()
    }
}

impl Drop for FakeState {
    fn drop(&mut self) {
        if self.fd >= 0 {
            // SAFETY: our memfd, closed once; mappings left keep their pages until unmapped.
            unsafe { libc::close(self.fd) };
        }
    }
}

/// A [`SubAllocator`] whose expandable memory is a [`FakeDevice`] behind [`UnitMemory`], as
/// [`CudaSubAllocator`](crate::cuda::CudaSubAllocator) is a GPU behind `CudaMemory`: a
/// [`BfcAllocator`](crate::BfcAllocator) on it grows, gives back and moves memory in the
/// device's granules. It has no plain regions (a BFC on it is always expandable).
#[doc(hidden)]
#[derive(Debug)]
pub struct FakeDeviceSubAllocator {
    memory: Arc<UnitMemory<FakeDevice>>,
}

impl FakeDeviceSubAllocator {
    /// A fake device of `capacity` bytes in `granule`-sized allocations.
    pub fn new(granule: usize, capacity: usize) -> Self {
        Self { memory: Arc::new(UnitMemory::new(FakeDevice::new(granule, capacity))) }
    }

    /// The unit-mapped memory (and through it, the device).
    pub fn memory(&self) -> &Arc<UnitMemory<FakeDevice>> {
        &self.memory
    }
}

// SAFETY: it never hands out plain regions; its expandable memory is `UnitMemory`'s contract.
unsafe impl SubAllocator for FakeDeviceSubAllocator {
    fn alloc_region(&self, _min_bytes: usize, _alignment: usize) -> Option<(NonNull<u8>, usize)> {
        None
    }

    unsafe fn free_region(&self, _ptr: NonNull<u8>, _bytes: usize) {}

    fn max_alignment(&self) -> usize {
        self.memory.granule()
    }

    fn expandable(&self) -> Option<&dyn ExpandableMemory> {
        Some(&*self.memory as &dyn ExpandableMemory)
    }
}

/// Fake device streams for [`StreamEvents`]: a test queues work on a stream
/// ([`enqueue`](Self::enqueue)) and says when it is done ([`complete`](Self::complete)); an
/// event completes once the work queued before it was recorded has.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct FakeStreams {
    /// Per stream: (work queued, work completed).
    state: Mutex<HashMap<StreamId, (u64, u64)>>,
    queries: AtomicU64,
    live_events: AtomicI64,
}

impl FakeStreams {
    /// Streams with nothing queued.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues one piece of work on `stream`.
    pub fn enqueue(&self, stream: StreamId) {
        self.state.lock().entry(stream).or_default().0 += 1;
    }

    /// Completes the work queued on `stream` so far.
    pub fn complete(&self, stream: StreamId) {
        let mut s = self.state.lock();
        let e = s.entry(stream).or_default();
        e.1 = e.0;
    }

    /// Completes the oldest unfinished piece of work on `stream`.
    pub fn complete_one(&self, stream: StreamId) {
        let mut s = self.state.lock();
        let e = s.entry(stream).or_default();
        e.1 = (e.1 + 1).min(e.0);
    }

    /// How many times an event was queried.
    pub fn queries(&self) -> u64 {
        self.queries.load(Relaxed)
    }

    /// Events recorded and not destroyed.
    pub fn live_events(&self) -> i64 {
        self.live_events.load(Relaxed)
    }
}

impl StreamEvents for FakeStreams {
    /// The stream and how much work was queued on it when the event was recorded.
    type Event = (StreamId, u64);

    fn record(&self, stream: StreamId) -> io::Result<(StreamId, u64)> {
        self.live_events.fetch_add(1, Relaxed);
        Ok((stream, self.state.lock().entry(stream).or_default().0))
    }

    fn query(&self, &(stream, queued): &(StreamId, u64)) -> io::Result<bool> {
        self.queries.fetch_add(1, Relaxed);
        Ok(self.state.lock().get(&stream).is_none_or(|&(_, done)| done >= queued))
    }

    fn wait(&self, &(stream, queued): &(StreamId, u64)) -> io::Result<()> {
        // The fake device runs the work the caller waits for.
        let mut s = self.state.lock();
        let e = s.entry(stream).or_default();
        e.1 = e.1.max(queued);
        Ok(())
    }

    fn destroy(&self, _event: (StreamId, u64)) {
        self.live_events.fetch_sub(1, Relaxed);
    }
}
