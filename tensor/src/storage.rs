//! [`Storage`]: the reference-counted bytes behind tensors (PyTorch's `StorageImpl`).

use core::alloc::Layout;
use core::cell::RefCell;
use core::fmt;
use core::marker::PhantomData;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicPtr, Ordering};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use smallvec::SmallVec;

use tensormem::allocators::{AllocError, AllocationAttributes, Allocator, MemorySpace, observe, transfer};

use super::{Result, TensorError};

/// Alignment of every storage obtained from an allocator (as PyTorch's CPU allocator).
pub const STORAGE_ALIGNMENT: usize = 64;

/// The bytes behind one or more tensors.
///
/// Cloning a `Storage` clones a reference; the bytes go back to the allocator that gave them
/// exactly once, when the last clone (and so the last tensor or view using it) is dropped.
///
/// A storage is one of:
/// - **allocated**: bytes from an [`Allocator`], possibly *lazily*: [`Storage::new_lazy`]
///   (and `Tensor::empty`/`zeros`) asks the allocator for nothing until the first access or
///   [`materialize`](Self::materialize). Fresh bytes read as zeros. The allocator may hand out
///   device memory ([`memory_space`](Self::memory_space)): such a storage is zeroed and copied
///   through the device's driver, and host code never touches it (tensor kernels refuse it).
/// - **mapped**: a read-only range of a file ([`Storage::map_file`]), for model weights;
///   unmapped when dropped, never given to an allocator. Writes through a tensor fail.
///
/// Tensors share storages between threads: in-place kernels take the storage's write lock,
/// readers a read lock, so a view written on one thread is never read half-written on another.
#[derive(Clone)]
pub struct Storage {
    inner: Arc<Inner>,
}

struct Inner {
    nbytes: usize,
    backing: Backing,
    /// Taken for reading by kernels that read this storage and for writing by kernels that
    /// write it, so that two views on two threads never race.
    access: RwLock<()>,
    /// What the first tensor on it was (`tensor f32 [2, 3]`), kept only when the creating
    /// thread was watched (a leak check, a scope or history), for leak reports.
    description: Option<Box<str>>,
}

enum Backing {
    Heap {
        allocator: Arc<dyn Allocator>,
        /// Null until materialised.
        ptr: AtomicPtr<u8>,
        init: Mutex<()>,
    },
    Mapped {
        map: Option<memmap2::Mmap>,
        /// Lists the mapping in the telemetry's ledger while it lives.
        _record: tensormem::telemetry::MappingRecord,
        path: PathBuf,
        offset: u64,
    },
}

fn layout(nbytes: usize) -> Option<Layout> {
    Layout::from_size_align(nbytes, STORAGE_ALIGNMENT).ok()
}

/// The layout of `nbytes`, in any memory space.
fn checked_layout(op: &'static str, nbytes: usize, allocator: &dyn Allocator) -> Result<Layout> {
    layout(nbytes).ok_or_else(|| TensorError::Alloc {
        op,
        source: AllocError::array_overflow(nbytes, Layout::new::<u8>(), allocator.name()),
    })
}

/// [`TensorError::DeviceMemory`] unless `allocator`'s memory is host memory.
pub(crate) fn check_host(op: &'static str, allocator: &dyn Allocator) -> Result<()> {
    let space = allocator.memory_space();
    if !space.is_host_accessible() {
        return Err(TensorError::DeviceMemory { op, allocator: allocator.name().to_owned(), device: space });
    }
    Ok(())
}

impl Storage {
    /// A storage of `nbytes` that asks `allocator` (host or device) for its bytes only when
    /// first used.
    ///
    /// # Errors
    /// [`TensorError::Alloc`] (size overflow) when `nbytes` cannot be a layout.
    pub fn new_lazy(nbytes: usize, allocator: Arc<dyn Allocator>) -> Result<Storage> {
        checked_layout("new_lazy", nbytes, &*allocator)?;
        Ok(Storage::heap(nbytes, allocator, core::ptr::null_mut()))
    }

    /// A storage of `nbytes` zeroed bytes, allocated now.
    ///
    /// # Errors
    /// [`TensorError::Alloc`] when the allocator refuses.
    pub fn new(nbytes: usize, allocator: Arc<dyn Allocator>) -> Result<Storage> {
        let s = Storage::new_lazy(nbytes, allocator)?;
        s.materialize()?;
        Ok(s)
    }

    /// A storage allocated now whose bytes are *not* initialised.
    ///
    /// # Safety
    /// The caller writes every byte before anything reads the storage (kernels create their
    /// outputs this way and fill them before returning the tensor).
    pub(crate) unsafe fn new_uninit(op: &'static str, nbytes: usize, allocator: Arc<dyn Allocator>) -> Result<Storage> {
        check_host(op, &*allocator)?;
        // SAFETY: forwarded; the memory is host memory, for the caller to write.
        unsafe { Storage::new_uninit_in_any_space(op, nbytes, allocator) }
    }

    /// As [`new_uninit`](Self::new_uninit), in any memory space.
    ///
    /// # Safety
    /// The caller writes every byte (with [`transfer`] for device memory) before anything reads
    /// the storage.
    pub(crate) unsafe fn new_uninit_in_any_space(
        op: &'static str,
        nbytes: usize,
        allocator: Arc<dyn Allocator>,
    ) -> Result<Storage> {
        let layout = checked_layout(op, nbytes, &*allocator)?;
        let ptr = allocator
            .allocate_raw(layout, &AllocationAttributes::default())
            .map_err(|source| TensorError::Alloc { op, source })?;
        Ok(Storage::heap(nbytes, allocator, ptr.as_ptr()))
    }

    fn heap(nbytes: usize, allocator: Arc<dyn Allocator>, ptr: *mut u8) -> Storage {
        Storage {
            inner: Arc::new(Inner {
                nbytes,
                backing: Backing::Heap { allocator, ptr: AtomicPtr::new(ptr), init: Mutex::new(()) },
                access: RwLock::new(()),
                description: None,
            }),
        }
    }

    /// Describes the storage as the tensor it is made for, when something watches this thread
    /// (see [`tensormem::allocators::observe::describe`]); already allocated
    /// storage is described to the observer now, lazy storage when it is materialised.
    pub(crate) fn described(mut self, dtype: super::DType, sizes: &[usize]) -> Storage {
        if !observe::watched() {
            return self;
        }
        let text = format!("tensor {dtype} {sizes:?}");
        let Backing::Heap { ptr, .. } = &self.inner.backing else { return self };
        let ptr = ptr.load(Ordering::Acquire);
        if !ptr.is_null() {
            observe::describe(ptr as usize, || text.clone());
        } else if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.description = Some(text.into());
        }
        self
    }

    /// Maps `len` bytes of the file at `path`, from byte `offset`, read-only.
    ///
    /// # Errors
    /// [`TensorError::Io`] when the file cannot be opened or mapped; [`TensorError::FileRange`]
    /// when `offset + len` is past the end of the file.
    ///
    /// # Safety
    /// The file must not be modified or truncated while the storage (or any tensor on it)
    /// lives: the mapping shows the file's bytes as they change, and a truncated file makes
    /// reads fault. This is the contract of [`memmap2::Mmap::map`].
    pub unsafe fn map_file(path: impl AsRef<Path>, offset: u64, len: usize) -> Result<Storage> {
        let path = path.as_ref();
        let io = |source| TensorError::Io { op: "map_file", path: path.to_path_buf(), source };
        let file = std::fs::File::open(path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|e| e > file_len) {
            return Err(TensorError::FileRange { path: path.to_path_buf(), offset, len: len as u64, file_len });
        }
        let map = if len == 0 {
            None
        } else {
            // SAFETY: the range is inside the file (checked above); the caller promises the
            // file is neither modified nor truncated while mapped, which is `Mmap::map`'s
            // contract.
            Some(unsafe { memmap2::MmapOptions::new().offset(offset).len(len).map(&file) }.map_err(io)?)
        };
        Ok(Storage {
            inner: Arc::new(Inner {
                nbytes: len,
                backing: Backing::Mapped {
                    map,
                    _record: tensormem::telemetry::record_mapping(path, len as u64),
                    path: path.to_path_buf(),
                    offset,
                },
                access: RwLock::new(()),
                description: None,
            }),
        })
    }

    /// Size in bytes.
    pub fn nbytes(&self) -> usize {
        self.inner.nbytes
    }

    /// The allocator that owns the bytes; `None` for a mapped file.
    pub fn allocator(&self) -> Option<&Arc<dyn Allocator>> {
        match &self.inner.backing {
            Backing::Heap { allocator, .. } => Some(allocator),
            Backing::Mapped { .. } => None,
        }
    }

    /// The name of the allocator that owns the bytes (`"mmap"` for a mapped file).
    pub fn allocator_name(&self) -> &str {
        match &self.inner.backing {
            Backing::Heap { allocator, .. } => allocator.name(),
            Backing::Mapped { .. } => "mmap",
        }
    }

    /// The mapped file and the byte offset of this storage in it, for mapped storages.
    pub fn mapped_file(&self) -> Option<(&Path, u64)> {
        match &self.inner.backing {
            Backing::Heap { .. } => None,
            Backing::Mapped { path, offset, .. } => Some((path, *offset)),
        }
    }

    /// Whether the bytes exist yet (always true for a mapped file).
    pub fn is_materialized(&self) -> bool {
        match &self.inner.backing {
            Backing::Heap { ptr, .. } => !ptr.load(Ordering::Acquire).is_null(),
            Backing::Mapped { .. } => true,
        }
    }

    /// Where the bytes live: the allocator's [`MemorySpace`] (host for a mapped file).
    pub fn memory_space(&self) -> MemorySpace {
        self.allocator().map_or(MemorySpace::Host, |a| a.memory_space())
    }

    /// [`TensorError::DeviceMemory`], naming `op`, unless host code may read and write the
    /// bytes.
    pub(crate) fn check_host(&self, op: &'static str) -> Result<()> {
        match self.allocator() {
            Some(a) => check_host(op, &**a),
            None => Ok(()),
        }
    }

    /// Whether writes are refused (a mapped file).
    pub fn is_read_only(&self) -> bool {
        matches!(self.inner.backing, Backing::Mapped { .. })
    }

    /// Allocates the bytes of a lazy storage (zero-filled, on the device for device memory) if
    /// that has not happened yet.
    ///
    /// # Errors
    /// [`TensorError::Alloc`] when the allocator refuses, [`TensorError::Transfer`] when device
    /// memory cannot be zeroed (no driver); the storage stays lazy.
    pub fn materialize(&self) -> Result<()> {
        let Backing::Heap { allocator, ptr, init } = &self.inner.backing else {
            return Ok(());
        };
        if !ptr.load(Ordering::Acquire).is_null() {
            return Ok(());
        }
        let _guard = init.lock();
        if !ptr.load(Ordering::Acquire).is_null() {
            return Ok(());
        }
        let layout = checked_layout("materialize", self.inner.nbytes, &**allocator)?;
        let p = allocator
            .allocate_raw(layout, &AllocationAttributes::default())
            .map_err(|source| TensorError::Alloc { op: "materialize", source })?;
        // SAFETY: `p` is valid for writes of `nbytes` bytes in the allocator's memory space (its
        // contract) and nobody else sees it before the store below publishes it.
        if let Err(source) = unsafe { transfer::fill_zero(p.as_ptr(), allocator.memory_space(), self.inner.nbytes) } {
            // SAFETY: `p` was just allocated with `layout` and nothing else has it.
            unsafe { allocator.deallocate_raw(p, layout) };
            return Err(TensorError::Transfer { op: "materialize", source });
        }
        if let Some(d) = &self.inner.description {
            observe::describe(p.as_ptr() as usize, || d.to_string());
        }
        ptr.store(p.as_ptr(), Ordering::Release);
        Ok(())
    }

    /// Whether `self` and `other` are the same storage (tensors on them share memory).
    pub fn same(&self, other: &Storage) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// How many handles (tensors, views, clones) share this storage.
    pub fn ref_count(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// The first byte. The storage must be materialised; a dangling (aligned) pointer when
    /// it has no bytes.
    pub(crate) fn data_ptr(&self) -> *mut u8 {
        match &self.inner.backing {
            Backing::Heap { ptr, .. } => {
                let p = ptr.load(Ordering::Acquire);
                debug_assert!(!p.is_null(), "storage used before materialize()");
                p
            }
            Backing::Mapped { map: Some(m), .. } => m.as_ptr() as *mut u8,
            Backing::Mapped { map: None, .. } => NonNull::<u64>::dangling().as_ptr().cast(),
        }
    }

    /// Shared access for readers.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, ()> {
        self.inner.access.read()
    }

    /// Exclusive access for a writer.
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, ()> {
        self.inner.access.write()
    }

    /// An address that orders storages, so that locks are always taken in one order.
    pub(crate) fn lock_order(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Backing::Heap { allocator, ptr, .. } = &self.backing {
            let p = ptr.load(Ordering::Acquire);
            if let (Some(p), Some(layout)) = (NonNull::new(p), layout(self.nbytes)) {
                // SAFETY: `p` came from `allocator.allocate_raw(layout(nbytes))` (in
                // `materialize` or `new_uninit`; the layout was valid there, so it is the same
                // here) and this is the last reference to it: `Inner` is dropped once, when
                // the last `Storage` clone goes.
                unsafe { allocator.deallocate_raw(p, layout) };
            }
        }
    }
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Storage")
            .field("nbytes", &self.nbytes())
            .field("allocator", &self.allocator_name())
            .field("materialized", &self.is_materialized())
            .field("refs", &self.ref_count())
            .finish()
    }
}

thread_local! {
    /// The storages this thread holds slice guards on ([`Tensor::as_slice`],
    /// [`Tensor::as_mut_slice`]): `(lock order, mutable, how many)`. Kernels check it before
    /// locking, so a thread that holds a guard gets an error instead of waiting for itself.
    ///
    /// [`Tensor::as_slice`]: super::Tensor::as_slice
    /// [`Tensor::as_mut_slice`]: super::Tensor::as_mut_slice
    static HELD: RefCell<Vec<(usize, bool, usize)>> = const { RefCell::new(Vec::new()) };
}

/// Whether this thread holds a slice guard on `storage`: `Some(mutable)`.
fn held(storage: &Storage) -> Option<bool> {
    let order = storage.lock_order();
    HELD.with_borrow(|h| h.iter().find(|e| e.0 == order).map(|e| e.1))
}

/// A slice guard's entry in this thread's [`HELD`] list, removed on drop. Not `Send`: it
/// must be dropped by the thread that holds the lock. `Sync` (it has no methods), so a slice
/// can still be shared with scoped threads by reference.
struct Held {
    order: usize,
    // `MutexGuard` is `!Send` and `Sync`, as this must be.
    _not_send: PhantomData<std::sync::MutexGuard<'static, ()>>,
}

impl Held {
    fn new(storage: &Storage, mutable: bool) -> Held {
        let order = storage.lock_order();
        HELD.with_borrow_mut(|h| match h.iter_mut().find(|e| e.0 == order) {
            Some(e) => e.2 += 1,
            None => h.push((order, mutable, 1)),
        });
        Held { order, _not_send: PhantomData }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD.with_borrow_mut(|h| {
            if let Some(i) = h.iter().position(|e| e.0 == self.order) {
                h[i].2 -= 1;
                if h[i].2 == 0 {
                    h.swap_remove(i);
                }
            }
        });
    }
}

/// The read lock behind a [`TensorSlice`](super::TensorSlice).
pub(crate) struct SliceRead<'a> {
    _guard: RwLockReadGuard<'a, ()>,
    _held: Held,
}

/// The write lock behind a [`TensorSliceMut`](super::TensorSliceMut).
pub(crate) struct SliceWrite<'a> {
    _guard: RwLockWriteGuard<'a, ()>,
    _held: Held,
}

impl Storage {
    /// The read lock for a slice of this storage. A thread may hold several (taken
    /// recursively, so a writer waiting in between does not make it wait for itself).
    ///
    /// # Errors
    /// [`TensorError::Borrowed`] when this thread holds a mutable slice of it.
    pub(crate) fn slice_read(&self, op: &'static str) -> Result<SliceRead<'_>> {
        match held(self) {
            Some(true) => Err(TensorError::Borrowed { op, mutable: true }),
            Some(false) => Ok(SliceRead { _guard: self.inner.access.read_recursive(), _held: Held::new(self, false) }),
            None => Ok(SliceRead { _guard: self.read(), _held: Held::new(self, false) }),
        }
    }

    /// The write lock for a mutable slice of this storage.
    ///
    /// # Errors
    /// [`TensorError::Borrowed`] when this thread holds any slice of it.
    pub(crate) fn slice_write(&self, op: &'static str) -> Result<SliceWrite<'_>> {
        match held(self) {
            Some(mutable) => Err(TensorError::Borrowed { op, mutable }),
            None => Ok(SliceWrite { _guard: self.write(), _held: Held::new(self, true) }),
        }
    }
}

/// Guards for every storage a kernel touches, taken in address order (so two kernels never
/// wait for each other) and once per storage (so `a + a` does not read-lock twice).
pub(crate) struct AccessGuards<'a> {
    _read: SmallVec<[RwLockReadGuard<'a, ()>; 3]>,
    _write: Option<RwLockWriteGuard<'a, ()>>,
}

/// Locks `write` (if any) for writing and every storage in `reads` that is not `write` for
/// reading. A storage this thread already holds a slice's read lock on is read without
/// locking it again (the slice's lock covers it).
///
/// # Errors
/// [`TensorError::Borrowed`] when this thread holds a slice guard that the access conflicts
/// with: a mutable slice of any of the storages, or a slice of `write` (taking the lock
/// would wait for this thread forever).
pub(crate) fn lock_storages<'a>(
    op: &'static str,
    write: Option<&'a Storage>,
    reads: &[&'a Storage],
) -> Result<AccessGuards<'a>> {
    let mut all: SmallVec<[(&'a Storage, bool); 4]> = reads.iter().map(|s| (*s, false)).collect();
    if let Some(w) = write {
        all.push((w, true));
    }
    // Writers sort after readers of the same storage, so dedup keeps the writer.
    all.sort_by_key(|(s, w)| (s.lock_order(), *w));
    let mut unique: SmallVec<[(&'a Storage, bool); 4]> = SmallVec::with_capacity(all.len());
    for (s, w) in all {
        match unique.last_mut() {
            Some(last) if last.0.same(s) => last.1 |= w,
            _ => unique.push((s, w)),
        }
    }
    if !HELD.with_borrow(Vec::is_empty) {
        let mut conflict = None;
        unique.retain(|&mut (s, w)| match held(s) {
            None => true,
            Some(mutable) => {
                if mutable || w {
                    conflict.get_or_insert(mutable);
                }
                false
            }
        });
        if let Some(mutable) = conflict {
            return Err(TensorError::Borrowed { op, mutable });
        }
    }
    let mut guards = AccessGuards { _read: SmallVec::with_capacity(unique.len()), _write: None };
    for (s, w) in unique {
        if w {
            guards._write = Some(s.write());
        } else {
            guards._read.push(s.read());
        }
    }
    Ok(guards)
}
