//! GELU, SiLU, the sigmoid, GELU's tanh form, `tanh`, `exp` and `ln` over contiguous runs, four
//! AVX-512 vectors (64 elements) side by side.
//!
//! The plain loops run one vector through a function at a time. Its steps depend on one
//! another (GELU: a division, two polynomials, about 140 cycles from input to result), so the
//! out-of-order core holds one or two vectors' worth of waiting instructions and leaves the
//! vector units idle much of the time: GELU took about 35 cycles per vector on a Xeon (Emerald
//! Rapids) for 52 instructions that its two 512-bit ports issue in 26. Written here with every
//! step applied to four vectors before the next, the instructions of four vectors are
//! interleaved in the program, and `2^n` scaling is one `vscalefps`; each lane goes through
//! the same IEEE operations as the scalar function, so the bits are the scalar function's
//! (`same_bits_as_the_scalar_functions`, `same_bits_on_every_f32`).

use core::arch::x86_64::*;
use core::ops::{Add, Div, Mul, Neg, Sub};

use super::Func;
use super::lanes::Lanes;

// The `Func`s as numbers, for `blocks`' const parameter.
const GELU: u8 = Func::Gelu as u8;
const SILU: u8 = Func::Silu as u8;
const SIGMOID: u8 = Func::Sigmoid as u8;
const GELU_TANH: u8 = Func::GeluTanh as u8;
const TANH: u8 = Func::Tanh as u8;
const EXP: u8 = Func::Exp as u8;
const LN: u8 = Func::Ln as u8;

/// `M` vectors of 16 `f32`. Made only in [`blocks`], which runs only where the CPU has AVX-512 F:
/// that is what makes the intrinsics in its methods sound.
#[derive(Clone, Copy)]
pub(crate) struct Zmm<const M: usize>([__m512; M]);

/// `Zmm` from `$e`, evaluated for each vector `$k`, each intrinsic call sound because the
/// CPU has AVX-512 F (see [`Zmm`]).
macro_rules! each {
    (|$k:ident| $e:expr) => {{
        let mut r = [
            // SAFETY: a `Zmm` exists only where the CPU has AVX-512 F (see `Zmm`).
            unsafe { _mm512_setzero_ps() };
            M
        ];
        for $k in 0..M {
            // SAFETY: as above.
            r[$k] = unsafe { $e };
        }
        Zmm(r)
    }};
}

macro_rules! binary {
    ($($trait:ident $method:ident $intrinsic:ident),*) => {$(
        impl<const M: usize> $trait for Zmm<M> {
            type Output = Self;
            #[inline(always)]
            fn $method(self, o: Self) -> Self {
                each!(|k| $intrinsic(self.0[k], o.0[k]))
            }
        }
    )*};
}
binary!(Add add _mm512_add_ps, Sub sub _mm512_sub_ps, Mul mul _mm512_mul_ps, Div div _mm512_div_ps);

impl<const M: usize> Neg for Zmm<M> {
    type Output = Self;
    /// The sign bit flipped, as `-x` on an `f32`.
    #[inline(always)]
    fn neg(self) -> Self {
        each!(|k| _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(self.0[k]), _mm512_set1_epi32(i32::MIN))))
    }
}

impl<const M: usize> Lanes for Zmm<M> {
    type Mask = [__mmask16; M];

    #[inline(always)]
    fn splat(v: f32) -> Self {
        each!(|_k| _mm512_set1_ps(v))
    }

    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        each!(|k| _mm512_fmadd_ps(self.0[k], a.0[k], b.0[k]))
    }

    #[inline(always)]
    fn abs(self) -> Self {
        each!(|k| _mm512_abs_ps(self.0[k]))
    }

    #[inline(always)]
    fn lt(self, o: Self) -> Self::Mask {
        // SAFETY: a `Zmm` exists only where the CPU has AVX-512 F (see `Zmm`).
        core::array::from_fn(|k| unsafe { _mm512_cmp_ps_mask::<_CMP_LT_OQ>(self.0[k], o.0[k]) })
    }

    #[inline(always)]
    fn gt(self, o: Self) -> Self::Mask {
        // SAFETY: as in `lt`.
        core::array::from_fn(|k| unsafe { _mm512_cmp_ps_mask::<_CMP_GT_OQ>(self.0[k], o.0[k]) })
    }

    #[inline(always)]
    fn select(m: Self::Mask, a: Self, b: Self) -> Self {
        each!(|k| _mm512_mask_blend_ps(m[k], b.0[k], a.0[k]))
    }

    /// `vmaxps` and `vminps` give their second operand where either is NaN: `max(lo, x)` is
    /// `if x < lo { lo } else { x }`, as `f32::clamp`.
    #[inline(always)]
    fn clamp(self, lo: f32, hi: f32) -> Self {
        each!(|k| _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), self.0[k])))
    }

    /// `vscalefps`: `self 2^n` rounded once, `n` being `t - SHIFT` (an integer).
    #[inline(always)]
    fn scale_by_pow2(self, t: Self) -> Self {
        let n = t - Self::splat(super::SHIFT);
        each!(|k| _mm512_scalef_ps(self.0[k], n.0[k]))
    }

    /// As [`scale_by_pow2`](Lanes::scale_by_pow2): `self 2^n` rounded once.
    #[inline(always)]
    fn scale_by_normal_pow2(self, t: Self) -> Self {
        self.scale_by_pow2(t)
    }

    /// As [`scale_by_pow2`](Lanes::scale_by_pow2): `self 2^n` rounded once.
    #[inline(always)]
    fn scale_e_by_pow2(self, t: Self) -> Self {
        self.scale_by_pow2(t)
    }

    #[inline(always)]
    fn copysign(self, sign: Self) -> Self {
        each!(|k| {
            let (m, v, s) =
                (_mm512_set1_epi32(i32::MIN), _mm512_castps_si512(self.0[k]), _mm512_castps_si512(sign.0[k]));
            _mm512_castsi512_ps(_mm512_or_si512(_mm512_andnot_si512(m, v), _mm512_and_si512(m, s)))
        })
    }

    /// `vgetmantps` (normalised to `[0.5, 1)`) and `vgetexpps` (`floor(log2 |x|)`, so one
    /// more for that interval), both exact and both taking subnormals as the numbers they are.
    #[inline(always)]
    fn frexp(self) -> (Self, Self) {
        let m = each!(|k| _mm512_getmant_ps::<_MM_MANT_NORM_P5_1, _MM_MANT_SIGN_ZERO>(self.0[k]));
        let e = each!(|k| _mm512_getexp_ps(self.0[k]));
        (m, e + Self::splat(1.0))
    }
}

/// Function `F` (a [`Func`] as a number) on `x`.
#[inline(always)]
fn apply<const F: u8, V: Lanes>(x: V) -> V {
    match F {
        GELU => super::gelu(x),
        SILU => super::silu(x),
        SIGMOID => super::sigmoid(x),
        GELU_TANH => super::gelu_tanh(x),
        TANH => super::tanh(x),
        LN => super::ln(x),
        _ => super::exp(x),
    }
}

/// `o[i] = f(x[i])` for `i < n`: 64 elements at a time, then 16 at a time, the last ones
/// under a mask.
///
/// # Safety
/// The CPU has AVX-512 F. `x` is readable and `o` writable for `n` `f32`s, and `o` is `x` or
/// overlaps it nowhere.
pub(crate) unsafe fn run(f: Func, x: *const f32, o: *mut f32, n: usize) {
    // SAFETY: the caller's promise.
    unsafe {
        match f {
            Func::Gelu => blocks::<GELU>(x, o, n),
            Func::Silu => blocks::<SILU>(x, o, n),
            Func::Sigmoid => blocks::<SIGMOID>(x, o, n),
            Func::GeluTanh => blocks::<GELU_TANH>(x, o, n),
            Func::Tanh => blocks::<TANH>(x, o, n),
            Func::Exp => blocks::<EXP>(x, o, n),
            Func::Ln => blocks::<LN>(x, o, n),
        }
    }
}

/// [`run`] for function `F`, compiled for AVX-512.
///
/// # Safety
/// As [`run`].
#[target_feature(enable = "avx512f")]
unsafe fn blocks<const F: u8>(x: *const f32, o: *mut f32, n: usize) {
    let mut i = 0;
    while n - i >= 64 {
        let mut v = [_mm512_setzero_ps(); 4];
        for (k, v) in v.iter_mut().enumerate() {
            // SAFETY: `i + 16 k + 16 <= n`: readable (the caller's promise).
            *v = unsafe { _mm512_loadu_ps(x.add(i + 16 * k)) };
        }
        let r = apply::<F, _>(Zmm(v));
        for (k, r) in r.0.into_iter().enumerate() {
            // SAFETY: as the loads; `o` is `x` (each element read before it is written, in
            // this step) or disjoint from it.
            unsafe { _mm512_storeu_ps(o.add(i + 16 * k), r) };
        }
        i += 64;
    }
    while i < n {
        let m: __mmask16 = if n - i >= 16 { u16::MAX } else { (1u16 << (n - i)) - 1 };
        // SAFETY: a masked load reads only the lanes of `m`, elements below `n`; the others
        // are 0 and are not stored.
        let v = unsafe { _mm512_maskz_loadu_ps(m, x.add(i)) };
        let r = apply::<F, _>(Zmm([v]));
        // SAFETY: the lanes of `m` only, writable as above.
        unsafe { _mm512_mask_storeu_ps(o.add(i), m, r.0[0]) };
        i += 16;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::kernels::isa::{Isa, detected};

    /// Every function over a spread of floats and the special values, in runs of every length
    /// up to 200 and one long run: the bits must be the scalar function's.
    #[test]
    fn same_bits_as_the_scalar_functions() {
        if detected() != Isa::Avx512 {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        let mut xs: Vec<f32> = (0..1u64 << 32).step_by(40_009).map(|b| f32::from_bits(b as u32)).collect();
        xs.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MIN_POSITIVE, f32::MAX]);
        xs.extend([-14.6, -14.4, 14.6, -20.0, -150.0, -150.1, -88.0, -104.0, 1e-40, -1e-40]);
        let bits = |y: f32| if y.is_nan() { u32::MAX } else { y.to_bits() };
        fn check(f: Func, xs: &[f32], scalar: fn(f32) -> f32, bits: impl Fn(f32) -> u32) {
            let want: Vec<u32> = xs.iter().map(|&x| bits(scalar(x))).collect();
            let mut out = vec![0f32; xs.len()];
            // SAFETY: AVX-512 is there (checked above); `xs` and `out` hold `xs.len()` each.
            unsafe { run(f, xs.as_ptr(), out.as_mut_ptr(), xs.len()) };
            let got: Vec<u32> = out.iter().map(|&y| bits(y)).collect();
            assert_eq!(got, want, "{f:?}");
            // In place, and every short length (the masked tail), from a few offsets.
            for n in 0..200 {
                for start in [0, 7, 1000] {
                    let mut buf = xs[start..start + n].to_vec();
                    // SAFETY: as above; `o` is `x`.
                    unsafe { run(f, buf.as_ptr(), buf.as_mut_ptr(), n) };
                    let got: Vec<u32> = buf.iter().map(|&y| bits(y)).collect();
                    assert_eq!(got, want[start..start + n], "{f:?}, {n} from {start}");
                }
            }
        }
        check(Func::Gelu, &xs, super::super::gelu, bits);
        check(Func::Silu, &xs, super::super::silu, bits);
        check(Func::Sigmoid, &xs, super::super::sigmoid, bits);
        check(Func::GeluTanh, &xs, super::super::gelu_tanh, bits);
        check(Func::Tanh, &xs, super::super::tanh, bits);
        check(Func::Exp, &xs, super::super::exp, bits);
        check(Func::Ln, &xs, super::super::ln, bits);
    }

    /// Every `f32` through each function, as one run and through the scalar function: the
    /// same bits.
    #[test]
    #[ignore = "walks all 2^32 floats seven times: about 5 minutes in release (cargo test --release --lib -- --ignored avx512)"]
    fn same_bits_on_every_f32() {
        use crate::tensor::kernels::isa::vectorised;
        if detected() != Isa::Avx512 {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        let mut xs = vec![0f32; 1 << 24];
        let (mut want, mut got) = (vec![0f32; 1 << 24], vec![0f32; 1 << 24]);
        // The scalar function named in a loop compiled for AVX-512, so that it is inlined and
        // vectorised (through a pointer it is compiled for the baseline: 20 times slower).
        macro_rules! check {
            ($($f:ident $k:ident),*) => {$(
                for high in 0..256u32 {
                    for (i, x) in xs.iter_mut().enumerate() {
                        *x = f32::from_bits(high << 24 | i as u32);
                    }
                    vectorised!(Isa::Avx512, {
                        for (w, &x) in want.iter_mut().zip(&xs) {
                            *w = super::super::$f(x);
                        }
                    });
                    // SAFETY: AVX-512 is there (checked above); `xs` and `got` hold 2^24 each.
                    unsafe { run(Func::$k, xs.as_ptr(), got.as_mut_ptr(), xs.len()) };
                    for ((&x, &y), &w) in xs.iter().zip(&got).zip(&want) {
                        let same = y.to_bits() == w.to_bits() || (y.is_nan() && w.is_nan());
                        assert!(same, "{} at {x:e}: {y:e}, not {w:e}", stringify!($f));
                    }
                }
            )*};
        }
        check!(gelu Gelu, silu Silu, sigmoid Sigmoid, gelu_tanh GeluTanh, tanh Tanh, exp Exp, ln Ln);
    }
}
