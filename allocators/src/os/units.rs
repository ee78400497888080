//! [`UnitMemory`]: expandable memory committed in granule-sized units, each backed by a physical
//! allocation of its own, over a [`UnitDriver`] that can only map and unmap physical allocations
//! whole (a GPU's virtual memory: `cuMemCreate` + `cuMemMap`).
//!
//! One mapping per commit could only be given back whole, and never moved; one per unit lets a
//! caching allocator give back any granule-aligned part of what it committed and move free units
//! to where a block needs memory ([`ExpandableMemory::relocate`]: unmap the unit, map its
//! physical allocation at the new address; nothing is copied). This is how PyTorch's expandable
//! segments map device memory.

use core::fmt;
use core::ptr::NonNull;
use std::collections::BTreeMap;
use std::io;

use parking_lot::Mutex;

use crate::{ExpandableMemory, MemorySpace};

/// The virtual memory calls of a device whose physical allocations are mapped and unmapped
/// whole: what [`UnitMemory`] is built on. CUDA's driver API implements it for
/// [`CudaMemory`](crate::cuda::CudaMemory) (feature `cuda`); HIP's `hipMemCreate` /
/// `hipMemMap` have the same shape.
///
/// # Safety
/// Implementors promise that `reserve` returns address space aligned to the granule that no
/// one else uses until `free_reservation`, and that after `map` and `set_access` succeed over a
/// range, that range is valid memory (on its device) holding the physical allocation's bytes
/// until it is unmapped; mapping one physical allocation at another address shows the same
/// bytes there.
pub unsafe trait UnitDriver: Send + Sync + fmt::Debug {
    /// A physical allocation.
    type Handle: Copy + Send + fmt::Debug;

    /// The unit of reservation, physical allocation and mapping.
    fn granule(&self) -> usize;

    /// Reserves `bytes` (a multiple of the granule) of address space, aligned to the granule,
    /// with nothing mapped.
    ///
    /// # Errors
    /// The device's refusal.
    fn reserve(&self, bytes: usize) -> io::Result<NonNull<u8>>;

    /// Frees a reservation from [`reserve`](Self::reserve).
    ///
    /// # Safety
    /// Nothing may be mapped in it any more, and it is not used afterwards.
    unsafe fn free_reservation(&self, ptr: NonNull<u8>, bytes: usize);

    /// Creates a physical allocation of `bytes` (the granule).
    ///
    /// # Errors
    /// The device's refusal; `ErrorKind::OutOfMemory` when it has no memory left.
    fn create(&self, bytes: usize) -> io::Result<Self::Handle>;

    /// Destroys a physical allocation (its memory is freed once it is mapped nowhere).
    ///
    /// # Safety
    /// `handle` came from [`create`](Self::create) and is not destroyed twice.
    unsafe fn destroy(&self, handle: Self::Handle);

    /// Maps all of `handle` at `at` (no access yet).
    ///
    /// # Errors
    /// The device's refusal; nothing is mapped then.
    ///
    /// # Safety
    /// `at..at + bytes` lies in a live reservation, is granule-aligned and not mapped; `bytes`
    /// is the handle's size.
    unsafe fn map(&self, at: NonNull<u8>, bytes: usize, handle: Self::Handle) -> io::Result<()>;

    /// Waits until device work queued so far can no longer use memory about to be unmapped.
    /// A caching allocator frees a block on the host while kernels queued before may still use
    /// it, and unmapping memory under a running kernel faults it; [`UnitMemory`] calls this once
    /// before it unmaps units that held blocks (CUDA: `cuCtxSynchronize`, as PyTorch synchronises
    /// before it unmaps an expandable segment's memory).
    fn quiesce(&self);

    /// Unmaps one mapping made by [`map`](Self::map), exactly as it was mapped.
    ///
    /// # Safety
    /// Nothing uses the range afterwards.
    unsafe fn unmap(&self, at: NonNull<u8>, bytes: usize);

    /// Grants the device read and write access to `at..at + bytes`, which may span several
    /// mappings.
    ///
    /// # Errors
    /// The device's refusal.
    ///
    /// # Safety
    /// The range is wholly mapped.
    unsafe fn set_access(&self, at: NonNull<u8>, bytes: usize) -> io::Result<()>;

    /// A short name for messages (`cuda:0`).
    fn name(&self) -> &str;

    /// Where the memory lives.
    fn memory_space(&self) -> MemorySpace;
}

/// [`ExpandableMemory`] over a [`UnitDriver`], one physical allocation per granule, so that it
/// [decommits partially](ExpandableMemory::decommits_partially) and
/// [relocates](ExpandableMemory::relocate) like host pages do: a
/// [`BfcAllocator`](crate::BfcAllocator) on it gives back and moves device memory exactly as it
/// does host memory.
///
/// A commit of `n` granules creates and maps `n` physical allocations and grants access once
/// over the whole range; a decommit unmaps and destroys the units it covers; a relocation
/// unmaps each unit and maps its physical allocation at the destination. A failure half-way
/// undoes what the call did, so every range stays as it was.
pub struct UnitMemory<D: UnitDriver> {
    driver: D,
    unit: usize,
    /// Each mapped unit's address -> its physical allocation.
    units: Mutex<BTreeMap<usize, D::Handle>>,
}

impl<D: UnitDriver> UnitMemory<D> {
    /// Unit-mapped memory of `driver`, at its granule.
    pub fn new(driver: D) -> Self {
        let unit = driver.granule().max(1);
        Self { driver, unit, units: Mutex::new(BTreeMap::new()) }
    }

    /// The driver.
    pub fn driver(&self) -> &D {
        &self.driver
    }

    /// How many units are mapped now (each holds one granule of physical memory).
    pub fn mapped_units(&self) -> usize {
        self.units.lock().len()
    }

    /// The unit addresses of `ptr..ptr + bytes`.
    fn unit_addresses(&self, ptr: NonNull<u8>, bytes: usize) -> impl Iterator<Item = usize> + use<D> {
        let (start, unit) = (ptr.as_ptr() as usize, self.unit);
        (0..bytes / unit).map(move |i| start + i * unit)
    }

    /// Unmaps and destroys units taken out of the table.
    ///
    /// # Safety
    /// Each is mapped at its address and nothing uses it any more.
    unsafe fn drop_units(&self, units: impl IntoIterator<Item = (usize, D::Handle)>) {
        for (address, handle) in units {
            // SAFETY: the caller's promise.
            unsafe {
                self.driver.unmap(at(address), self.unit);
                self.driver.destroy(handle);
            }
        }
    }
}

fn at(address: usize) -> NonNull<u8> {
    NonNull::new(address as *mut u8).expect("unit addresses lie in a reservation, never at 0")
}

// SAFETY: `reserve` is the driver's (granule-aligned, unique while it lives). A committed range
// is mapped unit by unit to physical allocations of its own and made accessible before `commit`
// returns `Ok`, so it is valid memory until `decommit` unmaps those units or `relocate` moves
// them; `relocate` maps the same physical allocations at the destination, which then holds the
// bytes the source held. Failures undo every unit the call changed.
unsafe impl<D: UnitDriver> ExpandableMemory for UnitMemory<D> {
    fn granule(&self) -> usize {
        self.unit
    }

    fn reserve(&self, bytes: usize) -> io::Result<NonNull<u8>> {
        self.driver.reserve(bytes)
    }

    unsafe fn commit(&self, ptr: NonNull<u8>, bytes: usize) -> io::Result<()> {
        let mut made: Vec<(usize, D::Handle)> = Vec::with_capacity(bytes / self.unit);
        let mut failed = None;
        for address in self.unit_addresses(ptr, bytes) {
            let handle = match self.driver.create(self.unit) {
                Ok(h) => h,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            // SAFETY: the caller promises the range is reserved, aligned and not committed.
            if let Err(e) = unsafe { self.driver.map(at(address), self.unit, handle) } {
                // SAFETY: created just above, mapped nowhere.
                unsafe { self.driver.destroy(handle) };
                failed = Some(e);
                break;
            }
            made.push((address, handle));
        }
        if failed.is_none() {
            // SAFETY: every unit of the range was mapped above.
            failed = unsafe { self.driver.set_access(ptr, bytes) }.err();
        }
        if let Some(e) = failed {
            // SAFETY: these units were mapped by this call and nothing has seen them.
            unsafe { self.drop_units(made) };
            return Err(e);
        }
        self.units.lock().extend(made);
        Ok(())
    }

    unsafe fn decommit(&self, ptr: NonNull<u8>, bytes: usize) {
        let taken: Vec<(usize, D::Handle)> = {
            let mut units = self.units.lock();
            self.unit_addresses(ptr, bytes).filter_map(|a| units.remove(&a).map(|h| (a, h))).collect()
        };
        if taken.len() != bytes / self.unit {
            tracing::error!(
                memory = self.driver.name(),
                at = ptr.as_ptr() as usize,
                bytes,
                mapped = taken.len() * self.unit,
                "decommit of a range not wholly committed"
            );
        }
        if !taken.is_empty() {
            self.driver.quiesce();
        }
        // SAFETY: the caller promises nothing uses the range (and queued device work is done);
        // these units were mapped in it.
        unsafe { self.drop_units(taken) };
    }

    unsafe fn release(&self, ptr: NonNull<u8>, bytes: usize) {
        let start = ptr.as_ptr() as usize;
        let inside: Vec<(usize, D::Handle)> = {
            let mut units = self.units.lock();
            let keys: Vec<usize> = units.range(start..start + bytes).map(|(&a, _)| a).collect();
            keys.into_iter().filter_map(|a| units.remove(&a).map(|h| (a, h))).collect()
        };
        if !inside.is_empty() {
            self.driver.quiesce();
        }
        // SAFETY: the caller promises nothing uses the reservation (and queued device work is
        // done); these units were mapped in it, and once they are gone nothing is.
        unsafe {
            self.drop_units(inside);
            self.driver.free_reservation(ptr, bytes);
        }
    }

    fn relocates(&self) -> bool {
        true
    }

    unsafe fn relocate(&self, from: NonNull<u8>, to: NonNull<u8>, bytes: usize) -> io::Result<()> {
        let mut units = self.units.lock();
        let sources: Vec<usize> = self.unit_addresses(from, bytes).collect();
        if let Some(&missing) = sources.iter().find(|a| !units.contains_key(a)) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: relocate from {missing:#x}, which is not committed", self.driver.name()),
            ));
        }
        let targets: Vec<usize> = self.unit_addresses(to, bytes).collect();
        if !sources.is_empty() {
            self.driver.quiesce();
        }
        let mut moved = 0;
        let mut failed = None;
        for (&src, &dst) in sources.iter().zip(&targets) {
            let handle = units[&src];
            // SAFETY: the caller promises the source is unused and the destination reserved and
            // not committed; the unit is mapped at `src` (checked above).
            unsafe { self.driver.unmap(at(src), self.unit) };
            // SAFETY: as above.
            if let Err(e) = unsafe { self.driver.map(at(dst), self.unit, handle) } {
                // SAFETY: `src` was this unit's mapping a moment ago and is free again.
                if let Err(back) = unsafe { self.driver.map(at(src), self.unit, handle) } {
                    // The unit is mapped nowhere: give its memory back rather than lose track.
                    tracing::error!(memory = self.driver.name(), at = src, %back, "a unit could not be mapped back");
                    units.remove(&src);
                    // SAFETY: mapped nowhere now.
                    unsafe { self.driver.destroy(handle) };
                }
                failed = Some(e);
                break;
            }
            units.remove(&src);
            units.insert(dst, handle);
            moved += 1;
        }
        if failed.is_none() {
            // SAFETY: every unit of the destination was mapped above.
            failed = unsafe { self.driver.set_access(to, bytes) }.err();
        }
        let Some(e) = failed else { return Ok(()) };
        // Put the units that moved back where they were.
        for (&src, &dst) in sources.iter().zip(&targets).take(moved) {
            let Some(handle) = units.remove(&dst) else { continue };
            // SAFETY: mapped at `dst` by this call and not used yet; `src` is free again.
            unsafe { self.driver.unmap(at(dst), self.unit) };
            // SAFETY: as above.
            match unsafe { self.driver.map(at(src), self.unit, handle) } {
                Ok(()) => {
                    units.insert(src, handle);
                }
                Err(back) => {
                    tracing::error!(memory = self.driver.name(), at = src, %back, "a unit could not be mapped back");
                    // SAFETY: mapped nowhere now.
                    unsafe { self.driver.destroy(handle) };
                }
            }
        }
        // Mapping a unit again took its access away: grant it to every unit back at the source
        // (those that moved and came back, and the one whose move failed).
        for &src in sources.iter().take(moved + 1) {
            if units.contains_key(&src) {
                // SAFETY: the unit is mapped at `src` (it is in the table).
                let _ = unsafe { self.driver.set_access(at(src), self.unit) };
            }
        }
        Err(e)
    }

    fn name(&self) -> &str {
        self.driver.name()
    }

    fn memory_space(&self) -> MemorySpace {
        self.driver.memory_space()
    }
}

impl<D: UnitDriver> Drop for UnitMemory<D> {
    fn drop(&mut self) {
        // Reservations are released by their owner before this; units left mapped would leak
        // device memory, so they are given back.
        let left = core::mem::take(&mut *self.units.lock());
        if !left.is_empty() {
            tracing::warn!(
                memory = self.driver.name(),
                units = left.len(),
                "units still mapped when the memory was dropped"
            );
            // SAFETY: the memory is being dropped, so no allocator uses these units any more.
            unsafe { self.drop_units(left) };
        }
    }
}

impl<D: UnitDriver> fmt::Debug for UnitMemory<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UnitMemory")
            .field("driver", &self.driver)
            .field("unit", &self.unit)
            .field("mapped_units", &self.mapped_units())
            .finish()
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::{Allocator, AllocatorExt, BfcAllocator, FakeDevice, FakeDeviceSubAllocator};
    use std::sync::Arc;

    const G: usize = 64 << 10;

    fn memory(capacity_units: usize) -> UnitMemory<FakeDevice> {
        UnitMemory::new(FakeDevice::new(G, capacity_units * G))
    }

    fn byte(p: NonNull<u8>, offset: usize) -> *mut u8 {
        // SAFETY (for callers): offsets stay inside the committed units they name.
        p.as_ptr().wrapping_add(offset)
    }

    #[test]
    fn units_are_committed_given_back_and_moved_one_by_one() {
        let m = memory(16);
        let base = m.reserve(8 * G).unwrap();
        // SAFETY: the first three units of a fresh reservation.
        unsafe { m.commit(base, 3 * G) }.unwrap();
        assert_eq!((m.mapped_units(), m.driver().used_bytes(), m.driver().mappings()), (3, 3 * G, 3));
        assert_eq!(m.driver().quiesces(), 0, "fresh units need no wait");
        // SAFETY: committed above; each unit gets its own mark.
        unsafe { (0..3).for_each(|u| byte(base, u * G + 5).write(u as u8 + 10)) };

        // Any granule-aligned part goes back: the middle unit, its memory with it.
        // SAFETY: the middle unit is committed and unused.
        unsafe { m.decommit(NonNull::new(byte(base, G)).unwrap(), G) };
        assert_eq!((m.mapped_units(), m.driver().used_bytes()), (2, 2 * G));
        assert_eq!(m.driver().quiesces(), 1, "queued work finishes before units are unmapped");
        // SAFETY: units 0 and 2 are still committed.
        unsafe { assert_eq!((byte(base, 5).read(), byte(base, 2 * G + 5).read()), (10, 12)) };

        // Moving units maps their physical memory elsewhere: same bytes, nothing created.
        let creates = m.driver().creates();
        let to = NonNull::new(byte(base, 5 * G)).unwrap();
        // SAFETY: unit 0 is committed and unused; units 5 and 6 are reserved, not committed.
        unsafe { m.relocate(base, to, G) }.unwrap();
        // SAFETY: unit 2 moves to unit 6 (units 5..7 are not committed after the first move).
        unsafe { m.relocate(NonNull::new(byte(base, 2 * G)).unwrap(), NonNull::new(byte(base, 6 * G)).unwrap(), G) }
            .unwrap();
        assert_eq!((m.driver().creates(), m.driver().used_bytes(), m.mapped_units()), (creates, 2 * G, 2));
        assert_eq!(m.driver().quiesces(), 3, "each move waits once");
        // SAFETY: units 5 and 6 are committed now, writable.
        unsafe {
            assert_eq!((byte(base, 5 * G + 5).read(), byte(base, 6 * G + 5).read()), (10, 12));
            byte(base, 6 * G + G - 1).write(1);
        }
        // Committing where memory moved from works again.
        // SAFETY: units 0..3 are reserved and no longer committed.
        unsafe { m.commit(base, 3 * G) }.unwrap();
        assert_eq!(m.driver().used_bytes(), 5 * G);

        // SAFETY: the reservation, nothing in use.
        unsafe { m.release(base, 8 * G) };
        assert_eq!((m.mapped_units(), m.driver().used_bytes(), m.driver().mappings()), (0, 0, 0));
        assert!(m.driver().violations().is_empty(), "{:?}", m.driver().violations());
    }

    #[test]
    fn a_refused_commit_or_move_leaves_everything_as_it_was() {
        let m = memory(4);
        let base = m.reserve(8 * G).unwrap();
        // SAFETY: a fresh reservation; two units.
        unsafe { m.commit(base, 2 * G) }.unwrap();
        // SAFETY: committed.
        unsafe { byte(base, 7).write(42) };
        // Three more units than the device has: out of memory, none of them kept.
        let at2 = NonNull::new(byte(base, 2 * G)).unwrap();
        // SAFETY: units 2..5 are reserved, not committed.
        let e = unsafe { m.commit(at2, 3 * G) }.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::OutOfMemory, "{e}");
        assert_eq!((m.mapped_units(), m.driver().used_bytes(), m.driver().mappings()), (2, 2 * G, 2));
        // The two units that fit can still be committed.
        // SAFETY: as above.
        unsafe { m.commit(at2, 2 * G) }.unwrap();

        // Moving from memory that is not committed is refused before anything moves.
        let at6 = NonNull::new(byte(base, 6 * G)).unwrap();
        // SAFETY: unit 6 is not committed (refused, as tested); unit 7 is reserved.
        let e = unsafe { m.relocate(at6, NonNull::new(byte(base, 7 * G)).unwrap(), G) }.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        // A move whose second destination unit is mapped already (the driver refuses it) puts
        // the first unit back: units 0 and 1 keep their bytes and stay writable.
        // SAFETY: unit 2 is committed and unused.
        unsafe { m.decommit(at2, G) };
        // SAFETY: a deliberate breach of `relocate`'s contract (unit 3, the second destination
        // unit, is committed): what is tested is what the driver's refusal leaves.
        let r = unsafe { m.relocate(base, at2, 2 * G) };
        assert!(r.is_err());
        assert_eq!(m.driver().violations().len(), 1, "{:?}", m.driver().violations());
        assert_eq!((m.mapped_units(), m.driver().used_bytes(), m.driver().mappings()), (3, 3 * G, 3));
        // SAFETY: units 0 and 1 are committed again, with their access.
        unsafe {
            assert_eq!(byte(base, 7).read(), 42);
            byte(base, 2 * G - 1).write(1);
        }
        // SAFETY: the reservation, nothing in use.
        unsafe { m.release(base, 8 * G) };
        assert_eq!(m.driver().used_bytes(), 0);
    }

    #[test]
    fn a_bfc_on_device_units_gives_back_and_moves_memory_like_on_host_pages() {
        let sub = Arc::new(FakeDeviceSubAllocator::new(G, 64 * G));
        let bfc = BfcAllocator::builder().memory_limit(64 * G as u64).sub_allocator(sub.clone()).build().unwrap();
        assert!(bfc.is_expandable());
        let device = sub.memory().driver();
        let blocks: Vec<_> = (0..8).map(|_| bfc.allocate::<u8>(3 * G).unwrap()).collect();
        assert_eq!(device.used_bytes(), bfc.stats().unwrap().bytes_reserved as usize);
        // Free every other block: the free units between live blocks can be given back, which
        // one mapping per commit could not do.
        for (i, b) in blocks.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
            let _ = i;
            // SAFETY: allocated above with this size, freed once.
            unsafe { bfc.deallocate(*b, 3 * G) };
        }
        // A block that fits in no hole takes the free units between live blocks to the end
        // instead of creating memory for all of it.
        let creates = device.creates();
        let big = bfc.allocate::<u8>(12 * G).unwrap();
        assert!(device.creates() > creates);
        // SAFETY: allocated just above.
        unsafe { bfc.deallocate(big, 12 * G) };
        bfc.release_cached();
        assert_eq!(device.used_bytes(), 4 * 3 * G, "only the live blocks' units are left: {device:?}");
        // An allocation larger than the device has free fails cleanly, and the device's memory
        // is what the BFC says it holds.
        assert!(bfc.allocate::<u8>(60 * G).is_err());
        assert_eq!(device.used_bytes(), bfc.stats().unwrap().bytes_reserved as usize);
        for b in blocks.iter().skip(1).step_by(2) {
            // SAFETY: the live blocks, freed once.
            unsafe { bfc.deallocate(*b, 3 * G) };
        }
        drop(bfc);
        assert_eq!((device.used_bytes(), device.mappings()), (0, 0));
        assert!(device.violations().is_empty(), "{:?}", device.violations());
    }
}
