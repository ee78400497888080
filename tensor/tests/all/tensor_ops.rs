//! The ops a transformer block needs: joins, indexing, masks, fused norms, scalar
//! operands, `*_like`, slice access and safetensors weights. Every expected value is computed
//! independently (by hand or by a plain loop), never by the kernel under test.

use std::sync::Arc;

use tensormem::{AllocatorRegistry, TrackingAllocator};
use tensormem_tensor::{
    AVX512_BLOCKS_ENV, DType, SafeTensors, Tensor, TensorError, TensorOptions, avx512_blocks_enabled, save_safetensors,
    set_avx512_blocks, set_num_threads,
};

fn t32(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, DType::F32).unwrap()
}

fn i64s(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, DType::I64).unwrap()
}

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "element {i}: {x} vs {y} ({a:?} vs {b:?})");
    }
}

/// A fresh directory, removed with everything in it when the returned guard drops (also when
/// the test fails).
fn tempdir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("tm-ops-{tag}-")).tempdir().unwrap()
}

// ---- cat / stack ----

#[test]
fn cat_along_each_dimension_and_a_growing_kv_cache() {
    let a = t32(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let b = t32(&[7., 8., 9.], &[1, 3]);
    let c = Tensor::cat(&[&a, &b], 0).unwrap();
    assert_eq!(c.sizes(), [3, 3]);
    assert_eq!(c.to_vec::<f32>().unwrap(), [1., 2., 3., 4., 5., 6., 7., 8., 9.]);

    let d = t32(&[10., 20.], &[2, 1]);
    let e = Tensor::cat(&[&a, &d], -1).unwrap();
    assert_eq!(e.sizes(), [2, 4]);
    assert_eq!(e.to_vec::<f32>().unwrap(), [1., 2., 3., 10., 4., 5., 6., 20.]);

    // Views (a transpose) and mixed dtypes promote as PyTorch's cat does.
    let at = a.t().unwrap();
    let ints = Tensor::from_slice(&[100i32, 200, 300], &[3, 1], DType::I32).unwrap();
    let f = Tensor::cat(&[&at, &ints], 1).unwrap();
    assert_eq!(f.dtype(), DType::F32);
    assert_eq!(f.to_vec::<f32>().unwrap(), [1., 4., 100., 2., 5., 200., 3., 6., 300.]);

    // A KV cache grows one step at a time along the sequence dimension.
    let mut cache = Tensor::zeros(&[1, 2, 0, 4], DType::F32).unwrap();
    for step in 0..5 {
        let kv = Tensor::full(&[1, 2, 1, 4], step as f64, DType::F32).unwrap();
        cache = Tensor::cat(&[&cache, &kv], 2).unwrap();
    }
    assert_eq!(cache.sizes(), [1, 2, 5, 4]);
    let v = cache.to_vec::<f32>().unwrap();
    for h in 0..2 {
        for s in 0..5 {
            for k in 0..4 {
                assert_eq!(v[h * 20 + s * 4 + k], s as f32);
            }
        }
    }
}

#[test]
fn cat_and_stack_refuse_what_does_not_fit() {
    let a = t32(&[1., 2., 3., 4.], &[2, 2]);
    let b = t32(&[1., 2., 3.], &[1, 3]);
    let e = Tensor::cat(&[&a, &b], 0).unwrap_err();
    assert!(matches!(e, TensorError::Mismatch { op: "cat", index: 1, .. }), "{e}");
    assert!(e.to_string().contains("[1, 3]"), "{e}");
    assert!(Tensor::cat(&[], 0).is_err());
    assert!(Tensor::cat(&[&a, &a], 2).is_err());
    assert!(Tensor::cat(&[&a, &a], -3).is_err());
    let e = Tensor::stack(&[&a, &b], 0).unwrap_err();
    assert!(matches!(e, TensorError::Mismatch { op: "stack", .. }), "{e}");
    assert!(Tensor::stack(&[], 0).is_err());
    // A 0-d tensor cannot be concatenated (PyTorch: zero-dimensional tensor cannot be
    // concatenated), but it can be stacked.
    let s = Tensor::scalar(1.0, DType::F32).unwrap();
    assert!(Tensor::cat(&[&s, &s], 0).is_err());
    assert_eq!(Tensor::stack(&[&s, &s], 0).unwrap().to_vec::<f32>().unwrap(), [1., 1.]);
}

#[test]
fn cat_and_stack_join_quantised_tensors_block_by_block() {
    let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    let a = Tensor::randn(&[2, 3, 64], TensorOptions::new().seed(21)).unwrap();
    let b = Tensor::randn(&[2, 1, 64], TensorOptions::new().seed(22)).unwrap();
    let c = Tensor::randn(&[2, 3, 32], TensorOptions::new().seed(23)).unwrap();
    for dt in [DType::Q8_0, DType::Q4_0] {
        let (qa, qb, qc) = (a.to_dtype(dt).unwrap(), b.to_dtype(dt).unwrap(), c.to_dtype(dt).unwrap());
        let qb1 = qb.narrow(0, 1, 1).unwrap();
        // The blocks are copied as they are: the dequantised result is the dequantised inputs
        // joined, bit for bit.
        let cases: [(Vec<&Tensor>, isize, &[usize]); 3] = [
            (vec![&qa, &qb, &qa], 1, &[2, 7, 64]),
            (vec![&qa, &qc], 2, &[2, 3, 96]),
            (vec![&qb, &qb1], 0, &[3, 1, 64]),
        ];
        for (parts, dim, shape) in cases {
            let joined = Tensor::cat(&parts, dim);
            let joined = joined.unwrap_or_else(|e| panic!("{dt} cat along {dim}: {e}"));
            assert_eq!((joined.dtype(), joined.sizes()), (dt, shape));
            let wide: Vec<Tensor> = parts.iter().map(|t| t.to_dtype(DType::F32).unwrap()).collect();
            let expected = Tensor::cat(&wide.iter().collect::<Vec<_>>(), dim).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(f(&joined), expected, "{dt} along {dim}");
        }
        // Views (whole blocks along the last dimension) are read where they lie.
        let (rows, blocks) = (qa.narrow(1, 1, 2).unwrap(), qa.narrow(2, 32, 32).unwrap());
        assert!(!rows.is_contiguous() && !blocks.is_contiguous());
        let joined = Tensor::cat(&[&rows, &qb], 1).unwrap();
        let expected = Tensor::cat(
            &[
                &a.to_dtype(dt).unwrap().to_dtype(DType::F32).unwrap().narrow(1, 1, 2).unwrap(),
                &qb.to_dtype(DType::F32).unwrap(),
            ],
            1,
        );
        assert_eq!(f(&joined), expected.unwrap().to_vec::<f32>().unwrap());
        let joined = Tensor::cat(&[&blocks, &qc], 2).unwrap();
        assert_eq!(joined.sizes(), [2, 3, 64]);
        assert_eq!(f(&joined.narrow(2, 0, 32).unwrap()), f(&blocks));
        assert_eq!(f(&joined.narrow(2, 32, 32).unwrap()), f(&qc));
        let stacked = Tensor::stack(&[&qa, &qa], 1).unwrap();
        assert_eq!((stacked.dtype(), stacked.sizes()), (dt, &[2, 2, 3, 64][..]));
        assert_eq!(f(&stacked.select(1, 1).unwrap()), f(&qa));
        // Another dtype beside a quantised one has no common dtype.
        let e = Tensor::cat(&[&qa, &a], 1).unwrap_err();
        assert!(matches!(e, TensorError::NoCommonDType { op: "cat", .. }), "{e}");
    }
    let e = Tensor::cat(&[&a.to_dtype(DType::Q8_0).unwrap(), &a.to_dtype(DType::Q4_0).unwrap()], 0).unwrap_err();
    assert!(matches!(e, TensorError::NoCommonDType { lhs: DType::Q8_0, rhs: DType::Q4_0, .. }), "{e}");
}

#[test]
fn stack_inserts_a_dimension_anywhere() {
    let a = t32(&[1., 2., 3.], &[3]);
    let b = t32(&[4., 5., 6.], &[3]);
    let s0 = Tensor::stack(&[&a, &b], 0).unwrap();
    assert_eq!(s0.sizes(), [2, 3]);
    assert_eq!(s0.to_vec::<f32>().unwrap(), [1., 2., 3., 4., 5., 6.]);
    let s1 = Tensor::stack(&[&a, &b], -1).unwrap();
    assert_eq!(s1.sizes(), [3, 2]);
    assert_eq!(s1.to_vec::<f32>().unwrap(), [1., 4., 2., 5., 3., 6.]);
    assert!(Tensor::stack(&[&a, &b], 2).is_err());
}

// ---- index_select / embedding / gather ----

#[test]
fn index_select_picks_rows_and_columns() {
    let x = t32(&(0..12).map(|v| v as f32).collect::<Vec<_>>(), &[3, 4]);
    let rows = x.index_select(0, &i64s(&[2, 0, 2], &[3])).unwrap();
    assert_eq!(rows.sizes(), [3, 4]);
    assert_eq!(rows.to_vec::<f32>().unwrap(), [8., 9., 10., 11., 0., 1., 2., 3., 8., 9., 10., 11.]);
    let cols = x.index_select(-1, &Tensor::from_slice(&[3i32, 1], &[2], DType::I32).unwrap()).unwrap();
    assert_eq!(cols.to_vec::<f32>().unwrap(), [3., 1., 7., 5., 11., 9.]);
    // Negative and out-of-range indices are errors naming the value (PyTorch: index out of
    // range in self).
    let e = x.index_select(0, &i64s(&[3], &[1])).unwrap_err();
    assert!(matches!(e, TensorError::IndexValue { index: 3, size: 3, .. }), "{e}");
    let e = x.index_select(0, &i64s(&[-1], &[1])).unwrap_err();
    assert!(matches!(e, TensorError::IndexValue { index: -1, .. }), "{e}");
    assert!(x.index_select(0, &t32(&[0.], &[1])).is_err(), "float indices are refused");
    assert!(x.index_select(0, &i64s(&[0, 1], &[1, 2])).is_err(), "index must be 1-d");
    assert!(x.index_select(2, &i64s(&[0], &[1])).is_err());
    // An empty index gives an empty result.
    assert_eq!(x.index_select(0, &i64s(&[], &[0])).unwrap().sizes(), [0, 4]);
}

#[test]
fn embedding_looks_up_rows_for_any_index_shape() {
    let vocab = 5;
    let dim = 3;
    let w: Vec<f32> = (0..vocab * dim).map(|v| v as f32 * 0.5).collect();
    let weight = t32(&w, &[vocab, dim]);
    let ids = i64s(&[4, 0, 1, 1, 3, 2], &[2, 3]);
    let e = weight.embedding(&ids).unwrap();
    assert_eq!(e.sizes(), [2, 3, dim]);
    let got = e.to_vec::<f32>().unwrap();
    for (k, id) in [4usize, 0, 1, 1, 3, 2].iter().enumerate() {
        assert_eq!(&got[k * dim..(k + 1) * dim], &w[id * dim..(id + 1) * dim]);
    }
    let e = weight.embedding(&i64s(&[0, 5], &[1, 2])).unwrap_err();
    assert!(matches!(e, TensorError::IndexValue { op: "embedding", index: 5, size: 5, .. }), "{e:?}");
    assert!(e.to_string().starts_with("embedding: index 5 is out of range"), "{e}");
    assert!(t32(&[1., 2.], &[2]).embedding(&i64s(&[0], &[1])).is_err(), "weight must be 2-d");
}

#[test]
fn gather_follows_torch_gather() {
    // torch.gather(torch.tensor([[1,2],[3,4]]), 1, torch.tensor([[0,0],[1,0]])) == [[1,1],[4,3]]
    let x = t32(&[1., 2., 3., 4.], &[2, 2]);
    let g = x.gather(1, &i64s(&[0, 0, 1, 0], &[2, 2])).unwrap();
    assert_eq!(g.to_vec::<f32>().unwrap(), [1., 1., 4., 3.]);
    let g0 = x.gather(0, &i64s(&[1, 0], &[1, 2])).unwrap();
    assert_eq!(g0.sizes(), [1, 2]);
    assert_eq!(g0.to_vec::<f32>().unwrap(), [3., 2.]);
    assert!(x.gather(1, &i64s(&[2], &[1, 1])).is_err());
    assert!(x.gather(1, &i64s(&[0], &[1])).is_err(), "index needs self's rank");
}

// ---- where / masked_fill ----

#[test]
fn masked_fill_builds_a_causal_attention_mask() {
    let n = 4;
    let scores = Tensor::ones(&[n, n], DType::F32).unwrap();
    // mask[i][j] = j > i
    let cols = Tensor::arange(0.0, n as f64, 1.0, DType::I64).unwrap();
    let rows = cols.view(&[n as isize, 1]).unwrap();
    let mask = cols.gt(&rows).unwrap();
    assert_eq!(mask.dtype(), DType::Bool);
    let masked = scores.masked_fill(&mask, f64::NEG_INFINITY).unwrap();
    let v = masked.to_vec::<f32>().unwrap();
    for i in 0..n {
        for j in 0..n {
            let want = if j > i { f32::NEG_INFINITY } else { 1.0 };
            assert_eq!(v[i * n + j], want, "({i}, {j})");
        }
    }
    // In place, through a broadcast mask.
    let x = Tensor::zeros(&[2, 3], DType::F32).unwrap();
    let m = Tensor::from_slice(&[true, false, true], &[3], DType::Bool).unwrap();
    x.masked_fill_(&m, 7.0).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), [7., 0., 7., 7., 0., 7.]);
    // The mask must be bool and broadcast to self.
    assert!(x.masked_fill(&t32(&[1., 0., 1.], &[3]), 1.0).is_err());
    assert!(x.masked_fill_(&Tensor::ones(&[4, 2, 3], DType::Bool).unwrap(), 1.0).is_err());
}

#[test]
fn where_cond_chooses_and_broadcasts() {
    let c = Tensor::from_slice(&[true, false, false, true], &[2, 2], DType::Bool).unwrap();
    let a = t32(&[1., 2., 3., 4.], &[2, 2]);
    let b = Tensor::from_slice(&[10i32, 20], &[2], DType::I32).unwrap();
    let w = a.where_cond(&c, &b).unwrap();
    assert_eq!(w.dtype(), DType::F32);
    assert_eq!(w.to_vec::<f32>().unwrap(), [1., 20., 10., 4.]);
    assert!(a.where_cond(&a, &b).is_err(), "the condition must be bool");
}

// ---- fused norms ----

fn layer_norm_ref(x: &[f32], n: usize, w: &[f32], b: &[f32], eps: f64) -> Vec<f32> {
    x.chunks(n)
        .flat_map(|row| {
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
            let var = row.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n as f64;
            let inv = 1.0 / (var + eps).sqrt();
            row.iter()
                .enumerate()
                .map(move |(i, &v)| ((f64::from(v) - mean) * inv * f64::from(w[i]) + f64::from(b[i])) as f32)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn layer_norm_and_rms_norm_match_the_formulas() {
    let (rows, n) = (5, 64);
    let opts = TensorOptions::new().dtype(DType::F32).seed(7);
    let x = Tensor::randn(&[rows, n], &opts).unwrap().mul_scalar(3.0).unwrap().add_scalar(1.5).unwrap();
    let w = Tensor::rand(&[n], &opts).unwrap();
    let b = Tensor::randn(&[n], &opts).unwrap();
    let (xv, wv, bv) = (x.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    let y = x.layer_norm(&[n], Some(&w), Some(&b), 1e-5).unwrap();
    close(&y.to_vec::<f32>().unwrap(), &layer_norm_ref(&xv, n, &wv, &bv, 1e-5), 1e-5);
    // Without affine parameters every row has mean 0 and variance 1.
    let plain = x.layer_norm(&[n], None, None, 0.0).unwrap().to_vec::<f32>().unwrap();
    for row in plain.chunks(n) {
        let mean: f32 = row.iter().sum::<f32>() / n as f32;
        let var: f32 = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
        assert!(mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-4, "mean {mean} var {var}");
    }

    let r = x.rms_norm(&[n], Some(&w), Some(1e-6)).unwrap().to_vec::<f32>().unwrap();
    let wv = &wv;
    let want: Vec<f32> = xv
        .chunks(n)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / n as f64;
            let inv = 1.0 / (ms + 1e-6).sqrt();
            row.iter()
                .enumerate()
                .map(move |(i, &v)| (f64::from(v) * inv * f64::from(wv[i])) as f32)
                .collect::<Vec<_>>()
        })
        .collect();
    close(&r, &want, 1e-5);

    // A strided input (a transposed view) normalises the same as its contiguous copy.
    let xt = Tensor::randn(&[n, rows], &opts).unwrap().t().unwrap();
    let a = xt.layer_norm(&[n], Some(&w), Some(&b), 1e-5).unwrap().to_vec::<f32>().unwrap();
    let c = xt.contiguous().unwrap().layer_norm(&[n], Some(&w), Some(&b), 1e-5).unwrap();
    close(&a, &c.to_vec::<f32>().unwrap(), 1e-6);

    // Half precision keeps its dtype and is close to the f32 result.
    let h = x.to_dtype(DType::BF16).unwrap().rms_norm(&[n], None, None).unwrap();
    assert_eq!(h.dtype(), DType::BF16);
    let hf = h.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    let f = x
        .to_dtype(DType::BF16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .rms_norm(&[n], None, Some(f32::EPSILON.into()))
        .unwrap();
    close(&hf, &f.to_vec::<f32>().unwrap(), 1e-2);
}

#[test]
fn bf16_norms_keep_nan_where_a_parameter_brings_it() {
    // A NaN weight with every payload bit set: rounded to bf16 without care, its low half
    // carries into the sign and the result reads -0. The bf16 output loop rounds without the
    // NaN check and writes the row again where it met a NaN; this is that second path.
    let (rows, n) = (3, 40);
    let xv: Vec<f32> = (0..rows * n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 8.0).collect();
    let x = t32(&xv, &[rows, n]).to_dtype(DType::BF16).unwrap();
    let xw = x.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    let mut wv: Vec<f32> = (0..n).map(|i| 0.5 + i as f32 / 16.0).collect();
    wv[5] = f32::from_bits(0x7fff_ffff);
    wv[7] = f32::INFINITY;
    let mut bv: Vec<f32> = (0..n).map(|i| i as f32 / 32.0 - 0.5).collect();
    bv[9] = f32::from_bits(0xffff_ffff);
    let (w, b) = (t32(&wv, &[n]), t32(&bv, &[n]));
    let layer = layer_norm_ref(&xw, n, &wv, &bv, 1e-5);
    let rms: Vec<f32> = xw
        .chunks(n)
        .flat_map(|row| {
            let inv = 1.0 / (row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n as f64 + 1e-6).sqrt();
            row.iter().zip(&wv).map(move |(&v, &w)| (f64::from(v) * inv * f64::from(w)) as f32).collect::<Vec<_>>()
        })
        .collect();
    let got_layer = x.layer_norm(&[n], Some(&w), Some(&b), 1e-5).unwrap();
    let got_rms = x.rms_norm(&[n], Some(&w), Some(1e-6)).unwrap();
    for (name, got, want) in [("layer_norm", got_layer, layer), ("rms_norm", got_rms, rms)] {
        assert_eq!(got.dtype(), DType::BF16);
        let got = got.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        for (i, (&g, &e)) in got.iter().zip(&want).enumerate() {
            let col = i % n;
            if col == 5 || (col == 9 && name == "layer_norm") {
                assert!(g.is_nan(), "{name} element {i} (column {col}): {g}, want NaN");
            } else if col == 7 {
                assert!(g.is_infinite() && g.signum() == e.signum(), "{name} element {i}: {g} vs {e}");
            } else {
                assert!((g - e).abs() <= 1e-2 * (1.0 + e.abs()), "{name} element {i}: {g} vs {e}");
            }
        }
    }
}

/// The largest distance between `got` and the f64 values `want` (each with an allowance, see
/// [`norm_ref_f64`]) beyond that allowance, in units of `dt`'s spacing at the value (`f16`:
/// 2^-10 relative, `bf16`: 2^-7; at least that at 2^-14, f16's smallest normal).
fn worst_ulps(dt: DType, got: &[f32], want: &[(f64, f64)]) -> f64 {
    let bits = if dt == DType::F16 { 10 } else { 7 };
    got.iter()
        .zip(want)
        .map(|(&g, &(w, slack))| {
            let ulp = w.abs().max(2f64.powi(-14)).log2().floor().exp2() * 2f64.powi(-bits);
            ((f64::from(g) - w).abs() - slack).max(0.0) / ulp
        })
        .fold(0.0, f64::max)
}

/// `layer_norm` (`rms_norm` where `rms`) of rows of `n`, no weight or bias, in f64; each value
/// with the error that rounding the mean to f32 allows (the kernels subtract an f32 mean, as
/// PyTorch's do: 2^-24 of it, times the scale).
fn norm_ref_f64(x: &[f32], n: usize, rms: bool, eps: f64) -> Vec<(f64, f64)> {
    x.chunks(n)
        .flat_map(|row| {
            let mean = if rms { 0.0 } else { row.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64 };
            let m2 = row.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n as f64;
            let inv = 1.0 / (m2 + eps).sqrt();
            let slack = mean.abs() * 2f64.powi(-24) * inv;
            row.iter().map(move |&v| ((f64::from(v) - mean) * inv, slack)).collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn half_norms_sum_in_f32_and_again_in_f64_where_f32_overflows_or_underflows() {
    // f16 and bf16 rows sum their statistics in f32; a row whose second moment overflows f32
    // (bf16 values near 1e20: squares near 1e40) or underflows it (bf16 values near 1e-25:
    // squares below 2^-126 lose bits, below 2^-149 vanish) is summed again in f64. Without
    // that, the large row's variance is infinite and its output 0, and the small row's
    // variance 0, which with eps 0 gives infinities and NaN.
    let n = 384;
    fn wave(i: usize) -> f32 {
        ((i * 37 % 101) as f32 - 50.0) / 16.0
    }
    type Case = (DType, &'static str, fn(usize) -> f32);
    let rows: [Case; 6] = [
        (DType::BF16, "large mean, small spread", |i| 1000.0 + 8.0 * (wave(i) as i32) as f32),
        (DType::BF16, "near 1e20", |i| 1e20 * (1.0 + wave(i) / 8.0)),
        (DType::BF16, "near 1e-25", |i| 1e-25 * wave(i)),
        (DType::BF16, "a repeated value", |_| 0.3),
        (DType::F16, "large mean, small spread", |i| 1000.0 + (wave(i) as i32) as f32),
        (DType::F16, "f16's range", |i| 60000.0 * wave(i) / 4.0),
    ];
    for (dt, what, f) in rows {
        let xv: Vec<f32> = (0..2 * n).map(&f).collect();
        let x = t32(&xv, &[2, n]).to_dtype(dt).unwrap();
        let xh = x.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        for (rms, eps) in [(false, 0.0), (false, 1e-5), (true, 0.0)] {
            let y = if rms { x.rms_norm(&[n], None, Some(eps)) } else { x.layer_norm(&[n], None, None, eps) }.unwrap();
            assert_eq!(y.dtype(), dt);
            let got = y.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
            let want = norm_ref_f64(&xh, n, rms, eps);
            if want.iter().any(|w| w.0.is_nan()) {
                // A repeated value with eps 0: 0 / 0, in f64 too.
                assert!(got.iter().all(|g| g.is_nan()), "{dt:?} {what}, rms {rms}");
                continue;
            }
            let worst = worst_ulps(dt, &got, &want);
            // Rounded once from f32: within one step of the f64 value (half a step, plus the
            // f32 arithmetic's few parts in 2^24).
            assert!(worst <= 1.0, "{dt:?} {what}, rms {rms}, eps {eps}: {worst} steps off");
        }
    }
}

#[test]
fn f16_rows_give_the_bits_of_f32_rows_rounded_at_every_length() {
    // f16 rows go through f32 scratch rows converted by F16C up to 2^17 elements, and are
    // converted value by value beyond; softmax's exponentials stay in a 16K scratch row or in
    // the output. Each way, an f16 row computes in f32 and rounds once: the bits of the f32
    // op on the widened values, rounded to f16. (The norms sum f16 statistics in f32 and f32
    // ones in f64, so they are compared with the f64 values instead.)
    for len in [301, (16 << 10) + 3, (1 << 17) + 5] {
        let x = Tensor::randn(&[2, len], TensorOptions::new().dtype(DType::F32).seed(len as u64))
            .unwrap()
            .mul_scalar(4.0)
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap();
        let wide = x.to_dtype(DType::F32).unwrap();
        for log in [false, true] {
            let op = |t: &Tensor| if log { t.log_softmax(-1) } else { t.softmax(-1) }.unwrap();
            let got = op(&x);
            assert_eq!(got.dtype(), DType::F16);
            let want = op(&wide).to_dtype(DType::F16).unwrap();
            assert_eq!(got.to_vec::<half::f16>().unwrap(), want.to_vec::<half::f16>().unwrap(), "len {len}, log {log}");
        }
        let xh = wide.to_vec::<f32>().unwrap();
        for rms in [false, true] {
            let y = if rms { x.rms_norm(&[len], None, Some(1e-6)) } else { x.layer_norm(&[len], None, None, 1e-6) };
            let got = y.unwrap().to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
            let worst = worst_ulps(DType::F16, &got, &norm_ref_f64(&xh, len, rms, 1e-6));
            assert!(worst <= 1.0, "len {len}, rms {rms}: {worst} steps off");
        }
    }
}

#[test]
fn norms_refuse_bad_shapes_and_parameters() {
    let x = Tensor::ones(&[2, 3, 4], DType::F32).unwrap();
    assert!(x.layer_norm(&[3], None, None, 1e-5).is_err(), "not the trailing shape");
    assert!(x.layer_norm(&[2, 3, 4, 1], None, None, 1e-5).is_err());
    assert!(x.layer_norm(&[4], Some(&Tensor::ones(&[3], DType::F32).unwrap()), None, 1e-5).is_err());
    assert!(x.layer_norm(&[4], None, None, -1.0).is_err());
    assert!(x.layer_norm(&[4], None, None, f64::NAN).is_err());
    assert!(Tensor::ones(&[2, 4], DType::I32).unwrap().rms_norm(&[4], None, None).is_err());
    // Over two trailing dimensions at once.
    let y = x.layer_norm(&[3, 4], None, None, 1e-5).unwrap();
    assert_eq!(y.sizes(), [2, 3, 4]);
    assert!(y.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0), "a constant row normalises to 0");
}

// ---- scalar operands ----

#[test]
fn scalar_operands_on_both_sides() {
    let x = t32(&[1., 2., 4.], &[3]);
    assert_eq!((&x * 0.125).to_vec::<f32>().unwrap(), [0.125, 0.25, 0.5]);
    assert_eq!((2.0 - &x).to_vec::<f32>().unwrap(), [1., 0., -2.]);
    assert_eq!((&x / 2.0).to_vec::<f32>().unwrap(), [0.5, 1., 2.]);
    assert_eq!((8.0 / &x).to_vec::<f32>().unwrap(), [8., 4., 2.]);
    assert_eq!((&x + 1.0).to_vec::<f32>().unwrap(), [2., 3., 5.]);
    assert_eq!(x.add_scalar(1.0).unwrap().to_vec::<f32>().unwrap(), [2., 3., 5.]);
    // An integer tensor times a float scalar becomes float (PyTorch's promotion); times an
    // integer scalar it stays integer.
    let i = Tensor::from_slice(&[1i32, 2, 3], &[3], DType::I32).unwrap();
    let f = i.mul_scalar(0.5).unwrap();
    assert_eq!(f.dtype(), DType::F32);
    assert_eq!(f.to_vec::<f32>().unwrap(), [0.5, 1.0, 1.5]);
    let k = i.mul_scalar(3i64).unwrap();
    assert_eq!(k.dtype(), DType::I32);
    assert_eq!(k.to_vec::<i32>().unwrap(), [3, 6, 9]);
    // A half tensor stays half with a float scalar.
    let h = x.to_dtype(DType::F16).unwrap().mul_scalar(0.125).unwrap();
    assert_eq!(h.dtype(), DType::F16);
    x.add_scalar_(10.0).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), [11., 12., 14.]);
    assert!(i.add_scalar_(0.5).is_err(), "an in-place int op cannot take a float result");
}

#[test]
fn usize_operands_past_i64_max_keep_their_sign() {
    use tensormem_tensor::Scalar;
    assert_eq!(Scalar::from(7usize), Scalar::Int(7));
    assert_eq!(Scalar::from(i64::MAX as usize), Scalar::Int(i64::MAX));
    // `as i64` made usize::MAX a -1: x + usize::MAX was x - 1, and x < usize::MAX false.
    assert_eq!(Scalar::from(usize::MAX), Scalar::Float(18_446_744_073_709_551_615.0));
    let x = Tensor::from_slice(&[1.0f64, 2.0], &[2], DType::F64).unwrap();
    assert_eq!(x.add_scalar(usize::MAX).unwrap().to_vec::<f64>().unwrap(), [1.8446744073709552e19; 2]);
    let i = Tensor::from_slice(&[5i64, -3], &[2], DType::I64).unwrap();
    assert_eq!(i.lt_scalar(usize::MAX).unwrap().to_vec::<bool>().unwrap(), [true, true]);
    assert_eq!(i.lt_scalar(1usize << 62).unwrap().to_vec::<bool>().unwrap(), [true, true]);
    // A fill that does not fit is refused instead of filling with -1.
    let mask = Tensor::from_slice(&[true, false], &[2], DType::Bool).unwrap();
    assert!(matches!(i.masked_fill(&mask, usize::MAX), Err(TensorError::UnsupportedDType { op: "masked_fill", .. })));
    assert_eq!(i.masked_fill(&mask, 9usize).unwrap().to_vec::<i64>().unwrap(), [9, -3]);
}

// ---- options, *_like, new_* ----

#[test]
fn outputs_land_in_the_inputs_allocator() {
    let tracker = Arc::new(TrackingAllocator::new(AllocatorRegistry::global().get()));
    let opts = TensorOptions::new().allocator(tracker.clone()).dtype(DType::BF16);
    let x = Tensor::ones(&[4, 8], &opts).unwrap();
    let before = tracker.live_chunks().len();
    let z = Tensor::zeros_like(&x).unwrap();
    let o = Tensor::ones_like(&x).unwrap();
    let f = Tensor::full_like(&x, 2.5).unwrap();
    let n = x.new_zeros(&[3]).unwrap();
    let m = x.new_full(&[2, 2], -1.0).unwrap();
    for t in [&z, &o, &f, &n, &m] {
        assert_eq!(t.dtype(), DType::BF16);
        assert!(std::ptr::addr_eq(Arc::as_ptr(t.storage().allocator().unwrap()), Arc::as_ptr(&tracker)));
        t.materialize().unwrap(); // zeros and empty are lazy until first used
    }
    assert_eq!(tracker.live_chunks().len(), before + 5);
    let f32s = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(f32s(&f), vec![2.5; 32]);
    assert_eq!(f32s(&m), vec![-1.0; 4]);
    assert_eq!(f32s(&z), vec![0.0; 32]);
    assert_eq!(o.sizes(), [4, 8]);
    assert_eq!(x.options().get_dtype(), Some(DType::BF16));
    // Kernels on x allocate through the same allocator.
    let y = &x + &o;
    assert!(std::ptr::addr_eq(Arc::as_ptr(y.storage().allocator().unwrap()), Arc::as_ptr(&tracker)));
}

// ---- slice access ----

#[test]
fn slices_read_and_write_contiguous_data() {
    let x = Tensor::zeros(&[2, 3], DType::F32).unwrap();
    {
        let mut s = x.as_mut_slice::<f32>().unwrap();
        for (i, v) in s.iter_mut().enumerate() {
            *v = i as f32;
        }
    }
    assert_eq!(x.to_vec::<f32>().unwrap(), [0., 1., 2., 3., 4., 5.]);
    // A row view is contiguous and reads its own elements.
    assert_eq!(&*x.select(0, 1).unwrap().as_slice::<f32>().unwrap(), &[3., 4., 5.]);
    let e = x.t().unwrap().as_slice::<f32>().unwrap_err();
    assert!(matches!(e, TensorError::NotContiguous { .. }), "{e}");
    assert!(x.as_slice::<f64>().is_err(), "wrong element type");
    // Readers share; a kernel reading the tensor runs while a slice is held.
    let s = x.as_slice::<f32>().unwrap();
    assert_eq!(x.sum().unwrap().item::<f32>().unwrap(), 15.0);
    drop(s);
}

#[test]
fn a_thread_holding_a_slice_gets_an_error_instead_of_waiting_for_itself() {
    let x = Tensor::arange(0.0, 6.0, 1.0, DType::F32).unwrap();
    let row = x.narrow(0, 3, 3).unwrap(); // another view of the same storage
    let other = Tensor::ones(&[6], DType::F32).unwrap();
    let borrowed = |e: TensorError, op: &str, mutable: bool| {
        assert!(matches!(e, TensorError::Borrowed { mutable: m, .. } if m == mutable), "{e:?}");
        assert!(e.to_string().starts_with(&format!("{op}: ")), "{e}");
        assert!(e.to_string().contains("drop the slice first"), "{e}");
    };
    {
        // A mutable slice: every access to the storage from this thread, reads included.
        let mut s = x.as_mut_slice::<f32>().unwrap();
        borrowed(x.add(&other).unwrap_err(), "add", true);
        borrowed(other.narrow(0, 0, 3).unwrap().add_(&row).unwrap_err(), "add_", true);
        borrowed(row.to_vec::<f32>().unwrap_err(), "to_vec", true);
        borrowed(x.sum().unwrap_err(), "reduction", true);
        borrowed(row.as_slice::<f32>().unwrap_err(), "as_slice", true);
        borrowed(x.as_mut_slice::<f32>().unwrap_err(), "as_mut_slice", true);
        assert!(format!("{x}").contains("this thread holds a mutable slice"), "{x}");
        s[0] = 10.0;
        // Other storages are untouched by the guard.
        assert_eq!(other.add(&other).unwrap().to_vec::<f32>().unwrap(), [2.0; 6]);
    }
    assert_eq!(other.to_vec::<f32>().unwrap(), [1.0; 6], "the refused add_ wrote nothing");
    {
        // A slice: reads run (more slices too), writes to that storage are refused.
        let s = x.as_slice::<f32>().unwrap();
        let s2 = row.as_slice::<f32>().unwrap();
        assert_eq!(x.add(&x).unwrap().to_vec::<f32>().unwrap(), [20., 2., 4., 6., 8., 10.]);
        borrowed(row.add_(&other.narrow(0, 0, 3).unwrap()).unwrap_err(), "add_", false);
        borrowed(other.add_out(&other, &x).unwrap_err(), "add_out", false);
        borrowed(row.set(&[0], 1.0f32).unwrap_err(), "set", false);
        borrowed(x.as_mut_slice::<f32>().unwrap_err(), "as_mut_slice", false);
        assert_eq!((&*s, &*s2), (&[10., 1., 2., 3., 4., 5.][..], &[3., 4., 5.][..]));
    }
    // Once dropped, everything works again.
    x.add_(&other).unwrap();
    x.as_mut_slice::<f32>().unwrap()[1] = 0.0;
    assert_eq!(x.to_vec::<f32>().unwrap(), [11., 0., 3., 4., 5., 6.]);
}

#[test]
fn a_slice_is_shared_with_scoped_threads_by_reference() {
    fn sync<T: Sync>(_: &T) {}
    let x = Tensor::arange(0.0, 1000.0, 1.0, DType::F32).unwrap();
    let s = x.as_slice::<f32>().unwrap();
    sync(&s);
    let halves: Vec<f32> = std::thread::scope(|scope| {
        let parts = [scope.spawn(|| s[..500].iter().sum()), scope.spawn(|| s[500..].iter().sum())];
        parts.map(|h| h.join().unwrap()).to_vec()
    });
    assert_eq!(halves, [124_750.0, 374_750.0]);
    let m = x.as_mut_slice::<f32>();
    assert!(matches!(m, Err(TensorError::Borrowed { mutable: false, .. })));
    drop(s);
    let mut m = x.as_mut_slice::<f32>().unwrap();
    sync(&m);
    m[0] = 7.0;
    drop(m);
    assert_eq!(x.get::<f32>(&[0]).unwrap(), 7.0);
}

#[test]
fn reading_under_a_slice_while_another_thread_waits_to_write_does_not_deadlock() {
    // parking_lot's fair lock parks new readers behind a waiting writer; a thread that holds
    // a slice and runs a kernel reading the same storage would then wait for a writer that
    // waits for it. The kernel must read under the slice's lock instead.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let x = Tensor::rand(&[256], TensorOptions::new().seed(9)).unwrap();
        let s = x.as_slice::<f32>().unwrap();
        let writer = {
            let x = x.clone();
            std::thread::spawn(move || x.add_scalar_(1.0).map(|_| ()))
        };
        std::thread::sleep(std::time::Duration::from_millis(200)); // the writer is parked
        let total = x.sum().unwrap().item::<f32>().unwrap();
        let again = x.as_slice::<f32>().unwrap().iter().sum::<f32>();
        let expected: f32 = s.iter().sum();
        drop(s);
        writer.join().unwrap().unwrap();
        done_tx.send((total - expected, again - expected)).unwrap();
    });
    let (d1, d2) = done_rx.recv_timeout(std::time::Duration::from_secs(30)).expect("deadlock");
    assert!(d1.abs() < 1e-3 && d2.abs() < 1e-3, "{d1} {d2}");
}

// ---- rotary slicing ----

#[test]
fn rotary_embedding_by_slices_in_place() {
    // x = [x1, x2] halves; rotate_half(x) = [-x2, x1]; out = x*cos + rotate_half(x)*sin.
    let (s, d) = (3, 4);
    let xv: Vec<f32> = (0..s * d).map(|v| v as f32 + 1.0).collect();
    let x = t32(&xv, &[s, d]);
    let cos = Tensor::full(&[s, d], 0.5, DType::F32).unwrap();
    let sin = Tensor::full(&[s, d], 2.0, DType::F32).unwrap();
    let x1 = x.narrow(-1, 0, d / 2).unwrap();
    let x2 = x.narrow(-1, (d / 2) as isize, d / 2).unwrap();
    let rot = Tensor::cat(&[&x2.neg().unwrap(), &x1], -1).unwrap();
    let out = &(&x * &cos) + &(&rot * &sin);
    let got = out.to_vec::<f32>().unwrap();
    for r in 0..s {
        for c in 0..d {
            let rv = if c < d / 2 { -xv[r * d + c + d / 2] } else { xv[r * d + c - d / 2] };
            assert_eq!(got[r * d + c], xv[r * d + c] * 0.5 + rv * 2.0);
        }
    }
    // The in-place form PyTorch accepts: a[:, :2].sub_(a[:, 2:]) (disjoint halves).
    let a = t32(&xv, &[s, d]);
    a.narrow(1, 0, 2).unwrap().sub_(&a.narrow(1, 2, 2).unwrap()).unwrap();
    let av = a.to_vec::<f32>().unwrap();
    for r in 0..s {
        assert_eq!(av[r * d], xv[r * d] - xv[r * d + 2]);
        assert_eq!(av[r * d + 3], xv[r * d + 3]);
    }
}

// ---- safetensors ----

#[test]
fn safetensors_round_trip_is_zero_copy_and_accounted() {
    let dir_guard = tempdir("st");
    let dir = dir_guard.path();
    let path = dir.join("model.safetensors");
    let opts = TensorOptions::new().seed(3);
    let wq = Tensor::randn(&[64, 32], opts.clone().dtype(DType::F32)).unwrap();
    let emb = Tensor::randn(&[100, 16], opts.clone().dtype(DType::BF16)).unwrap();
    let ids = Tensor::arange(0.0, 10.0, 1.0, DType::I64).unwrap();
    let flags = Tensor::from_slice(&[true, false, true], &[3], DType::Bool).unwrap();
    let view = wq.t().unwrap(); // a view is written as its elements
    let empty = Tensor::zeros(&[0, 5], DType::F16).unwrap();
    let meta = [("format".to_string(), "pt".to_string())].into_iter().collect();
    let list = [("wq", &wq), ("emb", &emb), ("ids", &ids), ("flags", &flags), ("wq_t", &view), ("empty", &empty)];
    save_safetensors(&path, &list, Some(meta)).unwrap();

    let before = tensormem::telemetry::mapped_memory().bytes;
    // SAFETY: the test owns the file and does not change it.
    let file = unsafe { SafeTensors::open(&path) }.unwrap();
    let file_len = std::fs::metadata(&path).unwrap().len();
    assert_eq!(file.mapped_bytes() as u64, file_len);
    assert!(tensormem::telemetry::mapped_memory().bytes >= before + file_len);
    assert_eq!(file.len(), 6);
    let mut names = file.names();
    names.sort();
    assert_eq!(names, ["emb", "empty", "flags", "ids", "wq", "wq_t"]);
    assert_eq!(file.metadata().unwrap()["format"], "pt");
    assert_eq!(file.info("emb").unwrap(), (Ok(DType::BF16), vec![100, 16]));

    for (name, orig) in list {
        let t = file.tensor(name).unwrap();
        assert_eq!(t.dtype(), orig.dtype(), "{name}");
        assert_eq!(t.sizes(), orig.sizes(), "{name}");
        let f64s = |t: &Tensor| t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        assert_eq!(f64s(&t), f64s(orig), "{name}");
        assert_eq!(t.storage().allocator_name(), "mmap", "{name}");
        assert!(t.storage().same(file.tensor("wq").unwrap().storage()), "one mapping backs every tensor");
        assert!(t.add_scalar_(1.0).is_err(), "{name}: mapped weights are read-only");
    }
    // Zero copy: the tensor's data lies inside the file's mapping.
    let wq_m = file.tensor_checked("wq", DType::F32, &[64, 32]).unwrap();
    let off_bytes = wq_m.storage_offset() * 4;
    assert!(off_bytes >= 8 && off_bytes + 64 * 32 * 4 <= file.mapped_bytes());
    // Kernels read mapped weights directly.
    let x = Tensor::ones(&[2, 64], DType::F32).unwrap();
    let y = x.matmul(&wq_m).unwrap();
    let want = x.matmul(&wq).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());

    // The mapping outlives the SafeTensors handle while tensors use it.
    drop(file);
    assert_eq!(wq_m.to_vec::<f32>().unwrap(), wq.to_vec::<f32>().unwrap());
    drop((wq_m, y));
    assert!(
        tensormem::telemetry::mapped_memory().files.iter().all(|f| f.path != path),
        "unmapped with its last tensor"
    );

    // A writable copy through the default allocator.
    let copy = Tensor::load_safetensors(&path, "ids", DType::I64).unwrap();
    copy.add_scalar_(1i64).unwrap();
    assert_eq!(copy.to_vec::<i64>().unwrap(), (1..=10).collect::<Vec<i64>>());
    // In the options' dtype when they name one (converted), else in the file's.
    let as_f32 = Tensor::load_safetensors(&path, "ids", DType::F32).unwrap();
    assert_eq!(as_f32.to_vec::<f32>().unwrap(), (0..10).map(|i| i as f32).collect::<Vec<f32>>());
    let flags_copy = Tensor::load_safetensors(&path, "flags", TensorOptions::new()).unwrap();
    assert_eq!(flags_copy.to_vec::<bool>().unwrap(), [true, false, true]);
    let emb_f32 = Tensor::load_safetensors(&path, "emb", DType::F32).unwrap();
    assert_eq!(emb_f32.to_vec::<f32>().unwrap(), emb.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap());
    let q = Tensor::load_safetensors(&path, "wq", DType::Q8_0).unwrap();
    assert_eq!((q.dtype(), q.sizes()), (DType::Q8_0, &[64, 32][..]));
    assert_eq!(
        q.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
        wq.to_dtype(DType::Q8_0).unwrap().to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
    );
    // A quantised dtype needs whole blocks of 32 along the last dimension: `emb`'s is 16.
    let err = Tensor::load_safetensors(&path, "emb", DType::Q8_0).unwrap_err().to_string();
    assert!(err.contains("multiple of 32"), "{err}");
}

#[test]
fn safetensors_checked_loads_name_what_differs() {
    let dir_guard = tempdir("st-check");
    let dir = dir_guard.path();
    let path = dir.join("w.safetensors");
    let w = Tensor::zeros(&[4, 8], DType::F16).unwrap();
    save_safetensors(&path, &[("layer.0.w", &w)], None).unwrap();
    // SAFETY: the test owns the file.
    let file = unsafe { SafeTensors::open(&path) }.unwrap();
    let e = file.tensor_checked("layer.0.w", DType::F16, &[8, 4]).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("[4, 8]") && msg.contains("[8, 4]"), "{msg}");
    let e = file.tensor_checked("layer.0.w", DType::F32, &[4, 8]).unwrap_err();
    assert!(e.to_string().contains("f32") && e.to_string().contains("f16"), "{e}");
    let e = file.tensor("layer.1.w").unwrap_err();
    assert!(matches!(e, TensorError::BadFile { .. }), "{e}");
    assert!(e.to_string().contains("layer.1.w") && e.to_string().contains("layer.0.w"), "{e}");
    assert!(file.info("nope").is_none());
    // Saving: duplicate names and quantised dtypes are refused, and the file is left alone.
    assert!(save_safetensors(&path, &[("a", &w), ("a", &w)], None).is_err());
    let q = Tensor::zeros(&[1, 32], DType::F32).unwrap().to_dtype(DType::Q8_0).unwrap();
    assert!(save_safetensors(dir.join("q.safetensors"), &[("q", &q)], None).is_err());
    assert!(!dir.join("q.safetensors").exists());
    drop(file);
}

/// A safetensors file written by hand: header JSON padded with `pad` spaces, then `data`.
fn handmade(path: &std::path::Path, header: &str, pad: usize, data: &[u8]) {
    let mut h = header.as_bytes().to_vec();
    h.extend(std::iter::repeat_n(b' ', pad));
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend(h);
    bytes.extend(data);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn safetensors_bad_files_are_errors_not_crashes() {
    let dir_guard = tempdir("st-bad");
    let dir = dir_guard.path();
    let p = dir.join("bad.safetensors");
    let open = |p: &std::path::Path| {
        // SAFETY: the test owns the files.
        unsafe { SafeTensors::open(p) }
    };
    // Empty, truncated, not JSON, offsets past the data, sizes not matching the shape.
    std::fs::write(&p, b"").unwrap();
    assert!(matches!(open(&p).unwrap_err(), TensorError::BadFile { .. }));
    std::fs::write(&p, 1000u64.to_le_bytes()).unwrap();
    assert!(matches!(open(&p).unwrap_err(), TensorError::BadFile { .. }));
    handmade(&p, "not json", 0, &[]);
    assert!(matches!(open(&p).unwrap_err(), TensorError::BadFile { .. }));
    handmade(&p, r#"{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, 0, &[0; 4]);
    assert!(matches!(open(&p).unwrap_err(), TensorError::BadFile { .. }));
    handmade(&p, r#"{"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#, 0, &[0; 8]);
    assert!(matches!(open(&p).unwrap_err(), TensorError::BadFile { .. }));
    assert!(matches!(open(&dir.join("missing")).unwrap_err(), TensorError::Io { .. }));

    // A dtype tensormem does not have: the file opens, that tensor is an error naming it.
    handmade(&p, r#"{"u":{"dtype":"U32","shape":[2],"data_offsets":[0,8]}}"#, 0, &[0; 8]);
    let f = open(&p).unwrap();
    assert!(f.info("u").unwrap().0.is_err());
    let e = f.tensor("u").unwrap_err();
    assert!(e.to_string().contains("U32"), "{e}");
    drop(f);

    // A bool byte that is not 0 or 1.
    handmade(&p, r#"{"b":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}}"#, 0, &[1, 2, 0]);
    let f = open(&p).unwrap();
    assert!(f.tensor("b").unwrap_err().to_string().contains("byte 2"));
    drop(f);

    // Data not aligned to the element size (header of odd length): copied, values intact.
    let header = r#"{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let pad = (0..8).find(|k| !(8 + header.len() + k).is_multiple_of(4)).unwrap();
    let mut data = 1.5f32.to_le_bytes().to_vec();
    data.extend((-2.0f32).to_le_bytes());
    handmade(&p, header, pad, &data);
    let f = open(&p).unwrap();
    let x = f.tensor("x").unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), [1.5, -2.0]);
    assert_ne!(x.storage().allocator_name(), "mmap", "misaligned data is copied");
    drop(f);
}

// ---- activations ----

/// The distance from `got` to the exact `want`, in units of the last place of `want` as an
/// `f32` (at least the smallest subnormal).
fn ulps(got: f32, want: f64) -> f64 {
    if got == want as f32 || (got.is_nan() && want.is_nan()) {
        return 0.0;
    }
    let w = (want as f32).abs();
    let ulp = (f64::from(f32::from_bits(w.to_bits() + 1)) - f64::from(w)).max(f64::from(f32::from_bits(1)));
    (f64::from(got) - want).abs() / ulp
}

#[test]
fn activations_match_their_formulas_down_the_tails() {
    // -12 to 12 in steps of 1/64, and then the far tails.
    let mut xs: Vec<f32> = (-768..=768).map(|i| i as f32 / 64.0).collect();
    xs.extend([-100.0, -103.0, -104.5, -88.0, -11.0, -10.5, 1e-30, -1e-30, 3e-39, 1e30, -1e30]);
    let x = t32(&xs, &[xs.len()]);
    fn two_u(x: f64) -> f64 {
        2.0 * (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)
    }
    type Fun = fn(&Tensor) -> tensormem_tensor::Result<Tensor>;
    type Case = (&'static str, Fun, fn(f64) -> f64, f64);
    let cases: [Case; 4] = [
        ("tanh", Tensor::tanh, f64::tanh, 2.0),
        ("sigmoid", Tensor::sigmoid, |x| 1.0 / (1.0 + (-x).exp()), 3.0),
        ("silu", Tensor::silu, |x| x / (1.0 + (-x).exp()), 4.0),
        // The rounding of 2u costs up to |2u| units, as in PyTorch (whose formula gives 0 below
        // -4.3 besides).
        ("gelu_tanh", Tensor::gelu_tanh, |x| x / (1.0 + (-two_u(x)).exp()), 3.0),
    ];
    for (name, f, exact, bound) in cases {
        let got = f(&x).unwrap().to_vec::<f32>().unwrap();
        for (&v, &g) in xs.iter().zip(&got) {
            let want = exact(f64::from(v));
            let mut e = ulps(g, want);
            if name == "gelu_tanh" {
                e /= 1.0 + two_u(f64::from(v)).abs();
            }
            assert!(e <= bound, "{name}({v:e}) = {g:e}, exact {want:e}: {e} ulp");
        }
    }
    // Values PyTorch's f32 formulas lose: sigmoid(-100) and silu(-100) are numbers, not 0, and
    // so is the tanh GELU at -8 (PyTorch: -0).
    let tail = t32(&[-100.0, -8.0], &[2]);
    let s = tail.sigmoid().unwrap().to_vec::<f32>().unwrap();
    assert!(ulps(s[0], (-100f64).exp() / (1.0 + (-100f64).exp())) <= 3.0 && s[0] > 0.0, "{s:?}");
    let g = tail.gelu_tanh().unwrap().to_vec::<f32>().unwrap();
    assert!((f64::from(g[1]) / (-8.0 / (1.0 + (-two_u(-8.0)).exp())) - 1.0).abs() < 1e-4, "{g:?}");

    // log: every binade, subnormals, and its special values.
    let mut ps: Vec<f32> = (-149..128).map(|e| 2f32.powi(e) * 1.3).filter(|v| v.is_finite() && *v > 0.0).collect();
    ps.extend([0.0, -0.0, -1.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1.0, f32::MAX, f32::from_bits(1)]);
    let got = t32(&ps, &[ps.len()]).log().unwrap().to_vec::<f32>().unwrap();
    for (&v, &g) in ps.iter().zip(&got) {
        match v {
            v if v == 0.0 => assert_eq!(g, f32::NEG_INFINITY, "log({v})"),
            f32::INFINITY => assert_eq!(g, f32::INFINITY),
            v if v < 0.0 || v.is_nan() => assert!(g.is_nan(), "log({v}) = {g}"),
            v => assert!(ulps(g, f64::from(v).ln()) <= 1.0, "log({v:e}) = {g:e}"),
        }
    }
    let specials = t32(&[f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -0.0], &[4]);
    let bits = |t: Tensor| t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let nan = f32::NAN.to_bits();
    let fix = |v: Vec<u32>| v.into_iter().map(|b| if f32::from_bits(b).is_nan() { nan } else { b }).collect::<Vec<_>>();
    assert_eq!(fix(bits(specials.tanh().unwrap())), [1f32.to_bits(), (-1f32).to_bits(), nan, (-0f32).to_bits()]);
    // -inf: -inf * 0 and -inf / inf, the NaN of PyTorch's formulas.
    assert_eq!(fix(bits(specials.silu().unwrap())), [f32::INFINITY.to_bits(), nan, nan, (-0f32).to_bits()]);
    assert_eq!(fix(bits(specials.gelu_tanh().unwrap())), [f32::INFINITY.to_bits(), nan, nan, (-0f32).to_bits()]);
}

#[test]
fn activations_have_in_place_and_out_forms_and_take_integers_as_f32() {
    let x = t32(&[-2.0, -0.5, 0.0, 1.5], &[2, 2]);
    type Fresh = fn(&Tensor) -> tensormem_tensor::Result<Tensor>;
    type InPlace = for<'a> fn(&'a Tensor) -> tensormem_tensor::Result<&'a Tensor>;
    type Out = for<'a> fn(&Tensor, &'a Tensor) -> tensormem_tensor::Result<&'a Tensor>;
    let forms: [(&str, Fresh, InPlace, Out); 2] = [
        ("gelu_tanh", Tensor::gelu_tanh, Tensor::gelu_tanh_, Tensor::gelu_tanh_out),
        ("silu", Tensor::silu, Tensor::silu_, Tensor::silu_out),
    ];
    for (name, fresh, inplace, out) in forms {
        let f = fresh(&x).unwrap().to_vec::<f32>().unwrap();
        let y = Tensor::zeros(&[2, 2], DType::F32).unwrap();
        y.copy_(&x).unwrap();
        inplace(&y).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), f, "{name}_");
        let o = Tensor::zeros(&[2, 2], DType::F64).unwrap();
        out(&x, &o).unwrap();
        let o: Vec<f32> = o.to_vec::<f64>().unwrap().iter().map(|&v| v as f32).collect();
        assert_eq!(o, f, "{name}_out into f64");
    }
    let silu = x.silu().unwrap().to_vec::<f32>().unwrap();
    for (v, s) in [-2.0f32, -0.5, 0.0, 1.5].iter().zip(&silu) {
        assert!((s - v / (1.0 + (-v).exp())).abs() <= 1e-6, "silu({v}) = {s}");
    }
    // Integers compute in f32 (as `exp` does); their in-place forms are refused.
    let ints = Tensor::from_vec(vec![-1i32, 0, 3], &[3], DType::I32).unwrap();
    let g = ints.gelu_tanh().unwrap();
    assert_eq!(g.dtype(), DType::F32);
    assert!((g.to_vec::<f32>().unwrap()[2] - 2.996_362_7).abs() < 1e-6);
    assert!(matches!(ints.silu_(), Err(TensorError::UnsupportedDType { op: "silu_", .. })));
    let wrong = Tensor::zeros(&[3], DType::F32).unwrap();
    assert!(matches!(x.silu_out(&wrong), Err(TensorError::BadShape { op: "silu_out", .. })));
}

#[test]
fn activations_give_the_same_bits_on_every_route() {
    // Contiguous f32 runs (four AVX-512 vectors at a time where the CPU has AVX-512), strided
    // runs (the plain loop) and in place must agree bit for bit, and bf16 must be the f32
    // result of the widened values rounded once.
    type Fresh = fn(&Tensor) -> tensormem_tensor::Result<Tensor>;
    type InPlace = for<'a> fn(&'a Tensor) -> tensormem_tensor::Result<&'a Tensor>;
    let ops: [(&str, Fresh, InPlace); 7] = [
        ("gelu", Tensor::gelu, Tensor::gelu_),
        ("gelu_tanh", Tensor::gelu_tanh, Tensor::gelu_tanh_),
        ("silu", Tensor::silu, Tensor::silu_),
        ("sigmoid", Tensor::sigmoid, Tensor::sigmoid_),
        ("tanh", Tensor::tanh, Tensor::tanh_),
        ("exp", Tensor::exp, Tensor::exp_),
        ("log", Tensor::log, Tensor::log_),
    ];
    let bits = |t: &Tensor| -> Vec<u32> {
        let v = t.to_vec::<f32>().unwrap();
        v.iter().map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() }).collect()
    };
    // Every bf16 value as an f32 (exact), and two more: 3 rows of 21846, not a multiple of 16.
    let xs: Vec<f32> = (0..=u16::MAX).map(|b| f32::from_bits(u32::from(b) << 16)).chain([0.5, -0.5]).collect();
    let x = t32(&xs, &[3, xs.len() / 3]);
    let xt = x.t().unwrap().contiguous().unwrap().t().unwrap();
    assert!(!xt.is_contiguous());
    let xb = x.to_dtype(DType::BF16).unwrap();
    // Every f16 value, and strided half-precision views (the converting loops).
    let hs: Vec<f32> = (0..=u16::MAX).map(|b| half::f16::from_bits(b).to_f32()).chain([0.5, -0.5]).collect();
    let xh = t32(&hs, &[3, hs.len() / 3]).to_dtype(DType::F16).unwrap();
    let strided = |t: &Tensor| t.t().unwrap().contiguous().unwrap().t().unwrap();
    let copy = |t: &Tensor| {
        let c = Tensor::zeros(t.sizes(), t.dtype()).unwrap();
        c.copy_(t).unwrap();
        c
    };
    let (xbt, xht) = (strided(&xb), strided(&xh));
    let _switch = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let blocks = avx512_blocks_enabled();
    for (name, fresh, inplace) in ops {
        let want = fresh(&x).unwrap();
        // The blocks turned off: the one-vector loop on the same contiguous run (other tests
        // running meanwhile see the same bits either way).
        set_avx512_blocks(false);
        let loop_result = fresh(&x).unwrap();
        let loop_bf16 = fresh(&xb).unwrap();
        let loop_f16 = fresh(&xh).unwrap();
        set_avx512_blocks(blocks);
        assert_eq!(bits(&loop_result), bits(&want), "{name}, blocks / one-vector loop");
        assert_eq!(bits(&fresh(&xt).unwrap()), bits(&want), "{name} of a strided view");
        let y = Tensor::zeros(x.sizes(), DType::F32).unwrap();
        y.copy_(&x).unwrap();
        inplace(&y).unwrap();
        assert_eq!(bits(&y), bits(&want), "{name}_");
        let b = fresh(&xb).unwrap();
        assert_eq!(b.dtype(), DType::BF16);
        let wb = want.to_dtype(DType::BF16).unwrap();
        assert_eq!(bits(&b.to_dtype(DType::F32).unwrap()), bits(&wb.to_dtype(DType::F32).unwrap()), "{name} in bf16");
        assert_eq!(bits(&b.to_dtype(DType::F32).unwrap()), bits(&loop_bf16.to_dtype(DType::F32).unwrap()));
        // Half-precision runs are widened, computed and rounded in registers where the blocks
        // are on, through buffers in the converting loops elsewhere: the same bits, fresh, in
        // place and strided, and f16 the f32 result of its widened values rounded once.
        let h = fresh(&xh).unwrap();
        let wh = fresh(&xh.to_dtype(DType::F32).unwrap()).unwrap().to_dtype(DType::F16).unwrap();
        for (t, want, what) in [
            (&b, &loop_bf16, "bf16, blocks / one-vector loop"),
            (&fresh(&xbt).unwrap(), &b, "bf16 of a strided view"),
            (inplace(&copy(&xb)).unwrap(), &b, "bf16 in place"),
            (&h, &wh, "f16"),
            (&loop_f16, &wh, "f16, one-vector loop"),
            (&fresh(&xht).unwrap(), &wh, "f16 of a strided view"),
            (inplace(&copy(&xh)).unwrap(), &wh, "f16 in place"),
        ] {
            assert_eq!(t.dtype(), want.dtype(), "{name}, {what}");
            let (got, want) = (bits(&t.to_dtype(DType::F32).unwrap()), bits(&want.to_dtype(DType::F32).unwrap()));
            let first = got.iter().zip(&want).position(|(g, w)| g != w);
            assert!(first.is_none(), "{name}, {what}: element {first:?} differs ({} elements)", got.len());
        }
    }
}

#[test]
fn softmax_and_log_softmax_give_the_same_bits_with_the_blocks_on_and_off() {
    // A row's exponentials go through the AVX-512 blocks where they are on (bf16 rows rounded
    // by AVX512-BF16's instruction where the CPU has it), and through the one-vector loop
    // elsewhere: the same bits, in f32, bf16 and f16, for rows around the blocks' 64, 32 and 16
    // elements, along the last dimension and along the first. One row in each runs down to
    // -120, below the max by more than 87: its smallest softmax results are subnormal, which
    // `vcvtne2ps2bf16` would flush to zero. Rows past the 16384-element scratch row take the
    // one-vector loop on either setting.
    let bits = |t: &Tensor| -> Vec<u32> {
        let v = t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        v.iter().map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() }).collect()
    };
    let _switch = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let blocks = avx512_blocks_enabled();
    for len in [1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 256, 1000, 16384, 16401, 40000] {
        let opts = TensorOptions::new().dtype(DType::F32).seed(len as u64);
        let x = Tensor::randn(&[7, len], opts).unwrap().mul_scalar(4.0).unwrap();
        let ramp: Vec<f32> = (0..len).map(|k| -120.0 * k as f32 / len.max(2) as f32).collect();
        x.select(0, 3).unwrap().copy_(&t32(&ramp, &[len])).unwrap();
        for dt in [DType::F32, DType::BF16, DType::F16] {
            let x = x.to_dtype(dt).unwrap();
            for (dim, log) in [(-1, false), (0, false), (-1, true), (0, true)] {
                let op = |x: &Tensor| if log { x.log_softmax(dim) } else { x.softmax(dim) }.unwrap();
                let on = op(&x);
                set_avx512_blocks(false);
                let off = op(&x);
                set_avx512_blocks(blocks);
                assert_eq!(on.dtype(), dt);
                let (on_bits, off_bits) = (bits(&on), bits(&off));
                let first = on_bits.iter().zip(&off_bits).position(|(a, b)| a != b);
                assert!(first.is_none(), "{dt:?}, rows of {len}, dim {dim}, log {log}: element {first:?} differs");
                // Each row's probabilities sum to 1 within their rounding.
                let p = on.to_dtype(DType::F64).unwrap();
                let p = if log { p.exp().unwrap() } else { p };
                let sums = p.sum_dim(dim, false).unwrap().to_vec::<f64>().unwrap();
                let tol = if dt == DType::F32 { 1e-5 } else { 2e-2 };
                assert!(
                    sums.iter().all(|s| (s - 1.0).abs() < tol),
                    "{dt:?}, rows of {len}, dim {dim}, log {log}: {sums:?}"
                );
            }
        }
    }
}

/// Held by the tests that turn the AVX-512 blocks off and on, so that each sees its own setting.
static SWITCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Whether this CPU has what the AVX-512 blocks are compiled for.
fn cpu_has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[test]
fn child_reports_the_avx512_blocks_switch() {
    if std::env::var_os("TENSORMEM_TEST_BLOCKS_CHILD").is_some() {
        println!("blocks={}", avx512_blocks_enabled());
    }
}

#[test]
fn the_avx512_blocks_follow_the_cpu_the_environment_and_the_setter() {
    let child = |value: Option<&str>| -> bool {
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "tensor_ops::child_reports_the_avx512_blocks_switch", "--nocapture"])
            .env_remove(AVX512_BLOCKS_ENV)
            .env("TENSORMEM_TEST_BLOCKS_CHILD", "1");
        if let Some(v) = value {
            cmd.env(AVX512_BLOCKS_ENV, v);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child with {AVX512_BLOCKS_ENV}={value:?} failed: {stdout}");
        stdout.lines().find_map(|l| l.strip_prefix("blocks=")).expect("the child reports").trim() == "true"
    };
    let avx512 = cpu_has_avx512();
    assert_eq!(child(None), avx512, "on by default exactly where the CPU has AVX-512");
    for off in ["0", "off", "FALSE"] {
        assert!(!child(Some(off)), "{AVX512_BLOCKS_ENV}={off:?} turns the blocks off");
    }
    for on in ["1", "true", "maybe"] {
        assert_eq!(child(Some(on)), avx512, "{AVX512_BLOCKS_ENV}={on:?} leaves them on where the CPU has AVX-512");
    }
    let _switch = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let before = avx512_blocks_enabled();
    assert!(!set_avx512_blocks(false));
    assert!(!avx512_blocks_enabled());
    assert_eq!(set_avx512_blocks(true), avx512, "on only where the CPU has AVX-512");
    set_avx512_blocks(before);
}

// ---- large inputs: the parallel paths ----

#[test]
fn parallel_row_kernels_match_plain_loops() {
    // 300 rows of 1000: above the parallel threshold, with rows that do not divide evenly
    // between threads.
    let (rows, n) = (300, 1000);
    let x = Tensor::randn(&[rows, n], TensorOptions::new().dtype(DType::F32).seed(11)).unwrap();
    let xv = x.to_vec::<f32>().unwrap();
    let sums = x.sum_dim(-1, false).unwrap().to_vec::<f32>().unwrap();
    let sm = x.softmax(-1).unwrap().to_vec::<f32>().unwrap();
    let ln = x.layer_norm(&[n], None, None, 1e-5).unwrap().to_vec::<f32>().unwrap();
    let total = x.sum().unwrap().item::<f32>().unwrap();
    let mut want_total = 0f64;
    for r in 0..rows {
        let row = &xv[r * n..(r + 1) * n];
        let s: f64 = row.iter().map(|&v| f64::from(v)).sum();
        want_total += s;
        assert!((f64::from(sums[r]) - s).abs() < 1e-3, "row {r}: {} vs {s}", sums[r]);
        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let z: f64 = row.iter().map(|&v| f64::from(v - m).exp()).sum();
        for (k, &v) in row.iter().enumerate() {
            let want = (f64::from(v - m).exp() / z) as f32;
            assert!((sm[r * n + k] - want).abs() < 1e-6, "softmax ({r}, {k})");
        }
        let lr = &ln[r * n..(r + 1) * n];
        let mean: f32 = lr.iter().sum::<f32>() / n as f32;
        assert!(mean.abs() < 1e-4, "layer_norm row {r} mean {mean}");
    }
    assert!((f64::from(total) - want_total).abs() < 0.05, "{total} vs {want_total}");
}

#[test]
fn embedding_split_across_threads_copies_every_row() {
    // 1,500 lookups of 257-element f32 rows (1.5 MB out: split between kernel threads, at
    // boundaries that are no multiple of a row), of a strided view of the table, and in f16.
    set_num_threads(2);
    let (vocab, dim, n) = (3000usize, 257usize, 1500usize);
    // Values f16 holds exactly.
    let table: Vec<f32> = (0..vocab * 2 * dim).map(|i| (i % 2039) as f32).collect();
    // Every other row of a [2 * vocab, dim] table: a row stride of 2 * dim.
    let wide = t32(&table, &[2 * vocab, dim]);
    let view = wide.slice(0, 0, (2 * vocab) as isize, 2).unwrap();
    let ids: Vec<i64> = (0..n as i64).map(|i| i * 7919 % vocab as i64).collect();
    let idx = i64s(&ids, &[n]);
    for (what, weight) in [("contiguous", view.contiguous().unwrap()), ("strided", view.clone())] {
        let got = weight.embedding(&idx).unwrap();
        assert_eq!(got.sizes(), [n, dim]);
        let got = got.to_vec::<f32>().unwrap();
        for (r, &i) in ids.iter().enumerate() {
            let want = &table[2 * i as usize * dim..(2 * i as usize + 1) * dim];
            assert_eq!(&got[r * dim..(r + 1) * dim], want, "{what}: row {r} (id {i})");
        }
        let halves = weight.to_dtype(DType::F16).unwrap().embedding(&idx).unwrap();
        assert_eq!(halves.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(), got, "{what}: f16");
    }
}

#[test]
fn elementary_functions_split_across_threads_give_every_element() {
    // vmath's functions split across kernel threads from 16384 elements (a quarter of the
    // grain of other ops): sizes at and around that, and odd ones, at 2 threads, against the
    // same function on pieces of 1000 elements (each on one thread), to the bit.
    set_num_threads(2);
    type Unary = fn(&Tensor) -> tensormem_tensor::Result<Tensor>;
    let functions: [(&str, Unary); 7] = [
        ("gelu", Tensor::gelu),
        ("gelu_tanh", Tensor::gelu_tanh),
        ("silu", Tensor::silu),
        ("sigmoid", Tensor::sigmoid),
        ("tanh", Tensor::tanh),
        ("exp", Tensor::exp),
        ("log", Tensor::log),
    ];
    for n in [16_383usize, 16_384, 40_001, 49_152, 65_537] {
        // Values over [-12, 12] in a scattered order; `log` gets their magnitudes.
        let v: Vec<f32> = (0..n).map(|i| (i * 7919 % 10_007) as f32 / 10_007.0 * 24.0 - 12.0).collect();
        for (name, f) in functions {
            let x = if name == "log" { t32(&v, &[n]).abs().unwrap() } else { t32(&v, &[n]) };
            let whole = f(&x).unwrap().to_vec::<f32>().unwrap();
            let mut pieces = Vec::with_capacity(n);
            for start in (0..n).step_by(1000) {
                let piece = x.narrow(0, start as isize, 1000.min(n - start)).unwrap();
                pieces.extend(f(&piece).unwrap().to_vec::<f32>().unwrap());
            }
            assert_eq!(whole.len(), n);
            for (i, (a, b)) in whole.iter().zip(&pieces).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{name} of {n} elements, element {i}: {a} vs {b}");
            }
        }
    }
}
