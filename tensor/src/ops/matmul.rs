//! `matmul`: `torch.matmul`'s shapes (dot, matrix-vector, matrix, batched with broadcast
//! batch dimensions) on the `gemm` crate for f32 and f64, and a cache-friendly loop for
//! integers. f16 and bf16 are computed in f32 and rounded once, as PyTorch accumulates them:
//! gemm's own f16 path runs its AVX2 kernels only, and converting around its AVX-512 f32
//! kernels is faster (`docs/amx-routes.md`). On CPUs with AMX (Intel's server cores from
//! Sapphire Rapids on) bf16 and f16 products of at least 16 x 32 x 16 run on its tiles instead
//! ([`amx`](super::amx)); PyTorch does so for bf16 there. Without AMX, bf16 products of those
//! sizes, and those of fewer than 32 rows by a transposed weight, run on AVX512-BF16's
//! `vdpbf16ps` on AMD CPUs that have it (Zen 4 and later), as oneDNN does (Intel's run it at half
//! the rate of f32 multiply-adds); f16 products of fewer than 32 rows by a transposed weight, and
//! bf16 ones where that route is off, as dot products with fused multiply-adds (AVX-512's, or
//! AVX2's on CPUs without AVX-512).
//!
//! On several kernel threads, a gemm product is cut by the columns of its result, one
//! single-threaded gemm call per piece ([`Split`]), where each piece gets at least
//! [`PIECE_COLUMNS`] columns; gemm's own parallelism takes the rest.

use smallvec::SmallVec;

use super::gemm::{self, Parallelism};
use super::{Shared, piece_range};
use crate::core::for_each_offset;
use crate::dtype::match_numeric;
use crate::num::Num;
use crate::shape::{Dims, broadcast_shapes};
use crate::storage::lock_storages;
use crate::{DType, Element, Result, Tensor, TensorError};

/// Below this many multiply-adds, gemm runs on the calling thread.
const PARALLEL_FLOPS: usize = 1 << 18;

/// The fewest columns of the result each piece of a product split by columns takes
/// ([`Split::Columns`]); with fewer, gemm splits the product itself.
const PIECE_COLUMNS: usize = 64;

/// The columns of the result the pieces of [`Split::Columns`] start at: multiples of 16 (an
/// AVX-512 vector of f32), so that no microkernel tile straddles two pieces.
const PIECE_ALIGN: usize = 16;

/// How the multiply-adds of a gemm product (every batch of it) are shared among threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Split {
    /// All on the calling thread.
    One,
    /// The result's columns cut into this many pieces, one per kernel thread
    /// ([`for_each_piece`](crate::parallel::for_each_piece)), each piece a
    /// single-threaded gemm call per batch on its columns: one fork and join for the whole
    /// product. gemm's own parallelism forks and joins at each of its packing and compute
    /// steps, and the pieces take less time than it (`docs/kernel-thread-pool.md`). Each piece packs all of the left operand, which is
    /// why a piece takes at least [`PIECE_COLUMNS`] columns.
    Columns(usize),
    /// gemm's own rayon parallelism over this many threads, on the kernel pool, for products
    /// with too few columns to cut (per batch, of at least [`PARALLEL_FLOPS`] multiply-adds).
    Gemm(usize),
}

impl Split {
    /// The split of a product (each batch `n x k` by `k x m`) on `threads` threads (from
    /// [`threads_for`](crate::parallel::threads_for)).
    fn new(threads: usize, (n, k, m): (usize, usize, usize)) -> Split {
        if threads <= 1 {
            Split::One
        } else if m / threads >= PIECE_COLUMNS {
            Split::Columns(threads)
        } else if n.saturating_mul(m).saturating_mul(k) >= PARALLEL_FLOPS {
            Split::Gemm(threads)
        } else {
            Split::One
        }
    }
}

/// One matrix operand: the address of element (0, 0), its row and column strides in elements.
#[derive(Clone, Copy)]
pub(super) struct Mat<T> {
    pub(super) ptr: *const T,
    pub(super) rs: usize,
    pub(super) cs: usize,
}

impl Tensor {
    /// Matrix product with `torch.matmul`'s rules: 1-D x 1-D is a dot product (0-d result);
    /// a 1-D left operand is a row vector and a 1-D right operand a column vector (that
    /// dimension is removed from the result); higher dimensions are batch dimensions, which
    /// broadcast. Operands are promoted to a common dtype; bool and quantised are refused.
    /// Strided operands (a transposed matrix) are passed to gemm as they are, without a copy.
    ///
    /// bf16 products run on AMX tiles where the CPU has them ([`amx_enabled`]), with AMX's
    /// arithmetic as in PyTorch there: f32 sums, subnormal inputs and results read and written
    /// as zero. f16 products run on the same tiles, each value split into two exact bf16
    /// parts, with the f32 route's arithmetic (exact products, f32 sums, subnormals kept);
    /// f16 operands holding an infinity or a NaN take the f32 route. Without AMX, bf16 products
    /// run on AVX512-BF16 registers where that route is on ([`avx512_bf16_enabled`]: by
    /// default on AMD CPUs that have it; Intel's run it slower than f32), as oneDNN does there,
    /// with AMX's arithmetic: those of at least 16 x 32 x 16, and those of fewer than 32 rows
    /// whose right operand has contiguous columns (`x.matmul(&w.t()?)` with a `Linear` weight
    /// `w`, a decode step). On these routes a sum of zero products is +0. [`set_amx`]`(false)`
    /// and [`set_avx512_bf16`]`(false)` (or `TENSORMEM_AMX=0` and `TENSORMEM_AVX512_BF16=0`)
    /// choose the f32 route everywhere. f16 products of fewer than 32 rows whose right operand
    /// has contiguous columns (and bf16 ones, where AVX512-BF16's route is off) run as dot
    /// products on any AVX-512 or AVX2 CPU (where AMX is on, those of fewer than 20 rows for
    /// f16, 16 for bf16), with the f32 route's arithmetic (exact products, f32 sums in another order,
    /// subnormals kept; a sum of only -0 products is -0) and without converting the right
    /// operand.
    ///
    /// [`amx_enabled`]: crate::amx_enabled
    /// [`avx512_bf16_enabled`]: crate::avx512_bf16_enabled
    /// [`set_amx`]: crate::set_amx
    /// [`set_avx512_bf16`]: crate::set_avx512_bf16
    ///
    /// # Errors
    /// [`TensorError::MatmulShape`] when the inner dimensions differ;
    /// [`TensorError::Broadcast`] when batch dimensions do not broadcast;
    /// [`TensorError::BadShape`] for 0-d operands; [`TensorError::UnsupportedDType`].
    ///
    /// ```
    /// use tensormem_tensor::{DType, Tensor};
    ///
    /// let a = Tensor::arange(0.0, 6.0, 1.0, DType::F32)?.view(&[2, 3])?;
    /// let b = Tensor::ones(&[3, 4], DType::F32)?;
    /// let c = a.matmul(&b)?;
    /// assert_eq!(c.sizes(), [2, 4]);
    /// assert_eq!(c.to_vec::<f32>()?, [3., 3., 3., 3., 12., 12., 12., 12.]);
    /// # Ok::<(), tensormem_tensor::TensorError>(())
    /// ```
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        let op = "matmul";
        if self.dim() == 0 || other.dim() == 0 {
            return Err(TensorError::BadShape {
                op,
                shape: self.sizes().to_vec(),
                target: other.sizes().to_vec(),
                reason: "both arguments to matmul need at least one dimension",
            });
        }
        let dt = DType::promote(self.dtype(), other.dtype()).ok_or(TensorError::NoCommonDType {
            op,
            lhs: self.dtype(),
            rhs: other.dtype(),
        })?;
        if dt == DType::Bool {
            return Err(TensorError::UnsupportedDType {
                op,
                dtype: dt,
                shape: self.sizes().to_vec(),
                hint: "convert bool tensors with to_dtype first",
            });
        }
        let (a_vec, b_vec) = (self.dim() == 1, other.dim() == 1);
        let a = if a_vec { self.unsqueeze(0)? } else { self.clone() };
        let b = if b_vec { other.unsqueeze(-1)? } else { other.clone() };
        let (an, bn) = (a.dim(), b.dim());
        let (n, k, k2, m) = (a.sizes()[an - 2], a.sizes()[an - 1], b.sizes()[bn - 2], b.sizes()[bn - 1]);
        if k != k2 {
            return Err(TensorError::MatmulShape {
                lhs: self.sizes().to_vec(),
                rhs: other.sizes().to_vec(),
                lhs_inner: k,
                rhs_inner: k2,
            });
        }
        let batch = broadcast_shapes(op, &a.sizes()[..an - 2], &b.sizes()[..bn - 2])?;
        let expand = |t: &Tensor, rows: usize, cols: usize| -> Result<Tensor> {
            let mut s = batch.clone();
            s.extend([rows, cols]);
            t.broadcast_to_as(op, &s)
        };
        let (a, b) = (expand(&a, n, k)?, expand(&b, k, m)?);
        let squeeze = |mut out: Tensor| -> Result<Tensor> {
            if a_vec {
                out = out.squeeze_dim(-2)?;
            }
            if b_vec {
                out = out.squeeze_dim(-1)?;
            }
            Ok(out)
        };
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        if matches!(dt, DType::BF16 | DType::F16) {
            use super::amx::Route;
            // `b` is expanded: its rows' stride follows the batch dimensions.
            let b_columns = b.dtype() == dt && (b.strides()[batch.len()] == 1 || k <= 1);
            let b_rows = b.dtype() == dt && (b.strides()[batch.len() + 1] == 1 || m <= 1);
            match super::amx::route(n, k, m, dt == DType::F16, b_columns, b_rows) {
                Some(Route::FewRows { dots }) => {
                    return squeeze(few_rows(self, &a, &b, (dt, dots), &batch, (n, k, m), false)?);
                }
                Some(Route::FewRowsByRows) => {
                    return squeeze(few_rows(self, &a, &b, (dt, false), &batch, (n, k, m), true)?);
                }
                Some(route) => {
                    if let Some(out) = on_tiles(self, &a, &b, dt, &batch, (n, k, m), route)? {
                        return squeeze(out);
                    }
                }
                None => {}
            }
        }
        let compute = if matches!(dt, DType::BF16 | DType::F16) { DType::F32 } else { dt };
        let (a, b) = (a.to_dtype(compute)?, b.to_dtype(compute)?);
        // SAFETY: `batched` writes every element of `out` (gemm with k == 0 writes zeros).
        let (out, threads) = unsafe { fresh_result(self, &a, &b, compute, &batch, (n, k, m)) }?;
        if out.numel() > 0 {
            let _g = lock_storages(op, None, &[a.storage(), b.storage()])?;
            let split = Split::new(threads, (n, k, m));
            let run = || match_numeric!(compute, T => batched::<T>(&a, &b, &out, &batch, (n, k, m), split), _ => {});
            if let Split::Gemm(_) = split { crate::parallel::install(run) } else { run() }
        }
        squeeze(if compute != dt { out.to_dtype(dt)? } else { out })
    }
}

/// The element offsets of each matrix of `t` (expanded to `batch + [rows, cols]`).
fn batch_offsets(t: &Tensor, batch: &[usize]) -> SmallVec<[usize; 4]> {
    let mut v = SmallVec::new();
    for_each_offset(batch, &t.strides()[..batch.len()], |o| v.push(o));
    v
}

/// The uninitialised `batch + [n, m]` result of `dt` for a product of `a` and `b` (both made
/// ready on the host), and the threads its `k` multiply-adds per element may use.
///
/// # Safety
/// The caller writes every element of the result before it is read, or drops it unread.
unsafe fn fresh_result(
    like: &Tensor,
    a: &Tensor,
    b: &Tensor,
    dt: DType,
    batch: &[usize],
    (n, k, m): (usize, usize, usize),
) -> Result<(Tensor, usize)> {
    let op = "matmul";
    let mut shape = Dims::from_slice(batch);
    shape.extend([n, m]);
    // SAFETY: our contract.
    let out = unsafe { Tensor::output(op, &shape, dt, like) }?;
    a.host_ready(op)?;
    b.host_ready(op)?;
    let threads = crate::parallel::threads_for(out.numel().saturating_mul(k), PARALLEL_FLOPS / 2);
    Ok((out, threads))
}

/// `a x b` in `dt` (bf16 or f16) packed for AMX tiles and multiplied on `route` (the tiles, or
/// AVX512-BF16 registers for bf16: [`amx`](super::amx)); `a` and `b` are expanded to
/// `batch + [n, k]` and `batch + [k, m]`, of any dtype that promotes to `dt`. `None` when an f16
/// operand holds an infinity or a NaN: those products take the f32 route.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn on_tiles(
    like: &Tensor,
    a: &Tensor,
    b: &Tensor,
    dt: DType,
    batch: &[usize],
    (n, k, m): (usize, usize, usize),
    route: super::amx::Route,
) -> Result<Option<Tensor>> {
    use super::amx::{Plan, product};
    let op = "matmul";
    let (a, b) = (a.to_dtype(dt)?, b.to_dtype(dt)?);
    // SAFETY: `product` writes every element of `out`, or it is dropped unread.
    let (out, threads) = unsafe { fresh_result(like, &a, &b, dt, batch, (n, k, m)) }?;
    if out.numel() == 0 {
        return Ok(Some(out));
    }
    let out_shape = Dims::from_slice(out.sizes());
    let plan = Plan::new(out.numel() / (n * m), n, k, m, threads, dt == DType::F16, route);
    let scratch = |len: Option<usize>| {
        let len = len.ok_or_else(|| TensorError::SizeOverflow { op, shape: out_shape.to_vec(), dtype: dt })?;
        // SAFETY: `product` writes all of its scratch before reading it.
        unsafe { Tensor::output(op, &[len], DType::BF16, like) }
    };
    let (pack_a, pack_b) = (scratch(plan.packed_a())?, scratch(plan.packed_b())?);
    let _g = lock_storages(op, None, &[a.storage(), b.storage()])?;
    let (ao, bo) = (batch_offsets(&a, batch), batch_offsets(&b, batch));
    let nb = batch.len();
    let mat = |t: &Tensor| Mat { ptr: t.data_ptr() as *const u16, rs: t.strides()[nb], cs: t.strides()[nb + 1] };
    // SAFETY: `route` returned this route for these sizes and dtype (the caller's test). `a` and
    // `b` are of the plan's dtype, host-ready and read-locked; each offset addresses one of their
    // matrices with these strides. `out` and the scratch are fresh, of the sizes `product` needs, and alias nothing.
    let finite = unsafe {
        product(
            plan,
            mat(&a),
            &ao,
            mat(&b),
            &bo,
            out.data_ptr() as *mut u16,
            pack_a.data_ptr() as *mut u16,
            pack_b.data_ptr() as *mut u16,
            threads,
        )
    };
    Ok(finite.then_some(out))
}

/// `a x b` in `dt` (bf16 or f16) as dot products of rows and columns ([`amx`](super::amx)'s
/// `few_rows`), for fewer than 32 rows; `a` and `b` are expanded to `batch + [n, k]` and
/// `batch + [k, m]`, `b` of dtype `dt` with contiguous columns (or `k <= 1`), `a` of any dtype
/// that promotes to `dt`. `dots` (from [`Route::FewRows`](super::amx::Route::FewRows)): bf16 on
/// `vdpbf16ps`; else the rows widened to f32 for fused multiply-adds. `by_rows` (from
/// [`Route::FewRowsByRows`](super::amx::Route::FewRowsByRows)): `b` has contiguous rows (or
/// `m <= 1`) instead, and its rows are added into the results' sums (`few_rows_by_rows`).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn few_rows(
    like: &Tensor,
    a: &Tensor,
    b: &Tensor,
    (dt, dots): (DType, bool),
    batch: &[usize],
    (n, k, m): (usize, usize, usize),
    by_rows: bool,
) -> Result<Tensor> {
    use super::amx::{few_rows, few_rows_avx2, few_rows_by_rows, few_rows_product};
    let nb = batch.len();
    // The rows contiguous, bf16 or widened to f32 once: a strided one (few rows, so cheap) is
    // copied first.
    let a = a.to_dtype(if dots { dt } else { DType::F32 })?;
    let a = if a.strides()[nb + 1] == 1 || k <= 1 { a } else { a.contiguous()? };
    // SAFETY: `few_rows_product` writes every element of `out`.
    let (out, threads) = unsafe { fresh_result(like, &a, b, dt, batch, (n, k, m)) }?;
    if out.numel() == 0 {
        return Ok(out);
    }
    let _g = lock_storages("matmul", None, &[a.storage(), b.storage()])?;
    let (ao, bo) = (batch_offsets(&a, batch), batch_offsets(b, batch));
    let (ars, acs) = (a.strides()[nb], a.strides()[nb + 1]);
    let bm = Mat { ptr: b.data_ptr() as *const u16, rs: b.strides()[nb], cs: b.strides()[nb + 1] };
    // The stride the kernel steps `b` by: from column to column, or from row to row.
    let b_step = if by_rows { bm.rs } else { bm.cs };
    let dst = out.data_ptr() as *mut u16;
    let avx512 = super::isa::detected() == super::isa::Isa::Avx512;
    // SAFETY: `route` returned `FewRows { dots }` or `FewRowsByRows` (with `by_rows`) for `dt`
    // (the caller's test), so `isa::detected` is AVX2 or AVX-512: the CPU has AVX2, FMA and
    // F16C, and with `avx512` AVX-512 F, BW and VL; with `dots`, AVX512-BF16 was on, so the CPU
    // has it (and AVX-512). `a` (bf16 if `dots`, else f32) and `b` (of `dt`) are host-ready and
    // read-locked, `a`'s rows contiguous (or `k <= 1`), and `b`'s columns (or `k <= 1`), or
    // with `by_rows` its rows (or `m <= 1`); each offset addresses one of their matrices with
    // these strides. `out` is fresh, `batches * n * m` elements, and aliases nothing.
    unsafe {
        if dots {
            let am = Mat { ptr: a.data_ptr() as *const u16, rs: ars, cs: acs };
            few_rows_product(few_rows::bf16, (am, &ao), (bm, &bo, b_step), (n, k, m), dst, threads)
        } else {
            let am = Mat { ptr: a.data_ptr() as *const f32, rs: ars, cs: acs };
            let kernel = match (dt == DType::F16, avx512, by_rows) {
                (true, _, true) => few_rows_by_rows::widened::<true>,
                (false, _, true) => few_rows_by_rows::widened::<false>,
                (true, true, false) => few_rows::widened::<true>,
                (false, true, false) => few_rows::widened::<false>,
                (true, false, false) => few_rows_avx2::widened::<true>,
                (false, false, false) => few_rows_avx2::widened::<false>,
            };
            few_rows_product(kernel, (am, &ao), (bm, &bo, b_step), (n, k, m), dst, threads)
        }
    };
    Ok(out)
}

/// Runs one matrix product per batch index, shared among threads by `split`. `a` and `b` are
/// expanded to `batch + [n, k]` and `batch + [k, m]`, read-locked; `out` is fresh and
/// contiguous. With [`Split::Gemm`], the caller runs this on the kernel pool
/// ([`install`](crate::parallel::install)); otherwise on its own thread, which must not
/// be a rayon worker where `split` is [`Split::Columns`].
fn batched<T: Element + Num>(
    a: &Tensor,
    b: &Tensor,
    out: &Tensor,
    batch: &[usize],
    (n, k, m): (usize, usize, usize),
    split: Split,
) {
    let nb = batch.len();
    let (ao, bo) = (batch_offsets(a, batch), batch_offsets(b, batch));
    let ptrs = Shared((a.data_ptr() as *const T, b.data_ptr() as *const T, out.data_ptr() as *mut T));
    let ((ars, acs), (brs, bcs)) = (
        plain_strides((n, k), (a.strides()[nb], a.strides()[nb + 1])),
        plain_strides((k, m), (b.strides()[nb], b.strides()[nb + 1])),
    );
    // Columns `cols` of every batch's result.
    let columns = |cols: core::ops::Range<usize>, par: Parallelism| {
        if cols.is_empty() {
            return;
        }
        let (ap, bp, op) = ptrs.get();
        for (i, (&x, &y)) in ao.iter().zip(&bo).enumerate() {
            // SAFETY: `x`/`y` are offsets of matrices of `a`/`b` (valid layouts inside their
            // storages), and its column `cols.start < m` (`cols` is not empty and ends at `m`
            // at most) is `cols.start * bcs` elements further; batch `i` of `out` is the `n * m` elements from `i * n * m`,
            // its row `r` from `i * n * m + r * m`, of which `cols` are inside the row.
            let (lhs, rhs, dst) = unsafe { (ap.add(x), bp.add(y + cols.start * bcs), op.add(i * n * m + cols.start)) };
            // SAFETY: as above: `lhs` is `n x k`, `rhs` `k x cols.len()`, `dst` `n` rows of
            // `cols.len()` elements `m` apart, fresh, aliasing neither operand, and written by
            // this call only (the pieces of `Split::Columns` take disjoint columns).
            unsafe {
                product(
                    Mat { ptr: lhs, rs: ars, cs: acs },
                    Mat { ptr: rhs, rs: brs, cs: bcs },
                    (dst, m),
                    (n, k, cols.len()),
                    par,
                )
            };
        }
    };
    match split {
        Split::One => columns(0..m, Parallelism::None),
        Split::Gemm(threads) => columns(0..m, Parallelism::Rayon(threads)),
        Split::Columns(pieces) => crate::parallel::for_each_piece(pieces, |p| {
            columns(piece_range(m, PIECE_ALIGN, pieces, p), Parallelism::None);
        }),
    }
}

/// The strides of a `rows x cols` matrix with the stride of a dimension of size 1 (never
/// stepped over) replaced by the one that makes the matrix contiguous by rows or by columns,
/// so that the product does not depend on it: gemm chose another route for a `1 x m` matrix
/// whose two strides were 1 (a transposed column, or `preserve_format`'s copy of one), one
/// whose sums start at +0 (`0 x -3` came out +0, not PyTorch's -0).
fn plain_strides((rows, cols): (usize, usize), (rs, cs): (usize, usize)) -> (usize, usize) {
    let rs = if rows == 1 { if cs == 1 { cols } else { 1 } } else { rs };
    let cs = if cols == 1 { if rs == 1 { rows } else { 1 } } else { cs };
    (rs, cs)
}

/// `dst (n x m, rows ldd apart) = lhs (n x k) * rhs (k x m)`, for the floating-point types by
/// gemm with `par`.
///
/// # Safety
/// `lhs` and `rhs` address valid `n x k` and `k x m` matrices of initialised `T` with the
/// given strides; `dst` is valid for writes of `n` rows of `m` elements, `ldd >= m` elements
/// apart, and overlaps neither.
unsafe fn product<T: Element + Num>(
    lhs: Mat<T>,
    rhs: Mat<T>,
    (dst, ldd): (*mut T, usize),
    (n, k, m): (usize, usize, usize),
    par: Parallelism,
) {
    if gemm::supports::<T>() {
        // SAFETY: the caller's promise, which is `gemm`'s (strides of valid layouts fit in
        // an `isize`).
        unsafe { gemm::gemm(lhs, rhs, (dst, ldd), (n, k, m), par) };
        return;
    }
    // Integers: i-p-j order, so the inner loop runs along a row of `rhs` and of `dst`.
    for i in 0..n {
        // SAFETY: row `i` of `dst` is `m` elements from `i * ldd`, inside `dst`.
        let row = unsafe { dst.add(i * ldd) };
        for j in 0..m {
            // SAFETY: as above.
            unsafe { row.add(j).write(T::ZERO) };
        }
        for p in 0..k {
            // SAFETY: (i, p) is an element of `lhs`.
            let x = unsafe { lhs.ptr.add(i * lhs.rs + p * lhs.cs).read() };
            for j in 0..m {
                // SAFETY: (p, j) is an element of `rhs`; (i, j) of `dst`, written above.
                unsafe {
                    let y = rhs.ptr.add(p * rhs.rs + j * rhs.cs).read();
                    let d = row.add(j);
                    d.write(Num::add(d.read(), Num::mul(x, y)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorOptions;

    #[test]
    fn products_are_split_by_columns_where_each_piece_gets_enough() {
        assert_eq!(Split::new(1, (512, 512, 512)), Split::One);
        assert_eq!(Split::new(2, (512, 512, 512)), Split::Columns(2));
        assert_eq!(Split::new(2, (1, 768, 128)), Split::Columns(2));
        // 127 columns make pieces of 63: gemm splits a product that large itself...
        assert_eq!(Split::new(2, (512, 512, 127)), Split::Gemm(2));
        // ...and a smaller one (threads from a batch of them) runs on one thread.
        assert_eq!(Split::new(2, (16, 16, 100)), Split::One);
        assert_eq!(Split::new(16, (512, 512, 512)), Split::Gemm(16));
        assert_eq!(Split::new(16, (64, 64, 1024)), Split::Columns(16));
    }

    #[test]
    fn pieces_cover_the_columns_once_at_multiples_of_their_alignment() {
        for (len, align, pieces) in [(261, 16, 2), (261, 16, 16), (512, 16, 2), (7, 4, 3), (5, 1, 5), (3, 16, 4)] {
            let ranges: Vec<_> = (0..pieces).map(|p| piece_range(len, align, pieces, p)).collect();
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges[pieces - 1].end, len, "{len} {align} {pieces}");
            for w in ranges.windows(2) {
                assert_eq!(w[0].end, w[1].start, "{len} {align} {pieces}: {ranges:?}");
            }
            assert!(ranges.iter().all(|r| r.start % align == 0 || r.start == len), "{ranges:?}");
        }
        assert_eq!(piece_range(261, 16, 2, 0), 0..128);
    }

    /// Every split, with more pieces than this machine has cores and columns that are no
    /// multiple of the pieces' 16: batched, broadcast, a transposed right operand, f32, f64
    /// and i64, against a naive product (i64 exactly).
    #[test]
    fn every_split_gives_the_naive_product() {
        let (n, k, m) = (7, 45, 261);
        let opts = |seed| TensorOptions::new().seed(seed);
        let a = Tensor::randn(&[3, n, k], opts(1)).unwrap();
        let b = Tensor::randn(&[m, k], opts(2)).unwrap().t().unwrap();
        let (av, bv) = (a.to_vec::<f32>().unwrap(), b.contiguous().unwrap().to_vec::<f32>().unwrap());
        let want = |bt: usize, i: usize, j: usize| -> f64 {
            (0..k).map(|p| f64::from(av[bt * n * k + i * k + p]) * f64::from(bv[p * m + j])).sum()
        };
        let ints = |t: &Tensor| t.mul_scalar(4.0).unwrap().to_dtype(DType::I64).unwrap();
        let (ai, bi) = (ints(&a), ints(&b));
        let (aiv, biv) = (ai.to_vec::<i64>().unwrap(), bi.contiguous().unwrap().to_vec::<i64>().unwrap());
        for split in [Split::One, Split::Gemm(2), Split::Columns(2), Split::Columns(5), Split::Columns(16)] {
            for dt in [DType::F32, DType::F64] {
                let (a, b) = (a.to_dtype(dt).unwrap(), b.to_dtype(dt).unwrap());
                let batch = [3];
                let b = b.unsqueeze(0).unwrap().expand(&[3, k as isize, m as isize]).unwrap();
                // SAFETY: `batched` writes every element.
                let out = unsafe { Tensor::output("matmul", &[3, n, m], dt, &a) }.unwrap();
                let run = || match_numeric!(dt, T => batched::<T>(&a, &b, &out, &batch, (n, k, m), split), _ => {});
                if let Split::Gemm(_) = split {
                    crate::parallel::install(run)
                } else {
                    run()
                }
                let got = out.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
                for bt in 0..3 {
                    for i in 0..n {
                        for j in 0..m {
                            let (g, w) = (got[(bt * n + i) * m + j], want(bt, i, j));
                            assert!((g - w).abs() < 1e-4, "{split:?} {dt:?} [{bt}, {i}, {j}]: {g} vs {w}");
                        }
                    }
                }
            }
            let b = bi.unsqueeze(0).unwrap().expand(&[3, k as isize, m as isize]).unwrap();
            // SAFETY: as above.
            let out = unsafe { Tensor::output("matmul", &[3, n, m], DType::I64, &ai) }.unwrap();
            let run = || batched::<i64>(&ai, &b, &out, &[3], (n, k, m), split);
            if let Split::Gemm(_) = split {
                crate::parallel::install(run)
            } else {
                run()
            }
            let got = out.to_vec::<i64>().unwrap();
            for bt in 0..3 {
                for i in 0..n {
                    for j in 0..m {
                        let w: i64 = (0..k).map(|p| aiv[bt * n * k + i * k + p] * biv[p * m + j]).sum();
                        assert_eq!(got[(bt * n + i) * m + j], w, "{split:?} i64 [{bt}, {i}, {j}]");
                    }
                }
            }
        }
    }
}
