//! The elementary functions on bf16 and f16 tensors by lookup: a 16-bit type has 65,536 bit
//! patterns, so each function's results for one of them fit in a 128 KiB table, computed on
//! first use by the route the tensor takes without it (each element widened to `f32`, through
//! [`vmath`](crate::vmath), rounded once). A kernel then reads one entry per element:
//! `vpgatherdd`, 16 at a time with AVX-512, 8 with AVX2; one load each elsewhere.
//!
//! A lookup is faster than computing each element (`docs/half-precision-tables.md`), and takes
//! the same time whatever the values: computed, elements whose steps pass through subnormal
//! `f32` numbers cost a microcode assist each. The working set is the entries a tensor's values use: a few thousand for
//! bf16 activations (their exponents span a few dozen binades of 128 entries each), in L1; up
//! to 1,024 a binade for f16; all of them in L2.
//!
//! `ggml` does the same for f16 GELU (`ggml_table_gelu_f16`). The tables live in static
//! memory, not on the heap (nothing for a leak check to see), and take memory only for the
//! functions and types used: 14 tables, 1.75 MiB at most. [`set_half_tables`]`(false)`
//! (`TENSORMEM_HALF_TABLES=0`) computes every element instead, with the same results.
//!
//! [`set_half_tables`]: crate::set_half_tables

use core::cell::UnsafeCell;
use core::marker::PhantomData;
use core::mem::MaybeUninit;
use std::sync::Once;

use crate::DType;
use crate::halfconv::HalfFloat;
use crate::vmath::Func;
use half::{bf16, f16};

use super::isa::Isa;
use super::loops::UnaryFn;

/// Entries of a table: one per bit pattern, and one more that a 4-byte gather of the last
/// entry reads (never used).
const ENTRIES: usize = (1 << 16) + 2;

/// One function's results on one 16-bit type, indexed by the argument's bits.
struct Table {
    filled: Once,
    bits: UnsafeCell<[u16; ENTRIES]>,
}

// SAFETY: `bits` is written only inside `filled.call_once`, which runs once and returns to
// every caller only after that write has finished and is visible to it; afterwards it is only
// read ([`Table::get`] hands it out after `call_once`).
unsafe impl Sync for Table {}

impl Table {
    const fn new() -> Self {
        Table { filled: Once::new(), bits: UnsafeCell::new([0; ENTRIES]) }
    }

    /// The table, filled by `fill` on first use (one thread fills it; others wait).
    fn get(&'static self, fill: impl FnOnce(&mut [u16; ENTRIES])) -> &'static [u16; ENTRIES] {
        self.filled.call_once(|| {
            // SAFETY: inside `call_once` no other reference to `bits` exists: readers get one
            // only after `call_once` returns, and it runs this closure once.
            fill(unsafe { &mut *self.bits.get() })
        });
        // SAFETY: filled above (or by another thread, whose write `call_once` has made
        // visible); never written again.
        unsafe { &*self.bits.get() }
    }
}

/// The tables: bf16, then f16, each by [`Func`] number.
static TABLES: [[Table; Func::ALL.len()]; 2] = [const { [const { Table::new() }; Func::ALL.len()] }; 2];

/// `func`'s table on `half` (bf16 or f16; `None` for another dtype), filled on first use.
pub(super) fn table(func: Func, half: DType) -> Option<&'static [u16; ENTRIES]> {
    let at = match half {
        DType::BF16 => 0,
        DType::F16 => 1,
        _ => return None,
    };
    // (`None` for a function missing from `Func::ALL`: it is computed.)
    Some(TABLES[at].get(func as usize)?.get(|t| fill(func, half, t)))
}

/// `t[b] = func(b)` for every bit pattern `b` of `half`, widened, computed and rounded once as
/// the computing route does it on this machine: by the AVX-512 blocks where they are on, else
/// by the scalar function (the blocks' bits: `blocks_give_the_scalar_functions_bits`; so are
/// every vector extension's, `same_bits_in_every_isa`), f16 rounded by F16C where the CPU has it (as
/// the converting loops round it: the same numbers, and the NaN payloads F16C keeps).
fn fill(func: Func, half: DType, t: &mut [u16; ENTRIES]) {
    const CHUNK: usize = 1024;
    let patterns = (0u32..).step_by(CHUNK).zip(t[..1 << 16].chunks_exact_mut(CHUNK));
    #[cfg(target_arch = "x86_64")]
    if super::switch::avx512_blocks_enabled() {
        use crate::vmath::avx512::{Half, run_half};
        let half = if half == DType::BF16 { Half::Bf16 } else { Half::F16 };
        let mut x = [0u16; CHUNK];
        for (start, out) in patterns {
            for (b, x) in (start..).zip(x.iter_mut()) {
                *x = b as u16;
            }
            // SAFETY: the CPU has AVX-512 F, BW and VL (the blocks are on only there); `x` and
            // `out` hold `CHUNK` elements each, apart.
            unsafe { run_half(func, half, x.as_ptr(), out.as_mut_ptr(), CHUNK) };
        }
        return;
    }
    let f = func.scalar();
    let mut y = [0f32; CHUNK];
    let mut h = [MaybeUninit::<f16>::uninit(); CHUNK];
    for (start, out) in patterns {
        for (b, y) in (start..).zip(y.iter_mut()) {
            let b = b as u16;
            let x = if half == DType::BF16 { bf16::from_bits(b).widen() } else { f16::from_bits(b).widen() };
            *y = f(x);
        }
        if half == DType::BF16 {
            for (o, &y) in out.iter_mut().zip(&y) {
                *o = bf16::narrow(y).to_bits();
            }
        } else {
            super::f16c::narrow_f16(&y, &mut h);
            for (o, h) in out.iter_mut().zip(&h) {
                // SAFETY: `narrow_f16` wrote all `CHUNK` elements (`y` and `h` are that long).
                *o = unsafe { h.assume_init() }.to_bits();
            }
        }
    }
}

/// A function on a 16-bit float type by its table, for the unary loops.
pub(super) struct TableFn<H> {
    table: &'static [u16; ENTRIES],
    half: PhantomData<fn() -> H>,
}

impl<H> TableFn<H> {
    pub(super) fn new(table: &'static [u16; ENTRIES]) -> Self {
        TableFn { table, half: PhantomData }
    }
}

impl<H> Clone for TableFn<H> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<H> Copy for TableFn<H> {}

impl<H: HalfFloat> UnaryFn<H, H> for TableFn<H> {
    #[inline(always)]
    fn call(&self, x: H) -> H {
        H::from_bits16(self.table[x.to_bits16() as usize])
    }

    /// Contiguous runs by gathers: 16 elements each with AVX-512, 8 with AVX2.
    #[inline(always)]
    unsafe fn call_run(&self, isa: Isa, x: *const H, o: *mut H, n: usize) -> bool {
        const { assert!(size_of::<H>() == 2, "a table is indexed by 16 bits") };
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512 {
            // SAFETY: the CPU has AVX-512 F, BW and VL (`Isa::Avx512`); `H` is 2 bytes
            // (asserted above) holding its bit pattern (bf16, f16); the caller's promise for
            // the rest.
            unsafe { gather(self.table, x.cast(), o.cast(), n) };
            return true;
        }
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx2 {
            // SAFETY: the CPU has AVX2 (`Isa::Avx2`); as above for the rest.
            unsafe { gather_avx2(self.table, x.cast(), o.cast(), n) };
            return true;
        }
        let _ = (isa, x, o, n);
        false
    }
}

/// `o[i] = table[x[i]]` for `i < n`, 16 elements at a time.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VL; `x` is readable and `o` writable for `n` elements, and
/// `o` is `x` or overlaps it nowhere.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn gather(table: &[u16; ENTRIES], x: *const u16, o: *mut u16, n: usize) {
    use core::arch::x86_64::*;
    let base = table.as_ptr().cast::<i32>();
    let mut i = 0;
    while i < n {
        let m: __mmask16 = if n - i >= 16 { u16::MAX } else { (1 << (n - i)) - 1 };
        // SAFETY: the lanes of `m` are elements below `n` (readable, writable: the caller's
        // promise); masked loads and stores touch no other lane, and the others' indices are
        // 0. Lane `k` reads 4 bytes from byte `2 x[k]` of the table: entries `x[k]` and
        // `x[k] + 1 <= 65536 < ENTRIES` (a gather needs no alignment). The whole vector is
        // loaded before it is stored, so `o == x` reads each element before writing it.
        unsafe {
            let idx = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x.add(i).cast()));
            let v = _mm512_i32gather_epi32::<2>(idx, base);
            _mm256_mask_storeu_epi16(o.add(i).cast(), m, _mm512_cvtepi32_epi16(v));
        }
        i += 16;
    }
}

/// As [`gather`], with AVX2: 16 elements at a time in two 8-lane gathers, the last few
/// (fewer than 16) one load each.
///
/// # Safety
/// The CPU has AVX2; `x` is readable and `o` writable for `n` elements, and `o` is `x` or
/// overlaps it nowhere.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn gather_avx2(table: &[u16; ENTRIES], x: *const u16, o: *mut u16, n: usize) {
    use core::arch::x86_64::*;
    let base = table.as_ptr().cast::<i32>();
    // The low 2 bytes of each 4-byte lane, packed into the low 8 bytes of each 16-byte half.
    let low = _mm256_setr_epi8(
        0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1,
        -1,
    );
    let mut i = 0;
    while n - i >= 16 {
        // SAFETY: elements `i..i + 16` are below `n` (readable, writable: the caller's
        // promise). Lane `k` reads 4 bytes from byte `2 x[k]` of the table: entries `x[k]` and
        // `x[k] + 1 <= 65536 < ENTRIES`. Both loads come before both stores, so `o == x` reads
        // each element before writing it.
        unsafe {
            let i0 = _mm256_cvtepu16_epi32(_mm_loadu_si128(x.add(i).cast()));
            let i1 = _mm256_cvtepu16_epi32(_mm_loadu_si128(x.add(i + 8).cast()));
            let v0 = _mm256_i32gather_epi32::<2>(base, i0);
            let v1 = _mm256_i32gather_epi32::<2>(base, i1);
            // Quadwords 0 and 2 (each half's packed entries) into the low 16 bytes.
            let p0 = _mm256_permute4x64_epi64::<0b1000>(_mm256_shuffle_epi8(v0, low));
            let p1 = _mm256_permute4x64_epi64::<0b1000>(_mm256_shuffle_epi8(v1, low));
            _mm_storeu_si128(o.add(i).cast(), _mm256_castsi256_si128(p0));
            _mm_storeu_si128(o.add(i + 8).cast(), _mm256_castsi256_si128(p1));
        }
        i += 16;
    }
    while i < n {
        // SAFETY: `i < n`: readable, writable (the caller's promise), read before written.
        unsafe { *o.add(i) = table[*x.add(i) as usize] };
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Result, Tensor, half_tables_enabled, set_half_tables};

    type Fresh = fn(&Tensor) -> Result<Tensor>;
    type InPlace = for<'a> fn(&'a Tensor) -> Result<&'a Tensor>;
    type Out = for<'a, 'o> fn(&'a Tensor, &'o Tensor) -> Result<&'o Tensor>;

    /// The tensor methods of `f`: fresh, in place, `out=`.
    fn forms(f: Func) -> (Fresh, InPlace, Out) {
        match f {
            Func::Gelu => (Tensor::gelu, Tensor::gelu_, Tensor::gelu_out),
            Func::Silu => (Tensor::silu, Tensor::silu_, Tensor::silu_out),
            Func::Sigmoid => (Tensor::sigmoid, Tensor::sigmoid_, Tensor::sigmoid_out),
            Func::GeluTanh => (Tensor::gelu_tanh, Tensor::gelu_tanh_, Tensor::gelu_tanh_out),
            Func::Tanh => (Tensor::tanh, Tensor::tanh_, Tensor::tanh_out),
            Func::Exp => (Tensor::exp, Tensor::exp_, Tensor::exp_out),
            Func::Ln => (Tensor::log, Tensor::log_, Tensor::log_out),
        }
    }

    fn from_bits(bits: &[u16], dt: DType) -> Tensor {
        if dt == DType::BF16 {
            Tensor::from_vec(bits.iter().map(|&b| bf16::from_bits(b)).collect(), &[bits.len()], dt).unwrap()
        } else {
            Tensor::from_vec(bits.iter().map(|&b| f16::from_bits(b)).collect(), &[bits.len()], dt).unwrap()
        }
    }

    fn bits(t: &Tensor) -> Vec<u16> {
        let t = t.contiguous().unwrap();
        if t.dtype() == DType::BF16 {
            t.as_slice::<bf16>().unwrap().iter().map(|v| v.to_bits()).collect()
        } else {
            t.as_slice::<f16>().unwrap().iter().map(|v| v.to_bits()).collect()
        }
    }

    /// NaN, whatever its sign and payload (F16C keeps payload bits the integer rounding does
    /// not).
    fn is_nan(b: u16, dt: DType) -> bool {
        if dt == DType::BF16 { b & 0x7fff > 0x7f80 } else { b & 0x7fff > 0x7c00 }
    }

    /// Every bit pattern of both types through every function, in each form a user can call
    /// (fresh, in place, `out=`, strided), gives the function of the widened value rounded
    /// once: the scalar function's bits, NaN for NaN; and the same bits with the tables off.
    #[test]
    fn every_bit_pattern_gives_the_computed_result() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        for dt in [DType::BF16, DType::F16] {
            let x = from_bits(&all, dt);
            // Every pattern at every other element of a tensor twice as long.
            let strided = Tensor::stack(&[&x, &x], 1).unwrap().select(1, 0).unwrap();
            assert_eq!(strided.strides(), [2]);
            for func in Func::ALL {
                let scalar = func.scalar();
                let want: Vec<u16> = all
                    .iter()
                    .map(|&b| {
                        if dt == DType::BF16 {
                            bf16::narrow(scalar(bf16::from_bits(b).widen())).to_bits()
                        } else {
                            f16::narrow(scalar(f16::from_bits(b).widen())).to_bits()
                        }
                    })
                    .collect();
                let (fresh, in_place, out) = forms(func);
                let looked_up = bits(&fresh(&x).unwrap());
                for (b, (&got, &want)) in looked_up.iter().zip(&want).enumerate() {
                    assert!(
                        got == want || (is_nan(got, dt) && is_nan(want, dt)),
                        "{func:?} of {dt:?} bits {b:#06x}: {got:#06x}, the scalar function {want:#06x}"
                    );
                }
                let y = Tensor::zeros(&[1 << 16], dt).unwrap();
                y.copy_(&x).unwrap();
                in_place(&y).unwrap();
                assert_eq!(bits(&y), looked_up, "{func:?} {dt:?} in place");
                let o = Tensor::zeros(&[1 << 16], dt).unwrap();
                out(&x, &o).unwrap();
                assert_eq!(bits(&o), looked_up, "{func:?} {dt:?} out=");
                assert_eq!(bits(&fresh(&strided).unwrap()), looked_up, "{func:?} {dt:?} strided");
                // Every short length (the last, partial gather), from an odd offset.
                for n in 0..40 {
                    let part = x.narrow(0, 4097, n).unwrap();
                    assert_eq!(bits(&fresh(&part).unwrap()), looked_up[4097..4097 + n], "{func:?} {dt:?}, {n}");
                }
                // A 0-d tensor, and a transposed view in place (a strided run of the output).
                let one = x.select(0, 0x3f80).unwrap();
                assert_eq!(bits(&fresh(&one).unwrap()), [looked_up[0x3f80]], "{func:?} {dt:?} 0-d");
                let square = Tensor::zeros(&[256, 256], dt).unwrap();
                square.copy_(&x.reshape(&[256, 256]).unwrap()).unwrap();
                in_place(&square.t().unwrap()).unwrap();
                assert_eq!(bits(&square), looked_up, "{func:?} {dt:?} transposed in place");
                // (`set_half_tables` returns the new state, not the previous one.)
                let previous = half_tables_enabled();
                set_half_tables(false);
                let computed = bits(&fresh(&x).unwrap());
                set_half_tables(previous);
                assert_eq!(computed, looked_up, "{func:?} {dt:?} computed");
            }
        }
    }

    /// Each gather the CPU has (whichever the kernels pick here) looks up what one load per
    /// element does: every bit pattern, every length up to 40 from an odd start (the partial
    /// last vector, the one-load tail), apart and in place, and leaves the elements past `n`
    /// alone.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_gather_gives_the_lookups() {
        type Gather = unsafe fn(&[u16; ENTRIES], *const u16, *mut u16, usize);
        let mut gathers: Vec<(&str, Gather)> = Vec::new();
        if is_x86_feature_detected!("avx2") {
            gathers.push(("AVX2", gather_avx2));
        }
        if is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
        {
            gathers.push(("AVX-512", gather));
        }
        if gathers.is_empty() {
            eprintln!("skipped: this CPU has neither AVX2 nor AVX-512");
            return;
        }
        let t = table(Func::Gelu, DType::BF16).unwrap();
        // Every pattern, then a sweep that puts each pattern at each position of a vector.
        let x: Vec<u16> = (0..=u16::MAX).chain((0..=u16::MAX).map(|b| b.wrapping_mul(40_503))).collect();
        let want: Vec<u16> = x.iter().map(|&b| t[b as usize]).collect();
        for (name, g) in gathers {
            let mut o = vec![0xdead_u16; x.len()];
            // SAFETY: the CPU has the gather's extension (checked above); `x` and `o` hold
            // `x.len()` elements each, apart.
            unsafe { g(t, x.as_ptr(), o.as_mut_ptr(), x.len()) };
            assert_eq!(o, want, "{name}, all patterns");
            for n in 0..40 {
                let mut o = vec![0xdead_u16; 64];
                // SAFETY: as above, `n < 40` elements of each from element 4097 of `x`.
                unsafe { g(t, x[4097..].as_ptr(), o.as_mut_ptr(), n) };
                assert_eq!(o[..n], want[4097..4097 + n], "{name}, {n} elements");
                assert!(o[n..].iter().all(|&v| v == 0xdead), "{name} wrote past {n} elements");
                let mut y = x[4097..4097 + n].to_vec();
                let p = y.as_mut_ptr();
                // SAFETY: as above; `o` is `x`, which the gathers allow.
                unsafe { g(t, p, p, n) };
                assert_eq!(y, want[4097..4097 + n], "{name}, {n} elements in place");
            }
        }
    }

    /// The fill without the AVX-512 blocks (scalar functions, F16C's rounding for f16) gives
    /// the tables' bits, NaN payloads included: what a CPU without AVX-512 looks up.
    #[test]
    fn the_scalar_fill_gives_the_same_tables() {
        for dt in [DType::BF16, DType::F16] {
            for func in Func::ALL {
                let looked_up = table(func, dt).unwrap();
                let mut scalar = vec![0u16; ENTRIES].into_boxed_slice();
                let previous = crate::set_avx512_blocks(false);
                fill(func, dt, (&mut *scalar).try_into().unwrap());
                crate::set_avx512_blocks(previous);
                if let Some(b) = (0..1 << 16).find(|&b| scalar[b] != looked_up[b]) {
                    panic!("{func:?} {dt:?} at {b:#06x}: {:#06x} against {:#06x}", scalar[b], looked_up[b]);
                }
            }
        }
        assert!(table(Func::Gelu, DType::F32).is_none());
        // `TABLES` is indexed by `Func as usize`: `ALL` holds every function at its number.
        assert!(Func::ALL.iter().enumerate().all(|(i, &f)| f as usize == i));
    }
}
