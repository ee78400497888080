//! [`TensorOptions`] (dtype, allocator, seed for constructors) and the random [`Generator`].

use std::sync::Arc;

use parking_lot::Mutex;

use tensormem::allocators::Allocator;

use super::DType;

/// How a constructor builds a tensor: its dtype (default `f32`), the allocator its storage
/// comes from (default: the global registry's choice, [`AllocatorRegistry::get`](tensormem::AllocatorRegistry::get)),
/// and for `rand`/`randn` a seed (default: the global generator, see [`manual_seed`]).
///
/// Every constructor takes `impl Into<TensorOptions>`, so a bare [`DType`] works too:
///
/// ```
/// use std::sync::Arc;
/// use tensormem_tensor::{DType, Tensor, TensorOptions};
/// use tensormem::{AllocatorRegistry, TrackingAllocator};
///
/// let a = Tensor::zeros(&[2, 3], DType::I32)?;
/// let tracker = Arc::new(TrackingAllocator::new(AllocatorRegistry::global().get()));
/// let opts = TensorOptions::new().allocator(tracker.clone()).seed(7);
/// let b = Tensor::rand(&[2, 3], &opts)?;
/// assert_eq!(tracker.sizes().live_bytes, 24);
/// # Ok::<(), tensormem_tensor::TensorError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct TensorOptions {
    dtype: Option<DType>,
    allocator: Option<Arc<dyn Allocator>>,
    seed: Option<u64>,
}

impl TensorOptions {
    /// The defaults: f32, the registry's allocator, the global generator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the dtype.
    #[must_use]
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// Sets the allocator the storage comes from.
    #[must_use]
    pub fn allocator(mut self, allocator: Arc<dyn Allocator>) -> Self {
        self.allocator = Some(allocator);
        self
    }

    /// Seeds `rand`/`randn` with a fresh generator instead of the global one.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The dtype given, if any.
    pub fn get_dtype(&self) -> Option<DType> {
        self.dtype
    }

    /// The allocator given, if any.
    pub fn get_allocator(&self) -> Option<&Arc<dyn Allocator>> {
        self.allocator.as_ref()
    }

    /// The seed given, if any.
    pub fn get_seed(&self) -> Option<u64> {
        self.seed
    }
}

impl From<DType> for TensorOptions {
    fn from(dtype: DType) -> Self {
        TensorOptions::new().dtype(dtype)
    }
}

impl From<&TensorOptions> for TensorOptions {
    fn from(o: &TensorOptions) -> Self {
        o.clone()
    }
}

impl From<Arc<dyn Allocator>> for TensorOptions {
    fn from(a: Arc<dyn Allocator>) -> Self {
        TensorOptions::new().allocator(a)
    }
}

/// A seeded pseudo-random generator (xoshiro256++, seeded through splitmix64): the same seed
/// gives the same tensors on every platform.
#[derive(Clone, Debug)]
pub struct Generator {
    s: [u64; 4],
}

impl Generator {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Generator { s: [next(), next(), next(), next()] }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[0, 1)` with 24 random bits (every value an exact `f32`).
    pub fn uniform_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1]: ln is finite
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (core::f64::consts::TAU * u2).cos()
    }
}

/// The seed of the global generator at startup.
pub const DEFAULT_SEED: u64 = 0x5eed;

static GLOBAL: Mutex<Option<Generator>> = Mutex::new(None);

/// Reseeds the global generator used by `rand`/`randn` without a seed option
/// (like `torch.manual_seed`).
pub fn manual_seed(seed: u64) {
    *GLOBAL.lock() = Some(Generator::new(seed));
}

/// Runs `f` with the generator the options ask for.
pub(crate) fn with_generator<R>(opts: &TensorOptions, f: impl FnOnce(&mut Generator) -> R) -> R {
    match opts.seed {
        Some(seed) => f(&mut Generator::new(seed)),
        None => f(GLOBAL.lock().get_or_insert_with(|| Generator::new(DEFAULT_SEED))),
    }
}
