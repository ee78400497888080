//! `f32` elementary functions written so that the compiler vectorises the loops calling them:
//! no branches, no table lookups; only IEEE additions, multiplications, fused multiply-adds,
//! divisions, comparisons and integer operations on the bits.
//!
//! Fused multiply-adds (`mul_add`, one rounding) evaluate the polynomials and the range
//! reductions, and give a square's rounding error exactly. They round the same way on every
//! machine, so a loop gives the same bits whichever vector extension it is compiled for
//! (`same_bits_in_every_isa`). The loops run compiled for AVX2 or AVX-512 (both have FMA);
//! in the x86-64 baseline build, used only on CPUs without AVX2 and FMA (before 2013), each
//! `mul_add` is a call to the C library's `fmaf`: the same bits, several times slower. Fused,
//! each function here takes less time than unfused (`docs/elementary-functions.md`).
//!
//! GELU, the sigmoid, SiLU, GELU's tanh form, `tanh`, `exp` and `ln` are written over [`Lanes`]:
//! one `f32`, or a group of AVX-512 vectors ([`avx512`]), which the unary kernels use for
//! contiguous `f32`, bf16 and f16 runs where the CPU has AVX-512. A vector at a time, these
//! functions' long chains of dependent steps left the vector units idle; four vectors side by
//! side keep them busy (`docs/elementary-functions.md`), with the same bits (each lane goes
//! through the scalar function's IEEE operations, in its order).
//! `set_avx512_blocks(false)` (or `TENSORMEM_AVX512_BLOCKS=0`) keeps every run on the one-vector
//! loop. CPUs with AVX2 but not AVX-512 run the same functions four AVX2 vectors side by side
//! ([`avx2`]; `set_avx2_blocks(false)` or `TENSORMEM_AVX2_BLOCKS=0` turn that off), all but
//! `tanh`; [`blocks`] says which blocks run here.
//!
//! `f32::exp`, `f32::tanh`, `f32::ln` and `libm::erff` are calls into scalar code, one element at a
//! time, several times PyTorch's vectorised loops. These are the methods of
//! Cephes' `expf` (Cody and Waite's range reduction, a degree-7 polynomial) and `logf`; for `tanh`,
//! `y / (y + 2)` with `y = e^(2|x|) - 1` from that reduction and polynomial (in one branch: Cephes'
//! `tanhf`, a polynomial below 0.625 and `e^(2|x|)` above, is slower, every lane computing
//! both); for GELU, the complementary error function in the form of Numerical Recipes'
//! `erfcc`, with a polynomial fitted here (`tensor/tools/gelu_fit.py`) and `x^2` carried in two parts;
//! and for the sigmoid family (`sigmoid`, `silu`, GELU's tanh form) `s e^v / (1 + e^v)` below 0, so
//! that the tail is a number where PyTorch's `1 / (1 + e^-v)` overflows to 0.
//!
//! Accuracy over every `f32` (`exhaustive_accuracy`, ignored: it walks all 2^32 values, minutes
//! in release; a spread of a million of them is checked in every run), counting a
//! subnormal result's ulp as the smallest subnormal: `exp` within 0.98 ulp of the exact result,
//! `ln` 0.83, `tanh` 2.42 at 0.0078 (Cephes' `tanhf` 1.33, PyTorch's Sleef `tanh` 1; the rounding
//! of `y + 2` is most of it), `sigmoid` 2.4, `silu` 3.4, `gelu` 5.08 (at -7.14; 5.14 at -13.1,
//! a subnormal result, before the sigmoids' and GELU's `e^r` took Estrin's scheme), and
//! `gelu_tanh` within 2.6 ulp per unit of its argument `2u` (the error that `2u`'s
//! own rounding carries through `e^(-2u)`, as in every f32 evaluation of that formula). The old
//! `0.5 * x * (1 + erff(x / √2))` lost the tail to cancellation: 10% off at -5. PyTorch's vectorised loops are of the same kind
//! (Sleef's 1-ulp `exp`); its GELU's `erf` has an absolute error of 1.5e-7, 26% of `gelu(-5)`.
//!
//! Results that are subnormal (`gelu` below -13, `gelu_tanh` below -10.3, `silu` below -87)
//! are computed, not flushed: on x86 each costs a microcode assist, so a tensor with many of
//! them runs slower. Small arguments, whose square is subnormal (below 1e-19), take no assist:
//! the squares go through multiply-adds, which do not round their products ([`p_r_r_plus_r`]),
//! or are taken of at least 2^-30, where the change is below half an ulp of the sum it goes
//! into (GELU's `x^2`), so tiny arguments take the time of ordinary ones. `exp` keeps the
//! unfused form (and its assists): fused, its worst error would go from 0.98 ulp to 1.016. bf16 and f16 tensors look these functions'
//! results up in tables computed here (`kernels::table`), at the same cost whatever the values.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
mod lanes;

use lanes::Lanes;

/// The functions written over [`Lanes`], which `avx512::run` runs on groups of vectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Func {
    Gelu,
    Silu,
    Sigmoid,
    GeluTanh,
    Tanh,
    Exp,
    Ln,
}

impl Func {
    /// Every function, in the order of their numbers (`Func as usize`).
    pub(crate) const ALL: [Func; 7] =
        [Func::Gelu, Func::Silu, Func::Sigmoid, Func::GeluTanh, Func::Tanh, Func::Exp, Func::Ln];

    /// The function on one `f32` (the bits of every other form of it).
    pub(crate) fn scalar(self) -> fn(f32) -> f32 {
        match self {
            Func::Gelu => gelu::<f32>,
            Func::Silu => silu::<f32>,
            Func::Sigmoid => sigmoid::<f32>,
            Func::GeluTanh => gelu_tanh::<f32>,
            Func::Tanh => tanh::<f32>,
            Func::Exp => exp::<f32>,
            Func::Ln => ln::<f32>,
        }
    }
}

/// A function over contiguous `f32` runs: `o[i] = f(x[i])` for `i < n`, where `x` is readable
/// and `o` writable for `n` `f32`s, and `o` is `x` or overlaps it nowhere (the CPU features it
/// needs are the ones [`blocks`] checked).
pub(crate) type BlocksRun = unsafe fn(Func, *const f32, *mut f32, usize);

/// The blocks that run `f` on `f32` runs here, several vectors side by side, with the bits of
/// the scalar function: [`avx512::run`] where the CPU has AVX-512 and its blocks are on,
/// [`avx2::run`] where it has AVX2 (not AVX-512) and those are on (not for `tanh`, whose
/// one-vector loop is faster there); `None` where the one-vector loops run.
pub(crate) fn blocks(f: Func) -> Option<BlocksRun> {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::kernels::{avx2_blocks_enabled, avx512_blocks_enabled};
        // Each switch is on only where `isa::detected()` is its extension.
        if avx512_blocks_enabled() {
            return Some(avx512::run);
        }
        if f != Func::Tanh && avx2_blocks_enabled() {
            return Some(avx2::run);
        }
    }
    let _ = f;
    None
}

/// The `Func`s as numbers, for the blocks' const parameters.
#[cfg(target_arch = "x86_64")]
mod id {
    use super::Func;
    pub(super) const GELU: u8 = Func::Gelu as u8;
    pub(super) const SILU: u8 = Func::Silu as u8;
    pub(super) const SIGMOID: u8 = Func::Sigmoid as u8;
    pub(super) const GELU_TANH: u8 = Func::GeluTanh as u8;
    pub(super) const TANH: u8 = Func::Tanh as u8;
    pub(super) const EXP: u8 = Func::Exp as u8;
    pub(super) const LN: u8 = Func::Ln as u8;
}

/// Function `F` (a [`Func`] as a number) on `x`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn apply<const F: u8, V: Lanes>(x: V) -> V {
    use id::*;
    match F {
        GELU => gelu(x),
        SILU => silu(x),
        SIGMOID => sigmoid(x),
        GELU_TANH => gelu_tanh(x),
        TANH => tanh(x),
        LN => ln(x),
        _ => exp(x),
    }
}

/// `c[0] x^(N-1) + c[1] x^(N-2) + .. + c[N-1]` by Horner's rule, each step a fused
/// multiply-add (one rounding).
#[inline(always)]
fn horner<V: Lanes, const N: usize>(x: V, c: [f32; N]) -> V {
    let mut acc = V::splat(c[0]);
    for &k in &c[1..] {
        acc = acc.mul_add(x, V::splat(k));
    }
    acc
}

/// `c[0] x^5 + .. + c[5]` by Estrin's scheme: 3 dependent steps where Horner's rule takes 5,
/// for one multiplication more. GELU's steps form one chain of about 100 cycles a vector, and
/// with a reorder buffer of 256 operations the AVX2 blocks' four vectors (about 320
/// operations) leave too little independent work to hide it, so a shorter chain is a faster
/// block (`docs/elementary-functions.md`). [`exp_parts`]' polynomial by this scheme shortens the
/// chain by 8 cycles. (GELU's own polynomial of degree 8 by Estrin's scheme, 16 cycles shorter
/// again, would take its error to 6.1 ulp at -11.8.)
#[inline(always)]
fn estrin6<V: Lanes>(x: V, c: [f32; 6]) -> V {
    let k = V::splat;
    let x2 = x * x;
    let pair = |i: usize| k(c[i]).mul_add(x, k(c[i + 1]));
    pair(0).mul_add(x2 * x2, pair(2).mul_add(x2, pair(4)))
}

/// `e^x`. NaN gives NaN; above 89 it is `inf`, below -150 0.
#[inline(always)]
pub(crate) fn exp<V: Lanes>(x: V) -> V {
    // Above 89, e^x is `inf` (e^88.73 > f32::MAX); below -150 it rounds to 0 (e^-103.98 <
    // 2^-150), and the clamp keeps the argument where [`exp_parts`] is exact (NaN stays NaN).
    let (e, t) = exp_parts::<false, _>(x.clamp(-150.0, 89.0), None);
    V::select(x.lt(V::splat(-150.0)), V::splat(0.0), e.scale_e_by_pow2(t))
}

/// `e^(hi + lo)` as `e 2^n`, for an argument in `[-150, 89]` given in one part or in two (`lo`
/// a few units at most): `e` in `[√½, √2]`, and `t`, whose bits hold `n` (see [`pow2_halves`],
/// [`pow2_plus`]). The reduction subtracts `n ln 2` from `hi` before `lo` is added, so that
/// the bits `hi + lo` would round away are kept. NaN gives a NaN `e`. `FUSED`: `e^r - 1` by
/// [`p_r_r_plus_r`] (no subnormal step for small `r`) and the polynomial by Estrin's scheme
/// ([`estrin6`]), for the functions whose error is more than `exp`'s own; else unfused and by
/// Horner's rule, `exp`'s 0.98 ulp.
#[inline(always)]
fn exp_parts<const FUSED: bool, V: Lanes>(hi: V, lo: Option<V>) -> (V, V) {
    const LOG2E: f32 = core::f32::consts::LOG2_E;
    let c = V::splat;
    let plus_lo = |v: V| lo.map_or(v, |lo| v + lo);
    let t = plus_lo(hi).mul_add(c(LOG2E), c(SHIFT));
    let n = t - c(SHIFT);
    let r = plus_lo(n.mul_add(c(-LN2_LO), n.mul_add(c(-LN2_HI), hi)));
    if FUSED {
        let p = estrin6(r, EXP_POLY);
        (p_r_r_plus_r(p, r) + c(1.0), t)
    } else {
        let p = horner(r, EXP_POLY);
        // Not fused: `p.mul_add(r * r, r)` took the worst error over all f32 from 0.98 ulp to
        // 1.01, and `p_r_r_plus_r` to 1.016.
        (p * (r * r) + r + c(1.0), t)
    }
}

/// ln 2 in two parts: `LN2_HI` has 9 significant bits, so `n * LN2_HI` is exact for the
/// `|n| <= 217` used here, and `x - n * LN2_HI` is exact too (Cody and Waite).
const LN2_HI: f32 = 0.693_359_4;
/// `ln 2 - LN2_HI`.
const LN2_LO: f32 = -2.121_944_4e-4;

/// `(e^r - 1 - r) / r^2` on `|r| <= ln 2 / 2`, for Horner's rule (Cephes' coefficients).
const EXP_POLY: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

/// 1.5 * 2^23: adding it rounds to an integer `n` (in the default rounding mode), which the
/// low bits of the sum then hold: `(n + SHIFT).to_bits() == SHIFT.to_bits() + n`.
const SHIFT: f32 = 12_582_912.0;

/// `2^n` in two factors, each a normal number, for the `t` of [`exp_parts`] (`n` in
/// `[-217, 129]`): multiplying by the first is exact, and by the second rounds once, also
/// where the result is subnormal.
#[inline(always)]
fn pow2_halves(t: f32) -> (f32, f32) {
    let n = (t.to_bits() as i32).wrapping_sub(SHIFT.to_bits() as i32);
    let n1 = n >> 1;
    let pow2 = |k: i32| f32::from_bits((k.wrapping_add(127) as u32).wrapping_shl(23));
    (pow2(n1), pow2(n.wrapping_sub(n1)))
}

/// `2^(n + EXTRA)` for the `t` of [`exp_parts`], where `n + EXTRA` is in `[-126, 127]`: a
/// normal number, in 2 integer operations instead of [`pow2_halves`]' 7 (`(n + 127 + EXTRA) <<
/// 23` is `t`'s bits shifted, plus a constant). With `EXTRA = 100` ([`TWO_M100`] undoes it) it
/// covers the `n` in `[-217, 0]` of an argument of at most 0: a product `v 2^(n + 100)` is then
/// exact, and the product of that by `2^-100` rounds once, as [`pow2_halves`]' factors do.
#[inline(always)]
fn pow2_plus<const EXTRA: u32>(t: f32) -> f32 {
    let bias = (127 + EXTRA).wrapping_sub(SHIFT.to_bits()).wrapping_shl(23);
    f32::from_bits(t.to_bits().wrapping_shl(23).wrapping_add(bias))
}

/// `2^-100`, the `EXTRA = 100` of [`pow2_plus`] undone.
const TWO_M100: f32 = f32::from_bits(27 << 23);

/// `scale / (1 + e^-v)`, for a `scale` of the sign of `v` (or 1) and at most `|v|` in magnitude
/// (or 1), so that `scale e^v 2^100` is finite ([`Lanes::scale_by_pow2`]). Where `v < 0` as
/// `scale e^v / (1 + e^v)`, with `scale e^v` rounded once: `e^-v` overflows from -88.7 while
/// `scale σ(v)` is a number down to about -104 (PyTorch's `1 / (1 + e^-v)` gives 0 there).
#[inline(always)]
fn scaled_sigmoid<V: Lanes>(scale: V, v: V) -> V {
    let c = V::splat;
    let neg = v.lt(c(0.0));
    // e^-|v| = e 2^n, n in [-217, 0]; below -150, `scale e^-|v|` rounds to 0 for every
    // `|scale| < e^46` (e^-103.98 < 2^-150).
    let x = -v.abs();
    let (e, t) = exp_parts::<true, _>(x.clamp(-150.0, 89.0), None);
    let s = V::select(neg, scale, c(1.0));
    let w = V::select(x.lt(c(-150.0)), s * c(0.0), (e * s).scale_by_pow2(t));
    V::select(neg, w, scale) / (c(1.0) + e.scale_by_pow2(t))
}

/// `1 / (1 + e^-x)`.
#[inline(always)]
pub(crate) fn sigmoid<V: Lanes>(x: V) -> V {
    scaled_sigmoid(V::splat(1.0), x)
}

/// `x * Φ(x)`, the exact GELU (`0.5 * x * (1 + erf(x / √2))`), from `q = 1 - Φ(|x|) =
/// erfc(|x| / √2) / 2`: `x * (1 - q)` for `x > 0` and `x * q` below, so that the negative tail
/// (`gelu(-5)` is -1.4e-6, `gelu(-13)` -1.3e-37) keeps its relative accuracy. Below -14.6 the
/// result rounds to -0 (`|x| q` is below 2^-150 from -14.4), and it is the formula's `x * 0`
/// there: -0, and NaN for `-inf` (as in PyTorch).
///
/// `erfc(z) = t e^(-z^2 + s P(s))` with `t = 1 / (1 + c z)` and `s = 1 - t` (Numerical Recipes'
/// `erfcc` form, with `c = 0.455` for its 0.5), and `P` of degree 8 fitted (Remez) to a relative
/// error of `erfc` below 1.1e-8 on `z` in `[0, 10.4]` (`tensor/tools/gelu_fit.py`). `s P(s)` is 0 at
/// `z = 0`, so it keeps its relative accuracy near 0 too, and one formula serves every argument:
/// within 5.08 ulp over all f32, about 3 near 0. (With Numerical Recipes' polynomial in `t`,
/// which sums terms of 1.5 to about 0 there, the formula is 6.2 ulp off near 0, and `|x| < 0.7`
/// needs a series of `erf` besides: 7.3 ulp at worst, and slower.)
#[inline(always)]
pub(crate) fn gelu<V: Lanes>(x: V) -> V {
    let c = V::splat;
    const EDGE: f32 = 14.6;
    // c / √2, so that `c z = K |x|`.
    const K: f32 = 0.321_733_6;
    // 2^-30 (exponent 127 - 30).
    const TINY: f32 = f32::from_bits(97 << 23);
    let a = x.abs().min(EDGE);
    let u = c(K) * a;
    // `t` to within an ulp (not `1 - s`: where `t` is small, that carries `s`'s rounding
    // error into it many times over).
    let t = c(1.0) / (c(1.0) + u);
    let s = u * t;
    let p = horner(
        s,
        [
            -0.183_730_92,
            0.625_786_24,
            -0.683_994_7,
            0.199_197_47,
            -0.111_787_75,
            0.228_421_21,
            0.270_753_3,
            -0.224_598_04,
            -1.479_956,
        ],
    );
    // -z^2 = -b^2 / 2 exactly, as `hi + lo`: a fused multiply-add gives the product's
    // rounding error exactly (`-0.5 b` is exact). The exponent is `hi` in one part and the
    // rest in another, in [-109, 0]. `b` is `a`, but 2^-30 below it: there `b^2 / 2` is
    // 2^-61 (a normal number, and so is its rounding error: see `p_r_r_plus_r`), below half an
    // ulp of the exponent's other part, `s P(s)` (about -0.48 |x|).
    let b = a.max(TINY);
    let h = c(-0.5) * b;
    let hi = h * b;
    let (e, k) = exp_parts::<true, _>(hi, Some(s.mul_add(p, h.mul_add(b, -hi))));
    let negative = x.lt(c(0.0));
    // x q, for x < 0, and q: `e 2^n` times `t` and by `|x|` where x < 0, then scaled by
    // 2^(n - 1) (the `/ 2` of `t / 2`), rounding once (for the subnormal results below -13).
    let w = (e * V::select(negative, t * -a, t)).half_scale_by_pow2(k);
    // Below -EDGE, `w` is `-EDGE q(EDGE)`, which rounds to -0; adding `x * 0` (-0 for a
    // negative `x`) leaves every `w` as it is, -0 included, but for `-inf`, where it makes the
    // result the formula's NaN. Above 0, x (1 - q) in one rounding (`a` is `x` up to the edge,
    // and keeps `inf - inf` out above).
    V::select(negative, w + x * c(0.0), (-a).mul_add(w, x))
}

/// `tanh(x)` as `y / (y + 2)` with `y = e^(2|x|) - 1`, the sign of `x` last (so that
/// `tanh(-0)` is -0). `y` is `2^n q + (2^n - 1)` in one rounding, with `q = e^r - 1` the
/// polynomial of [`exp_parts`] without its `+ 1` (`r = 2|x| - n ln 2`, `|r| <= ln 2 / 2`): near
/// 0, `n` is 0, `r` is `2|x|` exactly and `y` keeps its relative accuracy, so one formula serves
/// every argument. `2|x|` stops at 20, from where the result rounds to 1 (`2 / (e^20 + 1)` is
/// below half an ulp of 1). An error in `y` reaches the result damped by `2 / (y + 2)`.
#[inline(always)]
pub(crate) fn tanh<V: Lanes>(x: V) -> V {
    let c = V::splat;
    let a = x.abs();
    let d = (a + a).clamp(0.0, 20.0);
    let (q, t) = exp_minus_1_parts(d);
    // 2^n, n in [0, 29]: `2^n - 1` is exact up to n = 24; beyond, its rounding error (at most
    // 1) reaches the result damped by `2 / (y + 2)`, below 2^-23 there.
    let p = c(1.0).scale_by_normal_pow2(t);
    let y = p.mul_add(q, p - c(1.0));
    (y / (y + c(2.0))).copysign(x)
}

/// `e^x - 1` as `(q, t)` with `e^x - 1 = 2^n q + (2^n - 1)`: `q = e^r - 1` on `|r| <= ln 2 / 2`
/// (the polynomial of [`exp_parts`], without its `+ 1`, so that `q` keeps its relative
/// accuracy near 0), and `t` holding `n` as in [`exp_parts`]; for `x` in `[0, 89]`.
#[inline(always)]
fn exp_minus_1_parts<V: Lanes>(x: V) -> (V, V) {
    let c = V::splat;
    let t = x.mul_add(c(core::f32::consts::LOG2_E), c(SHIFT));
    let n = t - c(SHIFT);
    let r = n.mul_add(c(-LN2_LO), n.mul_add(c(-LN2_HI), x));
    let p = horner(r, EXP_POLY);
    (p_r_r_plus_r(p, r), t)
}

/// `p r^2 + r`, as `(p r) r + r` with one rounding after `p r`: `r * r` is subnormal for
/// `|r| < 2^-63`, and on x86 each operation giving or taking a subnormal costs a microcode
/// assist (many times an ordinary operation's time), while
/// `p r` (`p` near 1/2) is a normal number down to `|r|` = 2^-125 and the multiply-add's
/// product is not rounded. One operation fewer than `p * (r * r) + r`.
#[inline(always)]
fn p_r_r_plus_r<V: Lanes>(p: V, r: V) -> V {
    (p * r).mul_add(r, r)
}

/// `ln(x)`, as Cephes' `logf`: `x = m 2^e` with `m` in `[√½, √2)`, `ln(m)` by a polynomial of
/// degree 8 in `m - 1`, and `e ln 2` added in two parts ([`Lanes::frexp`] takes subnormals).
/// `ln(0) = -inf`, `ln(inf) = inf`, NaN below 0 and for NaN.
///
/// Where every lane is a positive normal number ([`Lanes::all_positive_normal`]; only the AVX2
/// blocks ask), the same steps without the edges. On AVX2 the edges take 7 blends (3
/// operations each on recent Intel cores) of about 53 operations a vector, so `log` of
/// positive normal numbers is much faster without them (`docs/elementary-functions.md`).
#[inline(always)]
pub(crate) fn ln<V: Lanes>(x: V) -> V {
    if x.all_positive_normal() {
        let (m, e) = x.frexp_normal();
        return ln_of_parts(m, e);
    }
    let (m, e) = x.frexp();
    // -inf for ±0, inf and NaN as they are ([`Lanes::ln_edges`]), NaN below 0 (`f32::NAN`'s
    // bits, as PyTorch's).
    V::select(x.lt(V::splat(0.0)), V::splat(f32::NAN), ln_of_parts(m, e).ln_edges(x))
}

/// `ln(m 2^e)` for `m` in `[0.5, 1)` and an integer `e`, the steps of [`ln`].
#[inline(always)]
fn ln_of_parts<V: Lanes>(m: V, e: V) -> V {
    let c = V::splat;
    let low = m.lt(c(core::f32::consts::FRAC_1_SQRT_2));
    // Below √½, `2m - 1` and `e - 1`: `m - 1` is exact (m >= 0.5), and so is `2m - 1`, however
    // it is summed; `x + 0` and `x - 0` are `x` (none is -0 here).
    let e = e - V::masked(low, c(1.0));
    let m = (m - c(1.0)) + V::masked(low, m);
    let z = m * m;
    let p = horner(
        m,
        [
            7.037_683_6e-2,
            -1.151_461e-1,
            1.167_699_84e-1,
            -1.242_014_1e-1,
            1.424_932_3e-1,
            -1.666_805_7e-1,
            2.000_071_4e-1,
            -2.499_999_4e-1,
            3.333_333e-1,
        ],
    ) * m
        * z;
    // ln 2 in two parts, as in `exp_parts` (`0.693_359_4 * e` is exact).
    c(0.693_359_4).mul_add(e, m + c(-0.5).mul_add(z, c(-2.121_944_4e-4).mul_add(e, p)))
}

/// `x σ(x) = x / (1 + e^-x)` (SiLU, or swish), as PyTorch computes it: -0 where `e^-x` is
/// `inf`, NaN for `-inf`.
#[inline(always)]
pub(crate) fn silu<V: Lanes>(x: V) -> V {
    scaled_sigmoid(x, x)
}

/// GELU's tanh approximation (PyTorch's `approximate='tanh'`), `x (1 + tanh(u)) / 2` with
/// `u = √(2/π) (x + 0.044715 x³)`, computed as `x / (1 + e^(-2u))`, which is the same function:
/// no cancellation in `1 + tanh(u)`, so the negative tail keeps its relative accuracy
/// (PyTorch's formula gives -0 below about -4.3, where `tanh(u)` rounds to -1). The error is
/// that of `2u`'s rounding carried through `e^(-2u)`: about `|2u|` units in the last place.
#[inline(always)]
pub(crate) fn gelu_tanh<V: Lanes>(x: V) -> V {
    // 2√(2/π) and 2√(2/π) 0.044715; `x (a + b x x)` with `b x` rounded and the rest in one
    // multiply-add, whose product is not rounded: `x * x` is subnormal below 2^-63, where each
    // operation on it costs a microcode assist (see `p_r_r_plus_r`).
    let c = V::splat;
    scaled_sigmoid(x, x * x.mul_add(c(7.135_481_4e-2) * x, c(1.595_769_2)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The distance from `got` to the exact `want`, in units of the last place of `want`
    /// rounded to `f32` (at least the smallest subnormal's).
    fn ulps(got: f32, want: f64) -> f64 {
        if got == want as f32 || (got.is_nan() && want.is_nan()) {
            return 0.0;
        }
        if !got.is_finite() || want.is_nan() {
            return f64::INFINITY;
        }
        let w = want as f32;
        let ulp = if w.is_infinite() {
            f64::from(f32::MAX) * f64::EPSILON * 2f64.powi(29)
        } else {
            (f64::from(f32::from_bits(w.abs().to_bits() + 1)) - f64::from(w.abs())).max(f64::from(f32::from_bits(1)))
        };
        (f64::from(got) - want).abs() / ulp
    }

    fn gelu_exact(x: f32) -> f64 {
        let x = f64::from(x);
        0.5 * x * libm::erfc(-x * core::f64::consts::FRAC_1_SQRT_2)
    }

    /// `2u` of [`gelu_tanh`], in f64.
    fn two_u(x: f32) -> f64 {
        let x = f64::from(x);
        2.0 * (2.0 / core::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)
    }

    /// The functions checked, each with its exact result in f64 and its bound in ulp (for
    /// `gelu_tanh` in ulp per unit of `1 + |2u|`, the error its argument's rounding brings).
    /// A function's name, itself, its exact value and its bound.
    type Checked = (&'static str, fn(f32) -> f32, fn(f32) -> f64, f64);

    const FUNCTIONS: [Checked; 7] = [
        ("sigmoid", sigmoid, |x| 1.0 / (1.0 + (-f64::from(x)).exp()), 3.0),
        ("exp", exp, |x| f64::from(x).exp(), 1.0),
        ("gelu", gelu, gelu_exact, 6.0),
        ("tanh", tanh, |x| f64::from(x).tanh(), 2.5),
        ("ln", ln, |x| f64::from(x).ln(), 1.0),
        ("silu", silu, |x| f64::from(x) / (1.0 + (-f64::from(x)).exp()), 4.0),
        ("gelu_tanh", gelu_tanh, |x| f64::from(x) / (1.0 + (-two_u(x)).exp()), 3.0),
    ];

    /// The error of function `k` at `x`, in the unit its bound is given in.
    fn error(k: usize, x: f32) -> f64 {
        let (_, f, exact, _) = FUNCTIONS[k];
        let u = ulps(f(x), exact(x));
        if FUNCTIONS[k].0 == "gelu_tanh" { u / (1.0 + two_u(x).abs().min(1e30)) } else { u }
    }

    /// The worst errors of the functions (and where) over the `f32`s whose bits are
    /// `0, step, 2 * step, ..`, on every core.
    fn worst(step: usize) -> [(f64, f32); 7] {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let span = (1u64 << 32).div_ceil(threads);
        let parts: Vec<[(f64, f32); 7]> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    s.spawn(move || {
                        let mut w = [(0f64, 0f32); 7];
                        let first = (t * span).div_ceil(step as u64) * step as u64;
                        let end = ((t + 1) * span).min(1 << 32);
                        for bits in (first..end).step_by(step) {
                            let x = f32::from_bits(bits as u32);
                            for (k, worst) in w.iter_mut().enumerate() {
                                let e = error(k, x);
                                if e > worst.0 {
                                    *worst = (e, x);
                                }
                            }
                        }
                        w
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("no panic")).collect()
        });
        let mut w = [(0f64, 0f32); 7];
        for part in parts {
            for (k, p) in part.into_iter().enumerate() {
                if p.0 > w[k].0 {
                    w[k] = p;
                }
            }
        }
        w
    }

    fn check(step: usize) {
        let w = worst(step);
        for (k, (name, _, _, bound)) in FUNCTIONS.iter().enumerate() {
            eprintln!("{name}: {} at {:e}", w[k].0, w[k].1);
            assert!(w[k].0 <= *bound, "{name}({:e}): {} ulp", w[k].1, w[k].0);
        }
    }

    #[test]
    fn functions_within_their_bounds_on_a_spread_of_floats() {
        check(4099);
    }

    #[test]
    #[ignore = "walks all 2^32 floats, too long for every run (cargo test --release --lib -- --ignored exhaustive_accuracy)"]
    fn exhaustive_accuracy() {
        check(1);
    }

    /// The blocks of every kind this CPU runs (whatever `TENSORMEM_CPU_CAPABILITY` says), by name.
    fn every_blocks() -> Vec<(&'static str, BlocksRun)> {
        #[allow(unused_mut)]
        let mut runs: Vec<(&'static str, BlocksRun)> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            let has = |f: &str| match f {
                "avx512" => {
                    is_x86_feature_detected!("avx512f")
                        && is_x86_feature_detected!("avx512bw")
                        && is_x86_feature_detected!("avx512vl")
                }
                _ => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            };
            if has("avx512") {
                runs.push(("avx512", avx512::run));
            }
            if has("avx2") {
                runs.push(("avx2", avx2::run));
            }
        }
        if runs.is_empty() {
            eprintln!("no blocks to check: this CPU has neither AVX-512 nor AVX2 and FMA");
        }
        runs
    }

    /// Every function over a spread of floats and the special values, through the blocks of
    /// every kind, in runs of every length up to 200 and one long run, in place and apart: the
    /// bits must be the scalar function's, and nothing past the run is written.
    #[test]
    fn blocks_give_the_scalar_functions_bits() {
        let mut xs: Vec<f32> = (0..1u64 << 32).step_by(40_009).map(|b| f32::from_bits(b as u32)).collect();
        xs.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MIN_POSITIVE, f32::MAX]);
        xs.extend([-14.6, -14.4, 14.6, -20.0, -150.0, -150.1, -88.0, -104.0, 1e-40, -1e-40, 1e-20, -1e-20]);
        xs.extend([-1.0, 0.707, f32::from_bits(1), f32::from_bits(0x8000_0001), f32::from_bits(0x7fc0_0001)]);
        // The same values where each block of 64 (AVX-512's) and of 32 (AVX2's) has one edge
        // among positive normal numbers, in every lane (the AVX2 `ln` takes another path where
        // a block has only those).
        let edges = [0.0, -0.0, -1.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40, f32::MIN_POSITIVE];
        for (k, &e) in edges.iter().enumerate() {
            for lane in 0..64 {
                xs.extend((0..64).map(|i| if i == lane { e } else { 0.5 + (i + k) as f32 * 0.37 }));
            }
        }
        let bits = |y: f32| if y.is_nan() { u32::MAX } else { y.to_bits() };
        for (name, run) in every_blocks() {
            for f in Func::ALL {
                let want: Vec<u32> = xs.iter().map(|&x| bits(f.scalar()(x))).collect();
                let mut out = vec![0f32; xs.len()];
                // SAFETY: the CPU has the blocks' extension (`every_blocks`); `xs` and `out`
                // hold `xs.len()` each, apart.
                unsafe { run(f, xs.as_ptr(), out.as_mut_ptr(), xs.len()) };
                if let Some(i) = (0..xs.len()).find(|&i| bits(out[i]) != want[i]) {
                    panic!("{f:?} in {name} at {:e}: {:e}, not {:e}", xs[i], out[i], f32::from_bits(want[i]));
                }
                for n in 0..200 {
                    for start in [0, 7, 1000, xs.len() - 201] {
                        let mut buf = xs[start..start + n + 1].to_vec();
                        // SAFETY: as above; `o` is `x`, `n` of the `n + 1` elements.
                        unsafe { run(f, buf.as_ptr(), buf.as_mut_ptr(), n) };
                        let got: Vec<u32> = buf[..n].iter().map(|&y| bits(y)).collect();
                        assert_eq!(got, want[start..start + n], "{f:?} in {name}, {n} from {start}");
                        assert_eq!(bits(buf[n]), bits(xs[start + n]), "{f:?} in {name}: wrote past {n} from {start}");
                    }
                }
            }
        }
    }

    /// Every `f32` through each function, in one run through the blocks of every kind and
    /// through the scalar function: the same bits.
    #[test]
    #[ignore = "walks all 2^32 floats seven times for each kind of blocks the CPU runs, too long for every run (cargo test --release --lib -- --ignored every_f32)"]
    fn blocks_give_the_same_bits_on_every_f32() {
        use crate::kernels::isa::{Isa, vectorised};
        let mut xs = vec![0f32; 1 << 24];
        let (mut want, mut got) = (vec![0f32; 1 << 24], vec![0f32; 1 << 24]);
        let runs = every_blocks();
        // The scalar function named in a loop compiled for the widest extension, so that it is
        // inlined and vectorised (through a pointer it is compiled for the baseline: 20 times
        // slower).
        macro_rules! check {
            ($($f:ident $k:ident),*) => {$(
                for high in 0..256u32 {
                    for (i, x) in xs.iter_mut().enumerate() {
                        *x = f32::from_bits(high << 24 | i as u32);
                    }
                    vectorised!(Isa::Avx512, {
                        for (w, &x) in want.iter_mut().zip(&xs) {
                            *w = $f(x);
                        }
                    });
                    for (name, run) in &runs {
                        // SAFETY: the CPU has the blocks' extension (`every_blocks`); `xs` and
                        // `got` hold 2^24 each.
                        unsafe { run(Func::$k, xs.as_ptr(), got.as_mut_ptr(), xs.len()) };
                        for ((&x, &y), &w) in xs.iter().zip(&got).zip(&want) {
                            let same = y.to_bits() == w.to_bits() || (y.is_nan() && w.is_nan());
                            assert!(same, "{} in {name} at {x:e}: {y:e}, not {w:e}", stringify!($f));
                        }
                    }
                }
            )*};
        }
        check!(gelu Gelu, silu Silu, sigmoid Sigmoid, gelu_tanh GeluTanh, tanh Tanh, exp Exp, ln Ln);
    }

    /// Every function over a spread of floats (and the special values), in loops compiled for
    /// each vector extension: the bits must be the baseline's.
    #[test]
    fn same_bits_in_every_isa() {
        use crate::kernels::isa::{Isa, vectorised};
        let mut xs: Vec<f32> = (0..1u64 << 32).step_by(65_537).map(|b| f32::from_bits(b as u32)).collect();
        xs.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MIN_POSITIVE, f32::MAX]);
        xs.extend([-14.6, -14.4, 14.6, -20.0, -150.0]);
        /// The bits of `y`; a NaN stands for every NaN (which payload comes through is not
        /// specified).
        #[inline(always)]
        fn bits(y: f32) -> u32 {
            if y.is_nan() { u32::MAX } else { y.to_bits() }
        }
        // Each function is named in a plain loop, not called through a pointer or a closure,
        // so that it is inlined there and compiled for the extension under test (a closure
        // is compiled on its own, for the baseline).
        macro_rules! same_bits {
            ($($f:ident),*) => {
                // Every function the accuracy tests check, and no other.
                let mut named = vec![$(stringify!($f)),*];
                let mut checked: Vec<&str> = FUNCTIONS.iter().map(|f| f.0).collect();
                named.sort_unstable();
                checked.sort_unstable();
                assert_eq!(named, checked, "same_bits_in_every_isa names FUNCTIONS");
                $(
                    let mut base = vec![0u32; xs.len()];
                    for (b, &x) in base.iter_mut().zip(&xs) {
                        *b = bits($f(x));
                    }
                    for isa in [Isa::Avx2, Isa::Avx512] {
                        let mut got = vec![0u32; xs.len()];
                        vectorised!(isa, {
                            for (g, &x) in got.iter_mut().zip(&xs) {
                                *g = bits($f(x));
                            }
                        });
                        assert_eq!(got, base, "{} in {isa:?}", stringify!($f));
                    }
                )*
            };
        }
        same_bits!(exp, ln, tanh, sigmoid, silu, gelu, gelu_tanh);
    }

    /// Arguments whose square is subnormal (the steps that would cost assists take multiply-adds
    /// or 2^-30 instead) give the correctly rounded results: `x / 2` for GELU and its tanh form
    /// and SiLU, 1/2 for the sigmoid, `x` for `tanh`.
    #[test]
    fn small_arguments_are_correctly_rounded() {
        for x in [1e-20f32, -3.7e-25, 2.1e-30, -1e-37, 6e-13, -9.3e-10] {
            let half = x / 2.0;
            assert_eq!(gelu(x), half, "gelu({x:e})");
            assert_eq!(gelu_tanh(x), half, "gelu_tanh({x:e})");
            assert_eq!(silu(x), half, "silu({x:e})");
            assert_eq!(sigmoid(x), 0.5, "sigmoid({x:e})");
            assert_eq!(tanh(x), x, "tanh({x:e})");
        }
    }

    #[test]
    fn special_values() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(88.8), f32::INFINITY);
        assert!(ulps(exp(88.72), f64::from(88.72f32).exp()) <= 1.0);
        assert_eq!(exp(-104.0), 0.0);
        assert_eq!(exp(-103.9), f32::from_bits(1));
        assert_eq!(gelu(f32::INFINITY), f32::INFINITY);
        assert!(gelu(f32::NEG_INFINITY).is_nan(), "-inf * 0, as PyTorch's formula gives");
        assert!(gelu(f32::NAN).is_nan());
        assert_eq!(gelu(0.0), 0.0);
        assert!(gelu(-0.0).is_sign_negative());
        assert_eq!(gelu(30.0), 30.0);
        assert_eq!(gelu(-30.0), -0.0);
        assert_eq!(tanh(0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(tanh(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh(50.0), 1.0);
        assert!(tanh(f32::NAN).is_nan());
        assert_eq!(ln(1.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(ln(0.0), f32::NEG_INFINITY);
        assert_eq!(ln(-0.0), f32::NEG_INFINITY);
        assert_eq!(ln(f32::INFINITY), f32::INFINITY);
        assert!(ln(-1.0).is_nan() && ln(f32::NEG_INFINITY).is_nan() && ln(f32::NAN).is_nan());
        assert!(ulps(ln(f32::from_bits(1)), f64::from(f32::from_bits(1)).ln()) <= 1.0);
        assert_eq!(silu(0.0), 0.0);
        assert_eq!(silu(-200.0).to_bits(), (-0.0f32).to_bits());
        assert!(silu(f32::NEG_INFINITY).is_nan(), "-inf / inf, as PyTorch's formula gives");
        assert_eq!(silu(f32::INFINITY), f32::INFINITY);
        assert_eq!(gelu_tanh(f32::INFINITY), f32::INFINITY);
        assert!(gelu_tanh(f32::NEG_INFINITY).is_nan(), "-inf * 0, as PyTorch's formula gives");
        assert_eq!(gelu_tanh(1e30), 1e30);
        assert_eq!(gelu_tanh(-1e30).to_bits(), (-0.0f32).to_bits());
        assert!(gelu_tanh(-0.0).is_sign_negative());
        assert!(gelu_tanh(f32::NAN).is_nan() && silu(f32::NAN).is_nan());
    }
}
