//! The gemm crates' kernels for f32, f64 and f16, called as the `gemm` crate's `gemm::gemm`
//! calls them: through the per-type crates alone, so that the build compiles none of `gemm`'s
//! complex-number kernels, which no product here runs.

use core::any::TypeId;

pub(super) use gemm_common::Parallelism;

use super::matmul::Mat;

/// Whether [`gemm`] computes products of `T`.
pub(super) fn supports<T: 'static>() -> bool {
    let id = TypeId::of::<T>();
    id == TypeId::of::<f32>() || id == TypeId::of::<f64>() || id == TypeId::of::<half::f16>()
}

/// `dst (rows x cols, rows ldd apart) = lhs (rows x k) * rhs (k x cols)`, on `par`; nothing
/// for a `T` other than f32, f64 and f16 ([`supports`]).
///
/// The kernels prefer a destination stored by columns, so a destination stored by rows
/// (`ldd > 1`) is computed as its transpose, `rhs^T * lhs^T`, as `gemm::gemm` does. The
/// strides are unsigned, so none of `gemm::gemm`'s flips of negative strides apply.
///
/// # Safety
/// `lhs` and `rhs` address valid `rows x k` and `k x cols` matrices of initialised `T`; `dst`
/// is valid for writes of `rows` rows of `cols` elements `ldd >= cols` apart and overlaps
/// neither; every stride fits in an `isize`.
pub(super) unsafe fn gemm<T: 'static>(
    lhs: Mat<T>,
    rhs: Mat<T>,
    (dst, ldd): (*mut T, usize),
    (rows, k, cols): (usize, usize, usize),
    par: Parallelism,
) {
    let s = |x: usize| x as isize;
    let (m, n, dst_cs, dst_rs, a, b) = if ldd > 1 {
        (
            cols,
            rows,
            s(ldd),
            1,
            Mat { ptr: rhs.ptr, rs: rhs.cs, cs: rhs.rs },
            Mat { ptr: lhs.ptr, rs: lhs.cs, cs: lhs.rs },
        )
    } else {
        (rows, cols, 1, s(ldd), lhs, rhs)
    };
    macro_rules! call {
        ($kernel:expr, $t:ty, $zero:expr, $one:expr) => {{
            // SAFETY: `T` is `$t` (its `TypeId` was compared), so the casts of the pointers
            // reinterpret nothing. With `read_dst` false the kernel only writes `dst`
            // (`dst = 0 * dst + 1 * a * b`, the old values never read). It reads
            // `m x k` of `a` and `k x n` of `b` and writes `m x n` of `dst` with the strides
            // given: the caller's matrices, or their transposes with the strides swapped.
            unsafe {
                $kernel(
                    m,
                    n,
                    k,
                    dst.cast::<$t>(),
                    dst_cs,
                    dst_rs,
                    false,
                    a.ptr.cast::<$t>(),
                    s(a.cs),
                    s(a.rs),
                    b.ptr.cast::<$t>(),
                    s(b.cs),
                    s(b.rs),
                    $zero,
                    $one,
                    false,
                    false,
                    false,
                    par,
                )
            }
        }};
    }
    let id = TypeId::of::<T>();
    if id == TypeId::of::<f32>() {
        call!(gemm_f32::gemm::f32::get_gemm_fn(), f32, 0.0, 1.0);
    } else if id == TypeId::of::<f64>() {
        call!(gemm_f64::gemm::f64::get_gemm_fn(), f64, 0.0, 1.0);
    } else if id == TypeId::of::<half::f16>() {
        call!(gemm_f16::gemm::f16::get_gemm_fn(), half::f16, half::f16::ZERO, half::f16::ONE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rows x cols` values of `T` from small whole numbers (exact in every type), stored with
    /// strides `(rs, cs)` in a buffer big enough for them.
    fn matrix<T: Copy>(rows: usize, cols: usize, (rs, cs): (usize, usize), of: impl Fn(f32) -> T) -> Vec<T> {
        let len = if rows * cols == 0 { 1 } else { (rows - 1) * rs + (cols - 1) * cs + 1 };
        let mut v = vec![of(f32::NAN); len];
        for i in 0..rows {
            for j in 0..cols {
                v[i * rs + j * cs] = of(((i * 7 + j * 3) % 11) as f32 - 5.0);
            }
        }
        v
    }

    fn products_match_the_naive_one<T: Copy + 'static>(of: impl Fn(f32) -> T + Copy, back: impl Fn(T) -> f64) {
        assert!(supports::<T>());
        // Destinations by rows (computed transposed), a single column (`ldd == 1`, as is),
        // empty sums, and operands by rows, by columns and with gaps.
        for (rows, k, cols) in [(5, 7, 3), (4, 9, 1), (1, 6, 8), (3, 0, 2), (16, 33, 17)] {
            for (ls, rsd) in [((k, 1), (cols, 1)), ((1, rows), (1, k)), ((2 * k + 1, 2), (3 * cols, 3))] {
                let (a, b) = (matrix(rows, k, ls, of), matrix(k, cols, rsd, of));
                let ldd = cols + usize::from(cols > 1);
                let mut dst = vec![of(f32::NAN); rows.max(1) * ldd.max(1)];
                let (lhs, rhs) =
                    (Mat { ptr: a.as_ptr(), rs: ls.0, cs: ls.1 }, Mat { ptr: b.as_ptr(), rs: rsd.0, cs: rsd.1 });
                // SAFETY: the buffers hold the matrices with these strides; `dst` holds `rows`
                // rows of `cols` elements `ldd` apart and is separate.
                unsafe { gemm(lhs, rhs, (dst.as_mut_ptr(), ldd), (rows, k, cols), Parallelism::None) };
                for i in 0..rows {
                    for j in 0..cols {
                        let want: f64 =
                            (0..k).map(|p| back(a[i * ls.0 + p * ls.1]) * back(b[p * rsd.0 + j * rsd.1])).sum();
                        assert_eq!(
                            back(dst[i * ldd + j]),
                            want,
                            "{rows}x{k}x{cols}, strides {ls:?} {rsd:?}, [{i}, {j}]"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn f32_f64_and_f16_products_match_the_naive_one_in_every_layout() {
        products_match_the_naive_one(|x| x, f64::from);
        products_match_the_naive_one(f64::from, |x| x);
        products_match_the_naive_one(half::f16::from_f32, |x: half::f16| f64::from(x.to_f32()));
        assert!(!supports::<i32>() && !supports::<half::bf16>());
    }
}
