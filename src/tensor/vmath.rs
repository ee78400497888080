//! `f32` elementary functions written so that the compiler vectorises the loops calling them:
//! no branches, no table lookups, no calls; only IEEE additions, multiplications, divisions,
//! comparisons and integer operations on the bits (no fused multiply-add, so a loop gives the
//! same bits whichever vector extension it is compiled for).
//!
//! `f32::exp` and `libm::erff` are calls into scalar code, one element at a time (4-5 ns an
//! element here): GELU of a GPT-2 MLP activation (1024x3072) took 12x PyTorch's time, and
//! softmax of its attention scores 6x. These are the methods of
//! Cephes' `expf` (Cody and Waite's range reduction, a degree-7 polynomial) and, for GELU,
//! the complementary error function of Numerical Recipes' `erfcc` (relative error below
//! 1.2e-7 for every argument) with `x^2` carried in two parts.
//!
//! Accuracy over every `f32` (`exhaustive_accuracy`, ignored: it walks all 2^32 values, 25
//! minutes in release; a spread of a million of them is checked in every run): `exp` within
//! 0.99 ulp of the exact result, `gelu` within 7.6 ulp (at -4.02; counting a subnormal result's
//! ulp as the smallest subnormal). The old `0.5 * x * (1 + erff(x / √2))` lost the tail to
//! cancellation: 10% off at -5. PyTorch's vectorised loops are of the same kind (Sleef's 1-ulp
//! `exp`); its GELU's `erf` has an absolute error of 1.5e-7, 26% of `gelu(-5)`.

/// `e^x`.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    scaled_exp(x, 0.0, 1.0)
}

/// `scale * e^(hi + lo)`, for an argument computed in two parts (`lo` a few units at most),
/// rounded once even where the result is subnormal: the reduction subtracts `n ln 2` from `hi`
/// before `lo` is added, so that the bits `hi + lo` would round away are kept, and `scale`
/// (a normal number) multiplies before the power of two. NaN gives NaN; beyond `f32`'s range
/// `e^(hi + lo)` is taken as `inf` or 0.
#[inline(always)]
fn scaled_exp(hi: f32, lo: f32, scale: f32) -> f32 {
    const LOG2E: f32 = core::f32::consts::LOG2_E;
    // ln 2 in two parts: `LN2_HI` has 9 significant bits, so `n * LN2_HI` is exact for the
    // `|n| <= 150` used here, and `x - n * LN2_HI` is exact too (Cody and Waite).
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 * 2^23: adding it rounds to an integer (in the default rounding mode), which its
    // low bits then hold.
    const SHIFT: f32 = 12_582_912.0;
    // Beyond these, e^x is `inf` (e^88.73 > f32::MAX) or rounds to 0 (e^-103.98 < 2^-150).
    // Not `clamp`: that is `min`/`max`, which would turn NaN into a bound.
    let s = hi + lo;
    let (x, lo) = if s < -104.0 {
        (-104.0, 0.0)
    } else if s > 89.0 {
        (89.0, 0.0)
    } else {
        (hi, lo)
    };
    let sum = x + lo;
    let t = sum * LOG2E + SHIFT;
    let n = t - SHIFT;
    let r = (x - n * LN2_HI) - n * LN2_LO + lo;
    // e^r on |r| <= ln2 / 2 (Cephes' coefficients).
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1)
        * r
        + 0.5;
    let e = p * (r * r) + r + 1.0;
    // 2^n in two factors, each a normal number (n is in [-150, 129]), so that subnormal
    // results and 2^128 round once, in the last product (`e * scale` is a normal number).
    let n = (t.to_bits() as i32).wrapping_sub(SHIFT.to_bits() as i32);
    let n1 = n >> 1;
    let n2 = n.wrapping_sub(n1);
    let pow2 = |k: i32| f32::from_bits((k.wrapping_add(127) as u32).wrapping_shl(23));
    e * scale * pow2(n1) * pow2(n2)
}

/// `x * Φ(x)`, the exact GELU (`0.5 * x * (1 + erf(x / √2))`). Near 0 (`|x| < 0.7`, `erf` of
/// up to 0.5) with the series of `erf`; beyond, with `erfc(|x| / √2) / 2 = 1 - Φ(|x|)`, as
/// `x * (1 - erfc / 2)` for `x > 0` and `x * erfc / 2` below, so that the tail (`gelu(-5)` is
/// -1.4e-6, `gelu(-13)` -1.3e-37) keeps its relative accuracy. Below -20 the result is the
/// formula's `x * 0`: -0, and NaN for `-inf` (as in PyTorch).
#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    let a = if x.abs() > 20.0 { 20.0 } else { x.abs() };
    let z = a * core::f32::consts::FRAC_1_SQRT_2;
    // erf(z) for z < 0.5: 2/√π Σ (-1)^n z^(2n+1) / (n! (2n+1)), n <= 6 (the next term is
    // below 1e-9 of the sum).
    let zz = z * z;
    let series = z
        * (core::f32::consts::FRAC_2_SQRT_PI
            + zz * (-0.376_126_4
                + zz * (0.112_837_92
                    + zz * (-0.026_866_17 + zz * (0.005_223_978 + zz * (-8.548_327e-4 + zz * 1.205_533_3e-4))))));
    // erfc(z) = t e^(-z^2 + poly(t)), t = 1 / (1 + z / 2) (Numerical Recipes' `erfcc`).
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_204 + t * (1.488_515_9 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    // -z^2 = -a^2 / 2 exactly, as `sq + sq_lo` (Dekker's product: `a` split into two 12-bit
    // halves whose products are exact).
    let c = 4097.0 * a;
    let a_hi = c - (c - a);
    let a_lo = a - a_hi;
    let sq = a * a;
    let sq_lo = ((a_hi * a_hi - sq) + 2.0 * a_hi * a_lo) + a_lo * a_lo;
    let negative = x < 0.0;
    // x * erfc / 2 in one rounding for x < 0; erfc / 2 otherwise.
    let scale = if negative { 0.5 * t * (-a) } else { 0.5 * t };
    let w = scaled_exp(-0.5 * sq, poly - 0.5 * sq_lo, scale);
    let tail = if negative { w } else { x * (1.0 - w) };
    let near = x * (0.5 + 0.5 * if negative { -series } else { series });
    if x < -20.0 {
        x * 0.0
    } else if z < 0.5 {
        near
    } else {
        tail
    }
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

    /// The worst errors of `exp` and `gelu` (ulp, at which `x`) over the `f32`s whose bits are
    /// `0, step, 2 * step, ..`.
    fn worst(step: usize) -> [(f64, f32); 2] {
        let mut w = [(0f64, 0f32); 2];
        for bits in (0..=u32::MAX).step_by(step) {
            let x = f32::from_bits(bits);
            for (k, u) in [ulps(exp(x), f64::from(x).exp()), ulps(gelu(x), gelu_exact(x))].into_iter().enumerate() {
                if u > w[k].0 {
                    w[k] = (u, x);
                }
            }
        }
        w
    }

    fn check(step: usize) {
        let [e, g] = worst(step);
        assert!(e.0 <= 1.0, "exp({:e}): {} ulp", e.1, e.0);
        assert!(g.0 <= 8.0, "gelu({:e}): {} ulp", g.1, g.0);
    }

    #[test]
    fn exp_and_gelu_within_their_bounds_on_a_spread_of_floats() {
        check(4099);
    }

    #[test]
    #[ignore = "walks all 2^32 floats: 25 minutes in release (cargo test --release --lib -- --ignored vmath)"]
    fn exhaustive_accuracy() {
        let [e, g] = worst(1);
        eprintln!("exp: {} ulp at {:e}; gelu: {} ulp at {:e}", e.0, e.1, g.0, g.1);
        check(1);
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
    }
}
