//! Tensors: storage life cycle, lazy allocation, mapped files, dtypes, views, kernels, display.

use std::sync::Arc;

use half::{bf16, f16};
use tensormem::{Allocator, AllocatorRegistry, SystemAllocator, TrackingAllocator};
use tensormem_tensor::{DType, Tensor, TensorError, TensorOptions, dequantize, quantize};

fn tracker() -> Arc<TrackingAllocator> {
    Arc::new(TrackingAllocator::new(Arc::new(SystemAllocator::new())))
}

fn arange(n: usize, dtype: DType) -> Tensor {
    Tensor::arange(0.0, n as f64, 1.0, dtype).unwrap()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

#[test]
fn seed_example_frees_everything_and_keeps_one_output_buffer() {
    let tr = tracker();
    let opts = TensorOptions::new().allocator(tr.clone()).seed(42);
    let (x, y) = (Tensor::rand(&[3, 4], &opts).unwrap(), Tensor::rand(&[3, 4], opts.clone().seed(43)).unwrap());
    let (xv, yv) = (f32s(&x), f32s(&y));
    drop((x, y));
    assert_eq!(tr.sizes().live_bytes, 0);

    let res = Tensor::rand(&[3, 4], &opts)
        .unwrap()
        .select(0, 0)
        .unwrap()
        .add(&Tensor::rand(&[3, 4], opts.clone().seed(43)).unwrap())
        .unwrap();
    let live = tr.live_chunks();
    assert_eq!(live.len(), 1, "only the output buffer is live: {live:?}");
    assert_eq!(live[0].requested_size, 3 * 4 * 4);
    assert_eq!(res.sizes(), [3, 4]);
    let got = f32s(&res);
    for i in 0..3 {
        for j in 0..4 {
            assert_eq!(got[i * 4 + j], xv[j] + yv[i * 4 + j]);
        }
    }
    drop(res);
    assert_eq!(tr.sizes().live_bytes, 0);
    assert!(tr.live_chunks().is_empty());
}

#[test]
fn storage_is_shared_by_views_and_returned_once() {
    let tr = tracker();
    let t = Tensor::ones(&[4, 4], TensorOptions::new().allocator(tr.clone())).unwrap();
    let views = [t.t().unwrap(), t.select(0, 1).unwrap(), t.narrow(1, 1, 2).unwrap(), t.clone()];
    assert!(views.iter().all(|v| v.shares_storage(&t)));
    assert_eq!(t.storage().ref_count(), 5);
    assert_eq!(t.storage().nbytes(), 64);
    assert_eq!(t.storage().allocator_name(), "cpu");
    drop(t);
    assert_eq!(tr.sizes().live_bytes, 64, "the views keep the storage alive");
    drop(views);
    assert_eq!(tr.sizes().live_bytes, 0);
    assert_eq!(tr.sizes().total_bytes, 64, "allocated once");
}

#[test]
fn lazy_storage_allocates_on_first_write_and_reads_zeros() {
    let tr = tracker();
    let t = Tensor::empty(&[256, 256], TensorOptions::new().allocator(tr.clone())).unwrap();
    let v = t.narrow(0, 10, 2).unwrap();
    assert!(!t.storage().is_materialized());
    assert_eq!(tr.sizes().live_bytes, 0);
    v.set(&[1, 3], 7.5f32).unwrap();
    assert!(t.storage().is_materialized());
    assert_eq!(tr.sizes().live_bytes, 256 * 256 * 4);
    assert_eq!(t.get::<f32>(&[11, 3]).unwrap(), 7.5);
    assert_eq!(t.sum().unwrap().item::<f32>().unwrap(), 7.5);

    let z = Tensor::zeros(&[8], TensorOptions::new().allocator(tr.clone())).unwrap();
    z.materialize().unwrap();
    assert_eq!(f32s(&z), [0.0; 8]);
}

#[test]
fn mapped_file_tensors_are_read_only_views_of_the_file() {
    let dir = std::env::temp_dir().join(format!("tensormem-mmap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("weights.bin");
    let mut bytes = vec![0xAAu8; 16]; // a header to skip
    for i in 0..12 {
        bytes.extend_from_slice(&(i as f32).to_le_bytes());
    }
    std::fs::write(&path, &bytes).unwrap();
    // SAFETY: the test owns the file and does not change it while mapped.
    let w = unsafe { Tensor::from_file(&path, 16, DType::F32, &[3, 4]) }.unwrap();
    assert_eq!(w.storage().allocator_name(), "mmap");
    assert_eq!(w.storage().mapped_file().unwrap().1, 16);
    assert_eq!(f32s(&w.select(1, 2).unwrap()), [2.0, 6.0, 10.0]);
    let err = w.add_(&Tensor::ones(&[4], DType::F32).unwrap()).unwrap_err();
    assert!(matches!(err, TensorError::ReadOnly { op: "add_", .. }), "{err}");
    assert!(w.set(&[0, 0], 1.0f32).is_err());
    let sum = w.add(&w).unwrap();
    assert_eq!(sum.storage().allocator_name(), AllocatorRegistry::global().get().name());
    assert_eq!(f32s(&sum)[11], 22.0);
    // SAFETY: as above.
    let err = unsafe { Tensor::from_file(&path, 20, DType::F32, &[3, 4]) }.unwrap_err();
    assert!(matches!(err, TensorError::FileRange { offset: 20, len: 48, file_len: 64, .. }), "{err}");
    assert!(err.to_string().contains("do not fit in the file (64 bytes)"), "{err}");
    // SAFETY: as above.
    let err = unsafe { Tensor::from_file(&path, 2, DType::F32, &[2]) }.unwrap_err();
    assert!(err.to_string().contains("not a multiple of the element size"), "{err}");
    // SAFETY: as above; the header bytes are 0xAA, not valid bools.
    let err = unsafe { Tensor::from_file(&path, 0, DType::Bool, &[4]) }.unwrap_err();
    assert!(err.to_string().contains("0 or 1"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn dtype_sizes_and_promotion_follow_pytorch() {
    use DType::*;
    assert_eq!(F16.size_of(3), Some(6));
    assert_eq!(Q8_0.size_of(96), Some(3 * 34));
    assert_eq!(Q4_0.size_of(64), Some(2 * 18));
    assert_eq!(Q8_0.size_of(31), None);
    let cases = [
        (Bool, I8, I8),
        (U8, I8, I16),
        (U8, I32, I32),
        (I64, F16, F16),
        (F16, BF16, F32),
        (BF16, F64, F64),
        (I32, I64, I64),
        (Bool, Bool, Bool),
    ];
    for (a, b, want) in cases {
        assert_eq!(DType::promote(a, b), Some(want), "{a} with {b}");
        assert_eq!(DType::promote(b, a), Some(want), "{b} with {a}");
    }
    assert_eq!(DType::promote(Q8_0, F32), None);
    // Zero-dimensional operands only win with a higher category.
    assert_eq!(DType::result_type(I32, false, F64, true), Some(F64));
    assert_eq!(DType::result_type(F16, false, F64, true), Some(F16));
    assert_eq!(DType::result_type(I8, false, I64, true), Some(I8));
    assert_eq!(DType::result_type(Bool, false, I32, true), Some(I32));
    let a = Tensor::ones(&[2], F16).unwrap();
    assert_eq!(a.add(&Tensor::scalar(2.0, F64).unwrap()).unwrap().dtype(), F16);
    let i = Tensor::ones(&[2], I32).unwrap();
    assert_eq!(i.div(&i).unwrap().dtype(), F32);
    assert_eq!(i.add(&Tensor::ones(&[2], U8).unwrap()).unwrap().dtype(), I32);
}

#[test]
fn quantisation_round_trips_within_half_a_step() {
    let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 64) as f32 - 32.0) / 8.0).collect();
    // Q8_0 rounds to the nearest of 255 steps; Q4_0's 16 levels are offset (the extreme maps
    // to -8 exactly, the opposite extreme clamps at 7), so its error reaches a whole step.
    for (dt, steps, bound) in [(DType::Q8_0, 127.0f32, 0.5f32), (DType::Q4_0, 8.0f32, 1.0f32)] {
        let q = quantize(dt, &x).unwrap();
        assert_eq!(q.len(), dt.size_of(64).unwrap());
        let back = dequantize(dt, &q).unwrap();
        for block in 0..2 {
            let r = &x[block * 32..block * 32 + 32];
            let amax = r.iter().fold(0f32, |m, v| m.max(v.abs()));
            let step = amax / steps;
            for i in 0..32 {
                let (a, b) = (x[block * 32 + i], back[block * 32 + i]);
                assert!((a - b).abs() <= step * bound + 1e-3 * amax, "{dt}: {a} vs {b} (step {step})");
            }
        }
        let t = Tensor::from_vec(x.clone(), &[2, 32], DType::F32).unwrap();
        let qt = t.to_dtype(dt).unwrap();
        assert_eq!(qt.dtype(), dt);
        assert_eq!(qt.storage().nbytes(), q.len());
        assert_eq!(f32s(&qt.to_dtype(DType::F32).unwrap()), back);
        // A row view of the quantised tensor dequantises the same row.
        assert_eq!(f32s(&qt.select(0, 1).unwrap().to_dtype(DType::F32).unwrap()), back[32..]);
    }
    assert!(quantize(DType::Q8_0, &x[..33]).is_err());
    assert!(quantize(DType::F32, &x).is_err());
}

#[test]
fn quantisation_matches_the_ggml_reference_bytes_and_keeps_them_in_range_for_tiny_blocks() {
    // Q8_0 of one block: d = amax / 127 as f16, q = round(x / d) away from zero (ggml's
    // quantize_row_q8_0_ref; checked bit for bit against gguf-py on random blocks).
    let x: Vec<f32> = (0..32).map(|i| (i as f32 - 15.5) * 0.25).collect();
    let q = quantize(DType::Q8_0, &x).unwrap();
    let d = 3.875f32 / 127.0;
    assert_eq!(q[..2], half::f16::from_f32(d).to_le_bytes());
    for (i, &b) in q[2..].iter().enumerate() {
        assert_eq!(b as i8, (x[i] * (1.0 / d)).round() as i8, "element {i}");
    }
    assert_eq!((q[2] as i8, q[33] as i8), (-127, 127));
    // Q4_0: d = -max / 8, max the first value of largest magnitude (-3.875 here); value j in
    // byte j's low nibble, j + 16 in its high nibble, offset by 8 and clamped to 15.
    let q4 = quantize(DType::Q4_0, &x).unwrap();
    assert_eq!(q4[..2], half::f16::from_f32(3.875 / 8.0).to_le_bytes());
    assert_eq!((q4[2] & 0x0f, q4[2] >> 4, q4[17] >> 4), (0, 8, 15));
    // A block of subnormal values: 1 / d overflows to infinity. Every byte stays a valid
    // quantised value of zero (the f16 scale is 0), not a saturated -128 / 127.
    for v in [1e-42f32, -3e-41, 7e-45] {
        let tiny: Vec<f32> = (0..32).map(|i| if i % 3 == 0 { v } else { -v / 2.0 }).collect();
        let q = quantize(DType::Q8_0, &tiny).unwrap();
        assert_eq!(q, vec![0u8; 34], "q8_0 of {v:e}");
        let q = quantize(DType::Q4_0, &tiny).unwrap();
        assert_eq!(half::f16::from_le_bytes([q[0], q[1]]).to_f32(), 0.0); // +0 or -0
        assert!(q[2..].iter().all(|&b| b == 0x88), "q4_0 of {v:e}: {q:?}");
        for dt in [DType::Q8_0, DType::Q4_0] {
            assert!(dequantize(dt, &quantize(dt, &tiny).unwrap()).unwrap().iter().all(|&y| y == 0.0));
        }
    }
}

#[test]
fn views_select_the_right_elements_without_copying() {
    let t = arange(24, DType::F32).view(&[2, 3, 4]).unwrap();
    let check = |v: &Tensor, want: &[f32]| {
        assert!(v.shares_storage(&t));
        assert_eq!(f32s(v), want);
    };
    check(&t.select(1, -1).unwrap(), &[8., 9., 10., 11., 20., 21., 22., 23.]);
    check(&t.narrow(2, 1, 2).unwrap().select(0, 0).unwrap(), &[1., 2., 5., 6., 9., 10.]);
    check(&t.slice(2, 0, 4, 3).unwrap().select(0, 1).unwrap(), &[12., 15., 16., 19., 20., 23.]);
    check(&t.transpose(0, 2).unwrap().select(0, 1).unwrap(), &[1., 13., 5., 17., 9., 21.]);
    check(
        &t.permute(&[2, 0, 1]).unwrap().select(1, 1).unwrap(),
        &[12., 16., 20., 13., 17., 21., 14., 18., 22., 15., 19., 23.],
    );
    check(
        &t.select(0, 0).unwrap().select(0, 0).unwrap().unsqueeze(0).unwrap().expand(&[2, -1]).unwrap(),
        &[0., 1., 2., 3., 0., 1., 2., 3.],
    );
    let e = t.narrow(1, 0, 1).unwrap();
    assert_eq!(e.sizes(), [2, 1, 4]);
    assert_eq!(e.squeeze().unwrap().sizes(), [2, 4]);
    assert_eq!(e.squeeze_dim(0).unwrap().sizes(), [2, 1, 4]);
    assert!(e.broadcast_to(&[3, 3, 5, 4]).unwrap_err().to_string().contains("cannot be broadcast"));
    assert_eq!(e.broadcast_to(&[3, 2, 1, 4]).unwrap().strides(), [0, 12, 4, 1]);
    assert_eq!(t.unsqueeze(-1).unwrap().sizes(), [2, 3, 4, 1]);
    check(&t.movedim(0, -1).unwrap().select(0, 1).unwrap().select(0, 2).unwrap(), &[6., 18.]);
    assert_eq!(t.movedim(2, 0).unwrap().sizes(), [4, 2, 3]);
    assert_eq!(t.unsqueeze(1).unwrap().strides(), [12, 12, 4, 1]);
    let v = t.view(&[6, -1]).unwrap();
    assert_eq!((v.sizes(), v.strides()), (&[6usize, 4][..], &[4usize, 1][..]));
    assert!(t.flatten().unwrap().shares_storage(&t));
    // A transposed tensor cannot be viewed flat, but reshape copies.
    let tt = t.transpose(1, 2).unwrap();
    assert!(tt.view(&[-1]).is_err());
    let r = tt.reshape(&[-1]).unwrap();
    assert!(!r.shares_storage(&t));
    assert_eq!(f32s(&r)[..6], [0., 4., 8., 1., 5., 9.]);
    // view of a narrowed tensor: merge the contiguous run only.
    let n = t.narrow(2, 0, 2).unwrap();
    assert_eq!(n.view(&[6, 2]).unwrap().strides(), [4, 1]);
    let chunks = t.chunk(2, 2).unwrap();
    assert_eq!(chunks.len(), 2);
    check(&chunks[1].select(0, 0).unwrap().select(0, 0).unwrap(), &[2., 3.]);
    let parts = t.split(2, 1).unwrap();
    assert_eq!(parts.iter().map(|p| p.sizes()[1]).collect::<Vec<_>>(), [2, 1]);
    assert_eq!(t.chunk(5, 1).unwrap().len(), 3);
    let s = t.as_strided(&[2, 2], &[1, 12], 3).unwrap();
    check(&s, &[3., 15., 4., 16.]);
    assert_eq!(
        t.t().unwrap_err().to_string(),
        "t: a tensor of shape [2, 3, 4]: t() expects at most 2 dimensions; use transpose(dim0, dim1)"
    );
    // contiguous() of a contiguous tensor is the same storage; of a view, a copy.
    assert!(t.contiguous().unwrap().shares_storage(&t));
    let p = t.permute(&[1, 0, 2]).unwrap();
    let copy = p.contiguous().unwrap();
    assert!(!copy.shares_storage(&t) && copy.is_contiguous());
    assert_eq!(f32s(&copy), f32s(&p));
}

#[test]
fn binary_kernels_compute_pytorch_values() {
    let a = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, f32::NAN], &[4], DType::F32).unwrap();
    let b = Tensor::from_vec(vec![2.0f32, 2.0, -1.0, 0.0], &[4], DType::F32).unwrap();
    assert_eq!(f32s(&a.add_scaled(&b, 0.5).unwrap())[..3], [2.0, -1.0, 2.5]);
    assert_eq!(f32s(&a.sub(&b).unwrap())[..3], [-1.0, -4.0, 4.0]);
    assert_eq!(f32s(&a.mul(&b).unwrap())[..3], [2.0, -4.0, -3.0]);
    assert_eq!(f32s(&a.div(&b).unwrap())[..3], [0.5, -1.0, -3.0]);
    let m = f32s(&a.maximum(&b).unwrap());
    assert_eq!(m[..3], [2.0, 2.0, 3.0]);
    assert!(m[3].is_nan());
    assert_eq!(f32s(&a.minimum(&b).unwrap())[..3], [1.0, -2.0, -1.0]);
    assert_eq!(f32s(&a.pow(&b).unwrap())[..3], [1.0, 4.0, 1.0 / 3.0]);
    let lt = a.lt(&b).unwrap();
    assert_eq!(lt.dtype(), DType::Bool);
    assert_eq!(lt.to_vec::<bool>().unwrap(), [true, true, false, false]);
    assert_eq!(a.ne(&a).unwrap().to_vec::<bool>().unwrap(), [false, false, false, true]);
    assert_eq!(a.ge(&b).unwrap().to_vec::<bool>().unwrap(), [false, false, true, false]);

    let i = Tensor::from_vec(vec![3i32, -7, 2, i32::MAX], &[4], DType::I32).unwrap();
    let j = Tensor::from_vec(vec![2i32, 2, -1, 1], &[4], DType::I32).unwrap();
    assert_eq!(i.pow(&j).unwrap().to_vec::<i32>().unwrap(), [9, 49, 0, i32::MAX]);
    assert_eq!(i.add(&j).unwrap().to_vec::<i32>().unwrap(), [5, -5, 1, i32::MIN], "integers wrap");
    assert_eq!(i.div(&j).unwrap().to_vec::<f32>().unwrap()[..3], [1.5, -3.5, -2.0]);
    assert_eq!(i.add_scaled(&j, 3.0).unwrap().to_vec::<i32>().unwrap()[..3], [9, -1, -1]);
    let t = Tensor::from_vec(vec![true, false], &[2], DType::Bool).unwrap();
    let f = Tensor::from_vec(vec![true, true], &[2], DType::Bool).unwrap();
    assert_eq!(t.add(&f).unwrap().to_vec::<bool>().unwrap(), [true, true]);
    assert_eq!(t.mul(&f).unwrap().to_vec::<bool>().unwrap(), [true, false]);
    // Mixed dtypes promote.
    let h = Tensor::from_vec(vec![f16::from_f32(1.5)], &[1], DType::F16).unwrap();
    let g = Tensor::from_vec(vec![bf16::from_f32(2.0)], &[1], DType::BF16).unwrap();
    let hg = h.add(&g).unwrap();
    assert_eq!((hg.dtype(), f32s(&hg)[0]), (DType::F32, 3.5));
    // Operators panic-free on good input.
    let s = &a + &b;
    assert_eq!(f32s(&s)[0], 3.0);
    assert_eq!(f32s(&(-&b))[..2], [-2.0, -2.0]);
    assert_eq!(f32s(&(a.clone() * b.clone()))[0], 2.0);
}

#[test]
#[should_panic(expected = "add: shapes [2] and [3] cannot be broadcast")]
fn operators_panic_with_the_method_message() {
    let _ = &Tensor::ones(&[2], DType::F32).unwrap() + &Tensor::ones(&[3], DType::F32).unwrap();
}

#[test]
fn unary_kernels_compute_pytorch_values() {
    let x = Tensor::from_vec(vec![-1.0f64, 0.0, 1.0, 2.0], &[4], DType::F64).unwrap();
    let close = |t: Tensor, want: [f64; 4]| {
        let got = t.to_vec::<f64>().unwrap();
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
        }
    };
    close(x.gelu().unwrap(), [-0.15865525393145707, 0.0, 0.8413447460685429, 1.9544997361036416]);
    close(x.sigmoid().unwrap(), [0.2689414213699951, 0.5, 0.7310585786300049, 0.8807970779778823]);
    close(x.tanh().unwrap(), [-0.7615941559557649, 0.0, 0.7615941559557649, 0.9640275800758169]);
    // PyTorch's `gelu(x, approximate='tanh')` and `silu(x)` in f64.
    close(x.gelu_tanh().unwrap(), [-0.15880800939172324, 0.0, 0.8411919906082768, 1.954597694087775]);
    close(x.silu().unwrap(), [-0.2689414213699951, 0.0, 0.7310585786300049, 1.7615941559557646]);
    let positive = Tensor::from_vec(vec![0.5f64, 1.0, 2.0, 10.0], &[4], DType::F64).unwrap();
    close(positive.log().unwrap(), [-std::f64::consts::LN_2, 0.0, std::f64::consts::LN_2, std::f64::consts::LN_10]);
    close(x.relu().unwrap(), [0.0, 0.0, 1.0, 2.0]);
    close(x.abs().unwrap(), [1.0, 0.0, 1.0, 2.0]);
    close(x.neg().unwrap(), [1.0, -0.0, -1.0, -2.0]);
    close(x.exp().unwrap(), [(-1f64).exp(), 1.0, 1f64.exp(), 2f64.exp()]);
    let s = x.abs().unwrap().sqrt().unwrap().to_vec::<f64>().unwrap();
    assert_eq!(s, [1.0, 0.0, 1.0, 2f64.sqrt()]);
    let l = x.log().unwrap().to_vec::<f64>().unwrap();
    assert!(l[0].is_nan() && l[1] == f64::NEG_INFINITY && l[2] == 0.0);
    // Integers become f32 for the floating-point functions; neg/abs/relu keep the dtype.
    let i = Tensor::from_vec(vec![-3i64, 4], &[2], DType::I64).unwrap();
    assert_eq!(i.exp().unwrap().dtype(), DType::F32);
    assert_eq!(i.relu().unwrap().to_vec::<i64>().unwrap(), [0, 4]);
    assert_eq!(i.abs().unwrap().to_vec::<i64>().unwrap(), [3, 4]);
}

#[test]
fn in_place_ops_write_through_views() {
    let t = arange(6, DType::F32).view(&[2, 3]).unwrap();
    let row = t.select(0, 1).unwrap();
    row.add_(&Tensor::full(&[3], 10.0, DType::F32).unwrap()).unwrap();
    assert_eq!(f32s(&t), [0., 1., 2., 13., 14., 15.]);
    t.add_(&t).unwrap(); // exact overlap is fine
    assert_eq!(f32s(&t), [0., 2., 4., 26., 28., 30.]);
    t.t().unwrap().mul_(&Tensor::from_vec(vec![1.0f32, -1.0], &[2], DType::F32).unwrap()).unwrap();
    assert_eq!(f32s(&t), [0., 2., 4., -26., -28., -30.]);
    t.relu_().unwrap();
    assert_eq!(f32s(&t), [0., 2., 4., 0., 0., 0.]);
    t.narrow(1, 0, 2).unwrap().copy_(&Tensor::from_vec(vec![7i32, 8], &[2], DType::I32).unwrap()).unwrap();
    assert_eq!(f32s(&t), [7., 8., 4., 7., 8., 0.]);
    let i = Tensor::ones(&[2], DType::I32).unwrap();
    assert!(i.add_(&Tensor::ones(&[2], DType::F32).unwrap()).is_err(), "float into int refused");
    assert!(i.exp_().is_err());
}

#[test]
fn max_and_min_of_long_rows_match_a_plain_loop_in_every_dtype() {
    // Rows of 117: seven times the kernel's 16 lanes and a remainder of 5. NaN anywhere in a
    // float row (the first lane, a middle one, the remainder) makes its maximum and minimum
    // NaN, as in PyTorch; the other rows keep theirs.
    let len = 16 * 7 + 5;
    let v: Vec<f32> = (0..3 * len).map(|i| (i * 7919 % 101) as f32 - 50.0).collect();
    let x32 = Tensor::from_vec(v, &[3, len], DType::F32).unwrap();
    for dt in [DType::F32, DType::F64, DType::BF16, DType::F16, DType::I8, DType::I16, DType::I32, DType::I64] {
        let x = x32.to_dtype(dt).unwrap();
        let rows: Vec<Vec<f64>> =
            x.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap().chunks(len).map(<[f64]>::to_vec).collect();
        let (max, min): (Vec<f64>, Vec<f64>) = rows
            .iter()
            .map(|r| (r.iter().copied().fold(f64::MIN, f64::max), r.iter().copied().fold(f64::MAX, f64::min)))
            .unzip();
        let got = |t: Tensor| t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        assert_eq!(got(x.max_dim(1, false).unwrap()), max, "{dt:?}");
        assert_eq!(got(x.min_dim(1, false).unwrap()), min, "{dt:?}");
        assert_eq!(got(x.max().unwrap()), [max.iter().copied().fold(f64::MIN, f64::max)], "{dt:?}");
        assert_eq!(got(x.min().unwrap()), [min.iter().copied().fold(f64::MAX, f64::min)], "{dt:?}");
        if !dt.is_floating_point() {
            continue;
        }
        for (row, col) in [(0, 0), (1, 40), (2, len - 1)] {
            let nan = Tensor::full(&[1], f64::NAN, DType::F32).unwrap().to_dtype(dt).unwrap();
            let y = Tensor::zeros_like(&x).unwrap();
            y.copy_(&x).unwrap();
            y.select(0, row as isize).unwrap().narrow(0, col as isize, 1).unwrap().copy_(&nan).unwrap();
            for m in [got(y.max_dim(1, false).unwrap()), got(y.min_dim(1, false).unwrap())] {
                for (r, &v) in m.iter().enumerate() {
                    assert_eq!(v.is_nan(), r == row, "{dt:?}, NaN at ({row}, {col}), row {r}: {v}");
                }
            }
            assert!(got(y.max().unwrap())[0].is_nan() && got(y.min().unwrap())[0].is_nan(), "{dt:?}");
        }
    }
}

#[test]
fn reductions_over_all_and_one_dimension() {
    let t = arange(12, DType::F32).view(&[3, 4]).unwrap();
    assert_eq!(t.sum().unwrap().item::<f32>().unwrap(), 66.0);
    assert_eq!(f32s(&t.sum_dim(0, false).unwrap()), [12., 15., 18., 21.]);
    let k = t.sum_dim(1, true).unwrap();
    assert_eq!((k.sizes(), f32s(&k)), (&[3usize, 1][..], vec![6., 22., 38.]));
    assert_eq!(f32s(&t.mean_dim(-1, false).unwrap()), [1.5, 5.5, 9.5]);
    assert_eq!(t.mean().unwrap().item::<f32>().unwrap(), 5.5);
    assert_eq!(f32s(&t.t().unwrap().max_dim(1, false).unwrap()), [8., 9., 10., 11.]);
    assert_eq!(f32s(&t.min_dim(0, false).unwrap()), [0., 1., 2., 3.]);
    assert_eq!(t.max().unwrap().item::<f32>().unwrap(), 11.0);
    let x = Tensor::from_vec(vec![1i32, 5, 5, -2, 9, 9], &[2, 3], DType::I32).unwrap();
    let s = x.sum().unwrap();
    assert_eq!((s.dtype(), s.item::<i64>().unwrap()), (DType::I64, 27));
    assert_eq!(x.argmax().unwrap().item::<i64>().unwrap(), 4);
    assert_eq!(x.argmax_dim(1, false).unwrap().to_vec::<i64>().unwrap(), [1, 1]);
    assert_eq!(x.argmax_dim(0, true).unwrap().sizes(), [1, 3]);
    let n = Tensor::from_vec(vec![1.0f32, f32::NAN, 3.0], &[3], DType::F32).unwrap();
    assert!(n.max().unwrap().item::<f32>().unwrap().is_nan());
    assert_eq!(n.argmax().unwrap().item::<i64>().unwrap(), 1);
    let b = Tensor::from_vec(vec![true, false, true], &[3], DType::Bool).unwrap();
    assert_eq!(b.sum().unwrap().item::<i64>().unwrap(), 2);
    let sm = t.softmax(1).unwrap();
    for r in 0..3 {
        let row = f32s(&sm.select(0, r).unwrap());
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!((row[3] / row[2] - 1f32.exp()).abs() < 1e-5);
    }
    let sm0 = t.softmax(0).unwrap();
    assert_eq!(sm0.sizes(), [3, 4]);
    assert!((f32s(&sm0.sum_dim(0, false).unwrap())[2] - 1.0).abs() < 1e-6);
}

#[test]
fn matmul_matches_a_naive_product_for_every_shape_rule() {
    let a = Tensor::randn(&[2, 3, 5], TensorOptions::new().seed(5)).unwrap();
    let b = Tensor::randn(&[5, 4], TensorOptions::new().seed(6)).unwrap();
    let c = a.matmul(&b).unwrap();
    assert_eq!(c.sizes(), [2, 3, 4]);
    let (av, bv, cv) = (f32s(&a), f32s(&b), f32s(&c));
    for bt in 0..2 {
        for i in 0..3 {
            for j in 0..4 {
                let want: f32 = (0..5).map(|p| av[bt * 15 + i * 5 + p] * bv[p * 4 + j]).sum();
                assert!((cv[bt * 12 + i * 4 + j] - want).abs() < 1e-4);
            }
        }
    }
    // Transposed operands are used in place.
    let bt = Tensor::randn(&[4, 5], TensorOptions::new().seed(6)).unwrap();
    let c2 = a.matmul(&bt.t().unwrap()).unwrap();
    let c3 = a.matmul(&bt.t().unwrap().contiguous().unwrap()).unwrap();
    for (x, y) in f32s(&c2).iter().zip(f32s(&c3)) {
        assert!((x - y).abs() < 1e-5);
    }
    let v = Tensor::ones(&[5], DType::F32).unwrap();
    assert_eq!(a.matmul(&v).unwrap().sizes(), [2, 3]);
    assert_eq!(v.matmul(&b).unwrap().sizes(), [4]);
    assert_eq!(v.matmul(&v).unwrap().item::<f32>().unwrap(), 5.0);
    let i = Tensor::from_vec(vec![1i64, 2, 3, 4], &[2, 2], DType::I64).unwrap();
    assert_eq!(i.matmul(&i).unwrap().to_vec::<i64>().unwrap(), [7, 10, 15, 22]);
    let h = i.to_dtype(DType::F16).unwrap();
    assert_eq!(h.matmul(&h).unwrap().to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(), [7, 10, 15, 22]);
    let bf = i.to_dtype(DType::BF16).unwrap().matmul(&i.to_dtype(DType::BF16).unwrap()).unwrap();
    assert_eq!(bf.dtype(), DType::BF16);
    let d = i.to_dtype(DType::F64).unwrap();
    assert_eq!(d.matmul(&d.unsqueeze(0).unwrap().expand(&[3, 2, 2]).unwrap()).unwrap().sizes(), [3, 2, 2]);
}

#[test]
fn display_prints_like_pytorch() {
    let t = arange(6, DType::F32).view(&[2, 3]).unwrap();
    assert_eq!(t.to_string(), "tensor([[0., 1., 2.],\n        [3., 4., 5.]])");
    let r = Tensor::from_vec(vec![0.3091f32, 0.5503, -1.25], &[3], DType::F32).unwrap();
    assert_eq!(r.to_string(), "tensor([ 0.3091,  0.5503, -1.2500])");
    let sci = Tensor::from_vec(vec![1e-5f64, 1.0, 1e9], &[3], DType::F64).unwrap();
    assert_eq!(sci.to_string(), "tensor([1.0000e-05, 1.0000e+00, 1.0000e+09], dtype=f64)");
    let i = Tensor::from_vec(vec![1i64, -20, 300], &[3], DType::I64).unwrap();
    assert_eq!(i.to_string(), "tensor([  1, -20, 300])");
    let b = Tensor::from_vec(vec![true, false], &[2], DType::Bool).unwrap();
    assert_eq!(b.to_string(), "tensor([ True, False])");
    assert_eq!(Tensor::scalar(3.5, DType::F32).unwrap().to_string(), "tensor(3.5000)");
    assert_eq!(Tensor::zeros(&[0, 3], DType::I32).unwrap().to_string(), "tensor([], size=(0, 3), dtype=i32)");
    let three = arange(8, DType::I64).view(&[2, 2, 2]).unwrap();
    assert_eq!(three.to_string(), "tensor([[[0, 1],\n         [2, 3]],\n\n        [[4, 5],\n         [6, 7]]])");
    let big = arange(2000, DType::I64);
    assert_eq!(big.to_string(), "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
}

#[test]
fn threaded_results_match_the_single_threaded_path() {
    let n = 1 << 20;
    let x = Tensor::arange(0.0, n as f64, 1.0, DType::I64).unwrap().view(&[1024, 1024]).unwrap();
    let y = Tensor::rand(&[1024, 1024], TensorOptions::new().seed(9)).unwrap();
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            (
                x.mul(&x.t().unwrap()).unwrap().to_vec::<i64>().unwrap(),
                x.sum_dim(1, false).unwrap().to_vec::<i64>().unwrap(),
                y.sum().unwrap().item::<f32>().unwrap(),
                y.t().unwrap().contiguous().unwrap().to_vec::<f32>().unwrap(),
            )
        })
    };
    let (one, two) = (run(1), run(2));
    assert_eq!(one.0, two.0);
    assert_eq!(one.1, two.1);
    assert!((one.2 - two.2).abs() / one.2 < 1e-6, "{} vs {}", one.2, two.2);
    assert_eq!(one.3, two.3);
    assert_eq!(one.3[1], y.get::<f32>(&[1, 0]).unwrap());
}

#[test]
fn views_on_other_threads_see_in_place_writes_whole() {
    let t = Tensor::zeros(&[64, 1024], DType::I32).unwrap();
    let ones = Tensor::ones(&[1024], DType::I32).unwrap();
    std::thread::scope(|s| {
        let w = t.clone();
        s.spawn(move || {
            for _ in 0..50 {
                w.add_(&ones).unwrap();
            }
        });
        for _ in 0..50 {
            let v = t.to_vec::<i32>().unwrap();
            // A read never sees a half-applied add_: every element has the same count.
            assert!(v.iter().all(|&x| x == v[0]), "torn read");
        }
    });
    assert_eq!(t.sum().unwrap().item::<i64>().unwrap(), 50 * 64 * 1024);
}

#[test]
fn mapped_weights_are_accounted_where_users_look() {
    let path = std::env::temp_dir().join(format!("tensormem-mapped-{}.bin", std::process::id()));
    std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
    // SAFETY: the file is ours and not changed while mapped.
    let w = unsafe { Tensor::from_file(&path, 0, DType::F32, &[256, 1024]) }.unwrap();
    let mapped = tensormem::telemetry::mapped_memory();
    let file = mapped.files.iter().find(|f| f.path == path).expect("the mapping is listed");
    assert_eq!((file.bytes, file.mappings), (1 << 20, 1));
    assert!(mapped.bytes >= 1 << 20 && mapped.peak_bytes >= mapped.bytes);
    let snap = tensormem::telemetry::snapshot();
    assert!(snap.mapped.files.iter().any(|f| f.path == path && f.bytes == 1 << 20));
    let stats = tensormem::telemetry::mapped_stats().unwrap();
    assert!(stats.bytes_in_use >= 1 << 20 && stats.num_allocs >= 1);
    // tensormem's prometheus feature is on in this crate's tests (its dev-dependency).
    {
        let text = tensormem::telemetry::AllocatorCollector::global().render();
        let line =
            text.lines().find(|l| l.starts_with("tensormem_allocator_in_use_bytes{allocator=\"mmap\"}")).unwrap();
        let bytes: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(bytes >= (1 << 20) as f64, "{line}");
    }
    let view = w.select(0, 3).unwrap();
    drop(w);
    assert!(tensormem::telemetry::mapped_memory().files.iter().any(|f| f.path == path), "a view keeps it mapped");
    drop(view);
    assert!(!tensormem::telemetry::mapped_memory().files.iter().any(|f| f.path == path), "unlisted once unmapped");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn kernels_in_rayon_jobs_on_one_storage_never_deadlock() {
    // Eight jobs on rayon's pool mixing in-place and out-of-place adds on one 512x512 tensor,
    // while another thread runs large kernels on it too (which split across the kernel pool).
    // Before the fix this hung every time; the whole scenario runs on a thread so that a hang
    // fails the test instead of stalling it.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let x = Tensor::rand(&[512, 512], TensorOptions::new().seed(3)).unwrap();
        let y = Tensor::rand(&[512, 512], TensorOptions::new().seed(4)).unwrap();
        for _ in 0..20 {
            for j in 0..8 {
                let (x, y, done) = (x.clone(), y.clone(), done_tx.clone());
                rayon::spawn(move || {
                    if j % 2 == 0 {
                        x.add_(&y).unwrap();
                    } else {
                        assert_eq!(x.add(&y).unwrap().sizes(), [512, 512]);
                    }
                    done.send(()).unwrap();
                });
            }
            let z = x.mul(&y).unwrap();
            x.sub_(&z.mul(&y).unwrap().sum().unwrap()).unwrap();
            done_tx.send(()).unwrap();
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    for finished in 0..(20 * 9) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if let Err(e) = done_rx.recv_timeout(left) {
            panic!("only {finished} of 180 kernels finished: deadlock ({e})");
        }
    }
}

#[test]
fn to_allocator_copies_into_the_given_allocator() {
    let tracked = Arc::new(TrackingAllocator::new(Arc::new(SystemAllocator::new())));
    let dst: Arc<dyn Allocator> = tracked.clone();
    // A strided view: gathered, contiguous, values equal, its own storage in `dst`.
    let x = Tensor::arange(0.0, 24.0, 1.0, DType::F32).unwrap().view(&[2, 3, 4]).unwrap().permute(&[2, 0, 1]).unwrap();
    let y = x.to_allocator(&dst).unwrap();
    assert!(y.is_contiguous() && !y.shares_storage(&x));
    assert_eq!((y.sizes(), y.dtype()), (x.sizes(), DType::F32));
    assert_eq!(y.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
    assert_eq!(tracked.stats().unwrap().bytes_in_use, 24 * 4);
    // Writes to the copy do not reach the original.
    y.set(&[0, 0, 0], -1.0f32).unwrap();
    assert_eq!(x.get::<f32>(&[0, 0, 0]).unwrap(), 0.0);
    // Quantised blocks, a lazy zero tensor and an empty one.
    let q = Tensor::arange(0.0, 64.0, 1.0, DType::F32).unwrap().view(&[2, 32]).unwrap().to_dtype(DType::Q8_0).unwrap();
    let q2 = q.select(0, 1).unwrap().to_allocator(&dst).unwrap();
    assert_eq!(q2.dtype(), DType::Q8_0);
    assert_eq!(
        q2.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
        q.select(0, 1).unwrap().to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
    );
    let lazy = Tensor::zeros(&[5], DType::I64).unwrap();
    let z = lazy.to_allocator(&dst).unwrap();
    assert_eq!(z.to_vec::<i64>().unwrap(), [0; 5]);
    assert!(!lazy.storage().is_materialized(), "copying lazy zeros allocates nothing for the source");
    let e = Tensor::zeros(&[0, 3], DType::F32).unwrap().to_allocator(&dst).unwrap();
    assert_eq!((e.sizes(), e.numel()), (&[0, 3][..], 0));
    drop((y, q2, z, e));
    assert_eq!(tracked.stats().unwrap().bytes_in_use, 0);
}

#[test]
fn a_safetensors_header_naming_a_tensor_twice_is_refused() {
    let header = br#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}"#;
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header);
    file.extend_from_slice(&1.0f32.to_le_bytes());
    let path = std::env::temp_dir().join(format!("tm-dup-{}.safetensors", std::process::id()));
    std::fs::write(&path, &file).unwrap();
    // SAFETY: nothing modifies the file while it is open.
    let err = unsafe { tensormem_tensor::SafeTensors::open(&path) }.unwrap_err();
    let load = Tensor::load_safetensors(&path, "w", TensorOptions::new());
    std::fs::remove_file(&path).unwrap();
    assert!(err.to_string().contains("the header names tensor \"w\" twice"), "{err}");
    assert!(load.is_err(), "loading by name read one of the two entries");
}

#[test]
fn a_tensor_of_two_hundred_thousand_dimensions_prints_without_exhausting_the_stack() {
    let shape = vec![1usize; 200_000];
    let t = Tensor::from_slice(&[2.5f32], &shape, DType::F32).unwrap();
    let shown = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || t.to_string())
        .unwrap()
        .join()
        .expect("printing overflowed the stack");
    assert!(
        shown.starts_with("tensor(<200000-dimensional tensor of shape [1, 1, 1, 1, ..., 1] (1 elements), dtype f32")
    );
    // Up to 64 dimensions print nested as before.
    let t = Tensor::from_slice(&[2.5f32], &[1; 64], DType::F32).unwrap();
    assert_eq!(t.to_string(), format!("tensor({}2.5000{})", "[".repeat(64), "]".repeat(64)));
}
