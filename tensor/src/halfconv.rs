//! f16 and bf16 to and from f32 in plain integer and float arithmetic, which the compiler
//! inlines and vectorises.
//!
//! The `half` crate's `to_f32` / `from_f32` test the CPU for F16C on every call; the call
//! stays out of line and keeps every loop over half-precision elements scalar, many times slower
//! than an f32 loop (`docs/half-precision-tables.md`). These give the same results: widening is exact, narrowing rounds to
//! nearest, ties to even, overflowing to infinity; NaN stays NaN (quiet; f16 keeps the top 10
//! bits of its payload and bf16 the top 7, as F16C and the `half` crate do). Every kernel
//! computes half-precision values in f32 through them, as PyTorch does.

use half::{bf16, f16};

/// Conversions of a half-precision type to and from `f32`.
pub(crate) trait HalfFloat: Copy {
    /// The value as `f32` (exact).
    fn widen(self) -> f32;
    /// `v` rounded to nearest, ties to even.
    fn narrow(v: f32) -> Self;
    /// Whether [`narrow_not_nan`](Self::narrow_not_nan) is cheaper than `narrow`.
    const NAN_SELECT: bool = false;
    /// [`narrow`](Self::narrow) of a `v` that is not NaN (of NaN, some value): for a loop that
    /// notes whether it met a NaN and then redoes its work with `narrow`.
    #[inline(always)]
    fn narrow_not_nan(v: f32) -> Self {
        Self::narrow(v)
    }
    /// The value of bit pattern `b`.
    fn from_bits16(b: u16) -> Self;
    /// The bit pattern.
    fn to_bits16(self) -> u16;
}

impl HalfFloat for bf16 {
    #[inline(always)]
    fn from_bits16(b: u16) -> Self {
        bf16::from_bits(b)
    }

    #[inline(always)]
    fn to_bits16(self) -> u16 {
        self.to_bits()
    }

    #[inline(always)]
    fn widen(self) -> f32 {
        // bf16 is the top half of an f32.
        f32::from_bits((self.to_bits() as u32) << 16)
    }

    #[inline(always)]
    fn narrow(v: f32) -> Self {
        // `narrow_not_nan`'s rounding, written out: calling it here (the same operations)
        // makes bf16 adds and softmax slower (the select is compiled otherwise).
        let b = v.to_bits();
        let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
        let quiet_nan = (b >> 16) | 0x0040;
        bf16::from_bits((if v.is_nan() { quiet_nan } else { rounded }) as u16)
    }

    // The NaN select is 5 of the 12 vector uops that round 8 lanes with AVX2 (a compare,
    // a 3-uop blend and the quiet bit's OR).
    const NAN_SELECT: bool = true;

    #[inline(always)]
    fn narrow_not_nan(v: f32) -> Self {
        let b = v.to_bits();
        // Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; a carry out of
        // the mantissa raises the exponent (up to infinity), as it should. A NaN's payload may
        // carry into its sign.
        bf16::from_bits((b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16)
    }
}

/// 2^-14, the smallest normal f16, as f32 bits (biased exponent 113).
const F16_MIN_NORMAL: u32 = 113 << 23;

impl HalfFloat for f16 {
    #[inline(always)]
    fn from_bits16(b: u16) -> Self {
        f16::from_bits(b)
    }

    #[inline(always)]
    fn to_bits16(self) -> u16 {
        self.to_bits()
    }

    #[inline(always)]
    fn widen(self) -> f32 {
        let h = self.to_bits() as u32;
        let sign = (h & 0x8000) << 16;
        let shifted = (h & 0x7fff) << 13; // exponent and mantissa in f32's places
        let exp = shifted & (0x1f << 23);
        let bits = if exp == 0x1f << 23 {
            shifted | (0xff << 23) // infinity or NaN
        } else if exp == 0 {
            // Zero or subnormal, m * 2^-24: read as 2^-14 * (1 + m / 1024) and take 2^-14 off
            // (exact in f32).
            (f32::from_bits(shifted + F16_MIN_NORMAL) - f32::from_bits(F16_MIN_NORMAL)).to_bits()
        } else {
            shifted + ((127 - 15) << 23) // rebias the exponent
        };
        f32::from_bits(bits | sign)
    }

    #[inline(always)]
    fn narrow(v: f32) -> Self {
        let x = v.to_bits();
        let sign = ((x >> 16) & 0x8000) as u16;
        let a = x & 0x7fff_ffff;
        let bits = if a >= (127 + 16) << 23 {
            // 2^16 and above (f16's largest is 65504; 65520 and up round to infinity below).
            // A NaN keeps the top of its payload, made quiet, as F16C's `vcvtps2ph` and the
            // `half` crate keep it: the same bits whichever route an element takes.
            if a > 0x7f80_0000 { 0x7e00 | ((a >> 13) & 0x3ff) as u16 } else { 0x7c00 }
        } else if a < F16_MIN_NORMAL {
            // A subnormal or zero result: adding 0.5 lines the f16 mantissa's last bit up with
            // f32's, so the float addition rounds (to nearest even) where f16 rounds.
            const HALF: u32 = 126 << 23;
            (f32::from_bits(a) + f32::from_bits(HALF)).to_bits().wrapping_sub(HALF) as u16
        } else {
            // Rebias the exponent and round the 13 dropped bits to nearest, ties to even: a
            // carry out of the mantissa raises the exponent, to infinity at the top.
            let odd = (a >> 13) & 1;
            let rebias = 0u32.wrapping_sub((127 - 15) << 23);
            (a.wrapping_add(rebias).wrapping_add(0xfff + odd) >> 13) as u16
        };
        f16::from_bits(bits | sign)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f32 values where narrowing decides: each half value, the midpoints to its
    /// neighbours (ties) and one f32 step either side of them, and a spread of other patterns.
    fn probes<H: HalfFloat>(from_bits: impl Fn(u16) -> H) -> Vec<f32> {
        let mut v = Vec::new();
        for h in 0..=u16::MAX {
            let (a, b) = (from_bits(h).widen(), from_bits(h.wrapping_add(1)).widen());
            let mid = ((a as f64 + b as f64) / 2.0) as f32; // exact: both have few bits
            for p in [a, mid] {
                v.extend([p, f32::from_bits(p.to_bits().wrapping_sub(1)), f32::from_bits(p.to_bits() + 1)]);
            }
        }
        v.extend((0..=u32::MAX).step_by(65_521).map(f32::from_bits));
        v.extend([f32::MAX, f32::MIN, f32::INFINITY, f32::NEG_INFINITY, 65504.0, 65519.99, 65520.0, 1e-8, -6e-8]);
        v
    }

    fn same(a: f32, b: f32) -> bool {
        (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
    }

    #[test]
    fn widening_is_exact_for_every_half_value() {
        for h in 0..=u16::MAX {
            let (x, y) = (f16::from_bits(h), bf16::from_bits(h));
            assert!(same(x.widen(), x.to_f32()), "f16 {h:#06x}: {} vs {}", x.widen(), x.to_f32());
            assert!(same(y.widen(), y.to_f32()), "bf16 {h:#06x}: {} vs {}", y.widen(), y.to_f32());
        }
    }

    #[test]
    fn narrowing_rounds_to_nearest_even_as_the_half_crate_does() {
        for v in probes(f16::from_bits) {
            let (ours, theirs) = (f16::narrow(v), f16::from_f32(v));
            assert!(same(ours.to_f32(), theirs.to_f32()), "f16 of {v:e} ({:#010x}): {ours} vs {theirs}", v.to_bits());
        }
        for v in probes(bf16::from_bits) {
            let (ours, theirs) = (bf16::narrow(v), bf16::from_f32(v));
            assert!(same(ours.to_f32(), theirs.to_f32()), "bf16 of {v:e} ({:#010x}): {ours} vs {theirs}", v.to_bits());
            if !v.is_nan() {
                assert_eq!(bf16::narrow_not_nan(v).to_bits(), ours.to_bits(), "bf16 of {v:e}, NaN select skipped");
            }
        }
        // Skipping the select is wrong for NaN (so the loops that skip it check for NaN): a
        // payload in the low half carries into the sign.
        assert_eq!(bf16::narrow_not_nan(f32::from_bits(0x7fff_ffff)).to_bits(), 0x8000);
        // Ties go to the even neighbour; past the largest value is infinity.
        assert_eq!(f16::narrow(1.0 + 2f32.powi(-11)).to_bits(), 0x3c00);
        assert_eq!(f16::narrow(1.0 + 3.0 * 2f32.powi(-11)).to_bits(), 0x3c02);
        assert_eq!(f16::narrow(65520.0).to_bits(), 0x7c00);
        assert_eq!(f16::narrow(-65519.0).to_bits(), 0xfbff);
        assert_eq!(f16::narrow(2f32.powi(-25)).to_bits(), 0); // the tie below the smallest subnormal
        assert_eq!(f16::narrow(3.0 * 2f32.powi(-25)).to_bits(), 2);
        assert_eq!(bf16::narrow(1.0 + 2f32.powi(-8)).to_bits(), 0x3f80);
        assert_eq!(bf16::narrow(f32::MAX).to_bits(), 0x7f80);
        assert!(f16::narrow(f32::NAN).is_nan() && bf16::narrow(-f32::NAN).is_nan());
        // NaN payloads as F16C and the `half` crate keep them (quiet, the top bits), so that a
        // kernel's scalar tail gives its vector blocks' bits.
        for (x, want) in [(0x7fc0_0000, 0x7e00), (0xff80_0001, 0xfe00), (0x7fbf_e000, 0x7fff), (0xffd5_4000, 0xfeaa)] {
            let v = f32::from_bits(x);
            assert_eq!(f16::narrow(v).to_bits(), want, "f16 of {x:#010x}");
            assert_eq!(f16::from_f32(v).to_bits(), want, "the half crate's f16 of {x:#010x}");
        }
    }

    /// Every f32 bit pattern (about 30 s in release: `cargo test --release --lib --
    /// --ignored halfconv`).
    #[test]
    #[ignore = "exhaustive: 2^32 values"]
    fn narrowing_matches_the_half_crate_on_every_f32() {
        for b in 0..=u32::MAX {
            let v = f32::from_bits(b);
            assert!(same(f16::narrow(v).to_f32(), f16::from_f32(v).to_f32()), "f16 of {b:#010x}");
            assert!(same(bf16::narrow(v).to_f32(), bf16::from_f32(v).to_f32()), "bf16 of {b:#010x}");
            assert!(
                v.is_nan() || bf16::narrow_not_nan(v).to_bits() == bf16::narrow(v).to_bits(),
                "bf16 of {b:#010x}, no NaN select"
            );
        }
    }
}
