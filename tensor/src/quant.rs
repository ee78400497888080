//! Block quantisation in the ggml/InferLLM layouts: [`DType::Q8_0`] and [`DType::Q4_0`].
//!
//! Values are stored in blocks of [`QUANT_BLOCK`] (32). Each block starts with its scale `d`
//! as a little-endian `f16`, then:
//! - Q8_0: 32 `i8`; value `i` is `q[i] * d`, with `d = max|x| / 127`.
//! - Q4_0: 16 bytes; byte `j` holds value `j` in its low nibble and value `j + 16` in its high
//!   nibble, each stored offset by 8; value = `(nibble - 8) * d`, with `d = -m / 8` where `m`
//!   is the value of largest magnitude (so `m` itself is exactly representable as -8).

use half::f16;

use super::{DType, QUANT_BLOCK, Result, TensorError};

fn check(op: &'static str, dtype: DType, values: usize, bytes: usize) -> Result<()> {
    if !dtype.is_quantized() {
        return Err(TensorError::UnsupportedDType { op, dtype, shape: vec![values], hint: "expected q8_0 or q4_0" });
    }
    if !values.is_multiple_of(QUANT_BLOCK) || dtype.size_of(values) != Some(bytes) {
        return Err(TensorError::BadShape {
            op,
            shape: vec![values],
            target: vec![bytes],
            reason: "quantised data needs whole blocks of 32 values and their exact byte size",
        });
    }
    Ok(())
}

/// Quantises `values` (a multiple of 32 of them) into `dtype`'s blocks.
///
/// # Errors
/// [`TensorError::UnsupportedDType`] when `dtype` is not quantised; [`TensorError::BadShape`]
/// when `values.len()` is not a multiple of 32.
///
/// ```
/// use tensormem_tensor::{DType, dequantize, quantize};
///
/// let x: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
/// let q = quantize(DType::Q8_0, &x)?;
/// assert_eq!(q.len(), 34);
/// let back = dequantize(DType::Q8_0, &q)?;
/// assert!(x.iter().zip(&back).all(|(a, b)| (a - b).abs() <= 16.0 / 127.0));
/// # Ok::<(), tensormem_tensor::TensorError>(())
/// ```
pub fn quantize(dtype: DType, values: &[f32]) -> Result<Vec<u8>> {
    let bytes = dtype.size_of(values.len()).unwrap_or(0);
    check("quantize", dtype, values.len(), bytes)?;
    let mut out = vec![0u8; bytes];
    quantize_into(dtype, values, &mut out);
    Ok(out)
}

/// Dequantises whole blocks of `dtype` to `f32`.
///
/// # Errors
/// [`TensorError::UnsupportedDType`] when `dtype` is not quantised; [`TensorError::BadShape`]
/// when `bytes` is not a whole number of blocks.
pub fn dequantize(dtype: DType, bytes: &[u8]) -> Result<Vec<f32>> {
    let values = bytes.len() / dtype.block_bytes().max(1) * QUANT_BLOCK;
    check("dequantize", dtype, values, bytes.len())?;
    let mut out = vec![0f32; values];
    dequantize_into(dtype, bytes, &mut out);
    Ok(out)
}

/// Quantises whole blocks; `out` holds exactly the blocks of `values`.
pub(crate) fn quantize_into(dtype: DType, values: &[f32], out: &mut [u8]) {
    let bb = dtype.block_bytes();
    for (x, block) in values.chunks_exact(QUANT_BLOCK).zip(out.chunks_exact_mut(bb)) {
        match dtype {
            DType::Q8_0 => {
                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = inverse(d);
                block[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                for (q, v) in block[2..].iter_mut().zip(x) {
                    *q = (v * id).round() as i8 as u8;
                }
            }
            _ => {
                let (mut amax, mut max) = (0f32, 0f32);
                for &v in x {
                    if v.abs() > amax {
                        amax = v.abs();
                        max = v;
                    }
                }
                let d = max / -8.0;
                let id = inverse(d);
                block[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                let half = QUANT_BLOCK / 2;
                for j in 0..half {
                    let lo = ((x[j] * id + 8.5) as i32).clamp(0, 15) as u8;
                    let hi = ((x[j + half] * id + 8.5) as i32).clamp(0, 15) as u8;
                    block[2 + j] = lo | (hi << 4);
                }
            }
        }
    }
}

/// `1 / d`, as ggml computes it, or 0 when `d` is 0 or so small (subnormal) that its inverse
/// overflows. There ggml's float-to-int conversion of an infinity is undefined; with 0 every
/// value is stored as a quantised zero, which its f16 scale (0 at that size) gives back anyway.
fn inverse(d: f32) -> f32 {
    let id = 1.0 / d;
    if id.is_finite() { id } else { 0.0 }
}

/// Dequantises whole blocks; `out` holds exactly the values of `bytes`.
pub(crate) fn dequantize_into(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    let bb = dtype.block_bytes();
    for (block, y) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(QUANT_BLOCK)) {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
        match dtype {
            DType::Q8_0 => {
                for (v, &q) in y.iter_mut().zip(&block[2..]) {
                    *v = q as i8 as f32 * d;
                }
            }
            _ => {
                let half = QUANT_BLOCK / 2;
                for j in 0..half {
                    let q = block[2 + j];
                    y[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
                    y[j + half] = ((q >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
    }
}
