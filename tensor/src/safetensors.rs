//! Model weights from [safetensors](https://github.com/huggingface/safetensors) files: the file
//! is mapped once, read-only, and every tensor in it is a view of that one mapping (no copy, no
//! allocator involved). The mapping is listed where memory is accounted: the
//! [`mapped_memory`](tensormem::telemetry::mapped_memory) ledger, snapshots and the Prometheus
//! export (allocator `mmap`).
//!
//! The header is parsed and validated by the `safetensors` crate (offsets inside the file,
//! contiguous, sizes matching shapes); this module maps dtypes and places each tensor in the
//! mapping.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ::safetensors::tensor::{Dtype, Metadata, SafeTensors as Parsed, TensorInfo, View};

use super::core::{Tensor, nbytes_of};
use super::shape::contiguous_strides;
use super::storage::lock_storages;
use super::{DType, Result, Storage, TensorError, TensorOptions};

/// The bytes before the header: its length, a little-endian `u64`.
const LEN_BYTES: usize = 8;

/// A safetensors file mapped into memory; [`tensor`](Self::tensor) hands out its tensors.
///
/// Tensors keep the mapping alive: dropping the `SafeTensors` while tensors from it live is
/// fine; the file is unmapped when the last of them goes.
///
/// ```
/// use tensormem_tensor::{DType, SafeTensors, Tensor};
///
/// let dir = std::env::temp_dir().join(format!("tm-doc-st-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let path = dir.join("model.safetensors");
/// let w = Tensor::arange(0.0, 6.0, 1.0, DType::F32)?.view(&[2, 3])?;
/// tensormem_tensor::save_safetensors(&path, &[("w", &w)], None)?;
///
/// // SAFETY: nothing changes the file while it is mapped.
/// let file = unsafe { SafeTensors::open(&path) }?;
/// let loaded = file.tensor_checked("w", DType::F32, &[2, 3])?;
/// assert_eq!(loaded.to_vec::<f32>()?, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
/// assert_eq!(loaded.storage().allocator_name(), "mmap");
/// assert!(file.tensor_checked("w", DType::F16, &[2, 3]).is_err());
/// # drop((file, loaded));
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), tensormem_tensor::TensorError>(())
/// ```
#[derive(Debug)]
pub struct SafeTensors {
    path: PathBuf,
    storage: Storage,
    /// Where the tensors' data starts in the file (after the header).
    data_start: usize,
    metadata: Metadata,
}

fn bad(path: &Path, reason: impl Into<String>) -> TensorError {
    TensorError::BadFile { op: "safetensors", path: path.to_path_buf(), reason: reason.into() }
}

/// The tensormem dtype of a safetensors dtype, when there is one.
fn dtype_of(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::BOOL => DType::Bool,
        Dtype::U8 => DType::U8,
        Dtype::I8 => DType::I8,
        Dtype::I16 => DType::I16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        _ => return None,
    })
}

/// The safetensors dtype of a tensormem dtype (the quantised ones have none).
fn file_dtype(d: DType) -> Option<Dtype> {
    Some(match d {
        DType::Bool => Dtype::BOOL,
        DType::U8 => Dtype::U8,
        DType::I8 => Dtype::I8,
        DType::I16 => Dtype::I16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::Q8_0 | DType::Q4_0 => return None,
    })
}

impl SafeTensors {
    /// Maps the file at `path` and reads its header.
    ///
    /// # Errors
    /// [`TensorError::Io`] when the file cannot be opened or mapped; [`TensorError::BadFile`]
    /// when it is not a valid safetensors file (the `safetensors` crate's reason: header too
    /// large or not JSON, offsets outside the data or overlapping, sizes not matching shapes,
    /// data shorter or longer than the header says), or when the header names a tensor twice.
    ///
    /// # Safety
    /// The file must not be modified or truncated while it, or any tensor from it, lives (the
    /// contract of a memory mapping: see [`Storage::map_file`]).
    pub unsafe fn open(path: impl AsRef<Path>) -> Result<SafeTensors> {
        let path = path.as_ref();
        let io = |source| TensorError::Io { op: "safetensors", path: path.to_path_buf(), source };
        let len = std::fs::metadata(path).map_err(io)?.len();
        let len = usize::try_from(len).map_err(|_| bad(path, format!("{len} bytes do not fit in memory")))?;
        // SAFETY: forwarded to our caller.
        let storage = unsafe { Storage::map_file(path, 0, len) }?;
        let bytes: &[u8] = if len == 0 {
            &[]
        } else {
            // SAFETY: the storage maps `len` readable bytes of the file, alive as long as
            // `storage`, which outlives this borrow; nothing writes a read-only mapping.
            unsafe { core::slice::from_raw_parts(storage.data_ptr(), len) }
        };
        let (header_len, metadata) = Parsed::read_metadata(bytes).map_err(|e| bad(path, e.to_string()))?;
        // The parser keeps the last of two entries of one name: two readers could then see
        // different weights. Refuse the file instead.
        if let Some(name) = bytes.get(LEN_BYTES..LEN_BYTES + header_len).and_then(duplicate_name) {
            return Err(bad(path, format!("the header names tensor {name:?} twice")));
        }
        Ok(SafeTensors { path: path.to_path_buf(), storage, data_start: LEN_BYTES + header_len, metadata })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tensors' names, in the order of their data in the file.
    pub fn names(&self) -> Vec<String> {
        self.metadata.offset_keys()
    }

    /// How many tensors the file holds.
    pub fn len(&self) -> usize {
        self.metadata.tensors().len()
    }

    /// Whether the file holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The free-form `__metadata__` of the header (string to string), if any.
    pub fn metadata(&self) -> Option<&HashMap<String, String>> {
        self.metadata.metadata().as_ref()
    }

    /// Bytes of the file mapped (all of it).
    pub fn mapped_bytes(&self) -> usize {
        self.storage.nbytes()
    }

    /// The dtype and shape of tensor `name` as the header gives them, without making the
    /// tensor; `None` when there is no such tensor. The dtype is `Err(name)` with the file's
    /// dtype name when tensormem has no such dtype (FP8, unsigned 16-64 bits, complex).
    pub fn info(&self, name: &str) -> Option<(core::result::Result<DType, String>, Vec<usize>)> {
        let info = self.metadata.info(name)?;
        Some((dtype_of(info.dtype).ok_or_else(|| info.dtype.to_string()), info.shape.clone()))
    }

    fn find(&self, name: &str) -> Result<&TensorInfo> {
        self.metadata.info(name).ok_or_else(|| {
            let mut names = self.names();
            names.truncate(8);
            bad(&self.path, format!("no tensor named {name:?} (the file has {}; first: {names:?})", self.len()))
        })
    }

    /// Tensor `name`: a read-only view of the mapping, with the file's dtype and shape.
    ///
    /// A tensor whose data is not aligned to its element size in the file (the format pads
    /// its header to 8 bytes, so only hand-made files do this) is copied into memory from the
    /// default allocator instead, with a `tracing` warning.
    ///
    /// # Errors
    /// [`TensorError::BadFile`] when there is no such tensor, its dtype has no tensormem
    /// equivalent, or a `bool` byte is neither 0 nor 1; [`TensorError::Alloc`] when a
    /// misaligned tensor cannot be copied.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let info = self.find(name)?;
        let dtype = dtype_of(info.dtype).ok_or_else(|| {
            bad(&self.path, format!("tensor {name:?} has dtype {}, which tensormem does not have", info.dtype))
        })?;
        let (begin, end) = info.data_offsets;
        let start = self.data_start + begin;
        let len = end - begin;
        // The header was validated against the file: the sizes agree and fit.
        debug_assert_eq!(nbytes_of("safetensors", &info.shape, dtype).ok(), Some(len));
        let elem = dtype.element_size().unwrap_or(1);
        if dtype == DType::Bool {
            // SAFETY: `start..start + len` is inside the mapping (validated by the header
            // check against the file's length); the bytes are read as bytes.
            let bytes = unsafe { core::slice::from_raw_parts(self.storage.data_ptr().add(start), len) };
            if let Some(i) = bytes.iter().position(|&b| b > 1) {
                return Err(bad(&self.path, format!("bool tensor {name:?} has byte {} at element {i}", bytes[i])));
            }
        }
        let strides = contiguous_strides(&info.shape);
        if start.is_multiple_of(elem) {
            return Ok(Tensor::from_parts(self.storage.clone(), info.shape.as_slice(), strides, start / elem, dtype));
        }
        tracing::warn!(
            path = %self.path.display(), name, start, elem,
            "tensormem: safetensors data not aligned to its element size; copied, not mapped"
        );
        let out = Tensor::empty(&info.shape, dtype)?;
        out.host_ready("SafeTensors::tensor")?;
        let guard = lock_storages("SafeTensors::tensor", Some(out.storage()), &[])?;
        // SAFETY: the source range is inside the mapping (as above); `out` is a fresh,
        // materialised, contiguous tensor of `info.shape` elements of `dtype`, which is `len`
        // bytes (the header validation checks sizes against shapes), write-locked; the two
        // never overlap (a mapping is not an allocation). Any bit pattern is a valid value of
        // the non-bool dtypes and bool bytes were checked above.
        unsafe { core::ptr::copy_nonoverlapping(self.storage.data_ptr().add(start), out.data_ptr(), len) };
        drop(guard);
        Ok(out)
    }

    /// Tensor `name`, checked to have `dtype` and `shape`: what a model loader wants, so that a
    /// checkpoint from another model size fails at load time with both shapes in the message.
    ///
    /// # Errors
    /// As [`tensor`](Self::tensor), and [`TensorError::BadFile`] naming the expected and the
    /// found dtype and shape when they differ.
    pub fn tensor_checked(&self, name: &str, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let info = self.find(name)?;
        if dtype_of(info.dtype) != Some(dtype) || info.shape != shape {
            return Err(bad(
                &self.path,
                format!(
                    "tensor {name:?} is {} {:?}, expected {dtype} {shape:?}",
                    dtype_of(info.dtype).map_or_else(|| info.dtype.to_string(), |d| d.to_string()),
                    info.shape
                ),
            ));
        }
        self.tensor(name)
    }

    /// Every tensor, in file order.
    ///
    /// # Errors
    /// As [`tensor`](Self::tensor), for the first tensor that fails.
    pub fn tensors(&self) -> Result<Vec<(String, Tensor)>> {
        self.names().into_iter().map(|n| self.tensor(&n).map(|t| (n, t))).collect()
    }
}

/// A tensor's bytes for the writer: contiguous, materialised.
struct Bytes {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &Bytes {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Writes `tensors` (name, tensor) to a safetensors file at `path`, with the optional
/// free-form `metadata`. Views are written as their elements (contiguous, row-major).
///
/// # Errors
/// [`TensorError::BadFile`] when two tensors share a name, a tensor is quantised (the format
/// has no such dtype), or the writer fails (its reason, I/O included);
/// [`TensorError::Alloc`] when a view cannot be made contiguous.
pub fn save_safetensors(
    path: impl AsRef<Path>,
    tensors: &[(&str, &Tensor)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let path = path.as_ref();
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        if !seen.insert(*name) {
            return Err(bad(path, format!("two tensors are named {name:?}")));
        }
        let dtype = file_dtype(t.dtype())
            .ok_or_else(|| bad(path, format!("tensor {name:?} is {}, which safetensors cannot store", t.dtype())))?;
        let c = t.contiguous()?;
        c.host_ready("save_safetensors")?;
        let n = c.dtype().size_of(c.numel()).unwrap_or(0);
        let _guard = lock_storages("save_safetensors", None, &[c.storage()])?;
        let data = if n == 0 {
            Vec::new()
        } else {
            // SAFETY: `c` is contiguous and materialised: its `n` bytes are initialised and
            // consecutive from its first element; the read lock keeps writers out meanwhile.
            unsafe { core::slice::from_raw_parts(c.data_ptr() as *const u8, n) }.to_vec()
        };
        out.push((*name, Bytes { dtype, shape: t.sizes().to_vec(), data }));
    }
    ::safetensors::tensor::serialize_to_file(out.iter().map(|(n, b)| (*n, b)), metadata, path)
        .map_err(|e| bad(path, e.to_string()))
}

/// The first top-level key that a JSON object `header` holds twice, if any.
fn duplicate_name(header: &[u8]) -> Option<String> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    struct FirstDuplicate;
    impl<'de> Visitor<'de> for FirstDuplicate {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> core::result::Result<Option<String>, M::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                map.next_value::<IgnoredAny>()?;
                if !seen.insert(key.clone()) {
                    return Ok(Some(key));
                }
            }
            Ok(None)
        }
    }
    serde_json::Deserializer::from_slice(header).deserialize_map(FirstDuplicate).ok().flatten()
}

impl Tensor {
    /// Loads tensor `name` of the safetensors file at `path` into memory from `opts`'
    /// allocator (a copy, writable; for zero-copy loading keep a [`SafeTensors`] open), in
    /// `opts`' dtype when it names one (converted as [`to_dtype`](Self::to_dtype) converts:
    /// `torch.load(...).to(dtype)`), else in the file's.
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor, TensorOptions, save_safetensors};
    ///
    /// let path = std::env::temp_dir().join(format!("tm-doc-load-{}.safetensors", std::process::id()));
    /// let w = Tensor::from_slice(&[1.5f32, -2.0], &[2], DType::F32)?;
    /// save_safetensors(&path, &[("w", &w)], None)?;
    /// let same = Tensor::load_safetensors(&path, "w", TensorOptions::new())?;
    /// let half = Tensor::load_safetensors(&path, "w", DType::BF16)?;
    /// assert_eq!((same.dtype(), half.dtype()), (DType::F32, DType::BF16));
    /// assert_eq!(half.to_dtype(DType::F32)?.to_vec::<f32>()?, [1.5, -2.0]);
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    /// As [`SafeTensors::open`] and [`SafeTensors::tensor`]; as [`to_dtype`](Self::to_dtype)
    /// for a dtype the file's cannot be converted to (a quantised one needs a last dimension
    /// that is a multiple of 32).
    pub fn load_safetensors(path: impl AsRef<Path>, name: &str, opts: impl Into<TensorOptions>) -> Result<Tensor> {
        // SAFETY: the mapping lives only inside this call, while the tensor is copied out.
        let file = unsafe { SafeTensors::open(path) }?;
        let t = file.tensor(name)?;
        let opts = opts.into();
        let dtype = opts.get_dtype().unwrap_or(t.dtype());
        // A quantised dtype is made from f32 values, in blocks (`to_dtype`).
        let out = Tensor::empty(t.sizes(), opts.dtype(if dtype.is_quantized() { DType::F32 } else { dtype }))?;
        out.copy_(&t)?;
        if dtype.is_quantized() { out.to_dtype(dtype) } else { Ok(out) }
    }
}
