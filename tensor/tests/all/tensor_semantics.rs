//! PyTorch's semantics where they are easy to get wrong: overlap, in-place promotion, mixed dtypes, zero-size tensors, printing, 0-d sizes,
//! checked arithmetic on sizes, strides and offsets.

use std::sync::Arc;
use std::time::{Duration, Instant};

use half::{bf16, f16};
use tensormem::{SystemAllocator, TrackingAllocator};
use tensormem_tensor::{DType, Scalar, Tensor, TensorError, TensorOptions};

fn arange(n: usize) -> Tensor {
    Tensor::arange(0.0, n as f64, 1.0, DType::F32).unwrap()
}

#[test]
fn in_place_ops_on_views_that_share_no_element_are_accepted() {
    // b[0::2] += b[1::2]
    let b = arange(8);
    b.slice(0, 0, 8, 2).unwrap().add_(&b.slice(0, 1, 8, 2).unwrap()).unwrap();
    assert_eq!(b.to_vec::<f32>().unwrap(), [1., 1., 5., 3., 9., 5., 13., 7.]);
    // The rotary pattern: a[:, :2] -= a[:, 2:]
    let a = arange(8).view(&[2, 4]).unwrap();
    a.narrow(1, 0, 2).unwrap().sub_(&a.narrow(1, 2, 2).unwrap()).unwrap();
    assert_eq!(a.to_vec::<f32>().unwrap(), [-2., -2., 2., 3., -2., -2., 6., 7.]);
    // A layout whose elements are all distinct though not "sorted" ([3,3] strides [2,3]).
    let s = Tensor::full(&[11], -1.0, DType::F32).unwrap();
    let odd = s.as_strided(&[3, 3], &[2, 3], 0).unwrap();
    odd.relu_().unwrap();
    assert_eq!(odd.to_vec::<f32>().unwrap(), [0.0; 9]);
    assert_eq!(s.get::<f32>(&[1]).unwrap(), -1.0, "element 1 is not in the view");
    // Dense views that partially overlap are still refused, as PyTorch does.
    let c = arange(6);
    let e = c.narrow(0, 1, 5).unwrap().add_(&c.narrow(0, 0, 5).unwrap()).unwrap_err();
    assert!(matches!(e, TensorError::PartialOverlap { .. }), "{e}");
}

#[test]
fn in_place_ops_compute_in_the_promoted_type_and_round_once() {
    let h = Tensor::from_vec(vec![f16::from_f32(2048.0)], &[1], DType::F16).unwrap();
    h.add_(&Tensor::from_vec(vec![1.0004f32], &[1], DType::F32).unwrap()).unwrap();
    assert_eq!(h.to_vec::<f16>().unwrap()[0].to_f32(), 2050.0, "PyTorch gives 2050");
    let b = Tensor::from_vec(vec![bf16::from_f32(2048.0)], &[1], DType::BF16).unwrap();
    b.add_(&Tensor::from_vec(vec![8.01f32], &[1], DType::F32).unwrap()).unwrap();
    assert_eq!(b.to_vec::<bf16>().unwrap()[0].to_f32(), 2064.0, "PyTorch gives 2064");
    // The same through out=: an f16 output of an f32 computation.
    let out = Tensor::zeros(&[1], DType::F16).unwrap();
    Tensor::from_vec(vec![2048.0f32], &[1], DType::F32)
        .unwrap()
        .add_out(&Tensor::from_vec(vec![1.0004f32], &[1], DType::F32).unwrap(), &out)
        .unwrap();
    assert_eq!(out.to_vec::<f16>().unwrap()[0].to_f32(), 2050.0);
}

#[test]
fn mixed_dtype_operands_are_converted_inside_the_loop_not_copied() {
    let tracker = Arc::new(TrackingAllocator::new(Arc::new(SystemAllocator::new())));
    let opts = TensorOptions::new().allocator(tracker.clone());
    let a = Tensor::from_vec((0..1000).collect::<Vec<i32>>(), &[1000], opts.clone()).unwrap();
    let b = Tensor::full(&[1000], 0.5, opts.clone().dtype(DType::F32)).unwrap();
    let before = tracker.sizes().total_bytes;
    let c = a.add(&b).unwrap();
    assert_eq!(c.dtype(), DType::F32);
    assert_eq!(c.get::<f32>(&[999]).unwrap(), 999.5);
    assert_eq!(tracker.sizes().total_bytes - before, 4000, "only the output was allocated, no converted copy of `a`");
    let before = tracker.sizes().total_bytes;
    b.add_(&a).unwrap();
    assert_eq!(tracker.sizes().total_bytes, before, "an in-place op with a mixed-dtype operand allocates nothing");
    assert_eq!(b.get::<f32>(&[10]).unwrap(), 10.5);

    // f16 + f32 computes in f32, in blocks of 128 (7 and a tail of 104): the f16 operand
    // converted into a buffer, the f32 operand and an f32 output read and written where they
    // lie. Into a fresh tensor, an existing one, the f32 operand itself, and a strided view.
    let h: Vec<f16> = (0..1000).map(|i| f16::from_f32(i as f32 * 0.25)).collect();
    let h = Tensor::from_vec(h, &[1000], DType::F16).unwrap();
    let w = || Tensor::from_vec((0..1000).map(|i| 1000.0 - i as f32).collect::<Vec<f32>>(), &[1000], DType::F32);
    let want: Vec<f32> = (0..1000).map(|i| i as f32 * 0.25 + 1000.0 - i as f32).collect();
    let w1 = w().unwrap();
    assert_eq!(h.add(&w1).unwrap().to_vec::<f32>().unwrap(), want, "fresh output");
    let out = Tensor::zeros(&[1000], DType::F32).unwrap();
    h.add_out(&w1, &out).unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), want, "existing output");
    let w2 = w().unwrap();
    h.add_out(&w2, &w2).unwrap();
    assert_eq!(w2.to_vec::<f32>().unwrap(), want, "the f32 operand as the output");
    let wide = Tensor::full(&[2000], -1.0, DType::F32).unwrap();
    h.add_out(&w1, &wide.slice(0, 1, 2000, 2).unwrap()).unwrap();
    let got = wide.to_vec::<f32>().unwrap();
    let odd: Vec<f32> = got.iter().skip(1).step_by(2).copied().collect();
    assert_eq!(odd, want, "a strided output");
    assert!(got.iter().step_by(2).all(|&v| v == -1.0), "a strided output: nothing else written");
    let back = w().unwrap();
    back.sub_(&h).unwrap();
    let diff: Vec<f32> = (0..1000).map(|i| 1000.0 - i as f32 - i as f32 * 0.25).collect();
    assert_eq!(back.to_vec::<f32>().unwrap(), diff, "f32 in place minus f16");
}

#[test]
fn zero_size_tensors_chunk_and_view_as_pytorch_does() {
    let e = Tensor::empty(&[0], DType::F32).unwrap();
    let pieces = e.chunk(3, 0).unwrap();
    assert_eq!(pieces.len(), 3, "torch.empty(0).chunk(3) gives three empty tensors");
    assert!(pieces.iter().all(|p| p.sizes() == [0]));
    let t = Tensor::zeros(&[0, 3], DType::F32).unwrap().t().unwrap();
    let v = t.view(&[3, 0]).unwrap();
    assert_eq!(v.strides(), t.strides(), "an empty tensor viewed as its own shape keeps its strides");
}

#[test]
fn printing_matches_pytorch() {
    let t = Tensor::from_vec(vec![1.0f32, f32::INFINITY], &[2], DType::F32).unwrap();
    assert_eq!(t.to_string(), "tensor([1., inf])");
    let z = Tensor::from_vec(vec![0.0f32, 1.5, f32::NAN], &[3], DType::F32).unwrap();
    assert_eq!(z.to_string(), "tensor([0.0000, 1.5000,    nan])");
    assert_eq!(Tensor::zeros(&[0], DType::I32).unwrap().to_string(), "tensor([], dtype=i32)");
    assert_eq!(Tensor::zeros(&[0], DType::I64).unwrap().to_string(), "tensor([], dtype=i64)");
    assert_eq!(Tensor::zeros(&[0], DType::Bool).unwrap().to_string(), "tensor([], dtype=bool)");
    assert_eq!(Tensor::zeros(&[0], DType::F32).unwrap().to_string(), "tensor([])");
    assert_eq!(Tensor::zeros(&[2], DType::I64).unwrap().to_string(), "tensor([0, 0])");
}

#[test]
fn a_zero_dim_tensor_has_no_size_0_and_quantised_views_keep_a_dimension() {
    let s = Tensor::scalar(3.0, DType::F32).unwrap();
    assert!(matches!(s.size(0), Err(TensorError::DimOutOfRange { .. })));
    assert!(matches!(s.size(-1), Err(TensorError::DimOutOfRange { .. })));
    let q = Tensor::randn(&[32], DType::F32).unwrap().to_dtype(DType::Q8_0).unwrap();
    let e = q.select(0, 0).unwrap_err();
    assert!(e.to_string().contains("needs at least one dimension"), "{e}");
}

#[test]
fn sizes_strides_and_offsets_are_checked_everywhere() {
    let four = arange(4);
    // An empty view far past the end of its storage.
    assert!(matches!(four.as_strided(&[0], &[1], 1 << 40), Err(TensorError::OutOfStorage { .. })));
    // Element counts that overflow usize.
    let scalar = Tensor::scalar(1.0, DType::F32).unwrap();
    assert!(matches!(scalar.broadcast_to(&[3, 0xAAAA_AAAA_AAAA_AAAB]), Err(TensorError::SizeOverflow { .. })));
    assert!(matches!(scalar.expand(&[3, 0x5555_5555_5555_5556, 2]), Err(TensorError::SizeOverflow { .. })));
    // Slicing with extreme steps and bounds.
    let taken = four.slice(0, 0, 2, usize::MAX).unwrap();
    assert_eq!(taken.to_vec::<f32>().unwrap(), [0.0]);
    // Bounds are clamped, as Python and PyTorch clamp them: the extremes take everything.
    assert_eq!(four.slice(0, isize::MIN, isize::MAX, 1).unwrap().to_vec::<f32>().unwrap(), [0.0, 1.0, 2.0, 3.0]);
    // Indexing into an empty tensor with huge dimensions.
    let huge_empty = Tensor::empty(&[isize::MAX as usize, 0, 5, 2], DType::F32).unwrap();
    assert!(matches!(huge_empty.get::<f32>(&[isize::MAX - 1, 0, 0, 0]), Err(TensorError::IndexOutOfRange { .. })));
    assert!(Tensor::zeros(&[0, isize::MAX as usize, 1, 5], DType::F32).unwrap().is_contiguous());
    assert_eq!(Tensor::ones(&[0, usize::MAX, 0], DType::F32).unwrap().neg().unwrap().numel(), 0);
}

#[test]
fn views_of_empty_tensors_with_huge_dimensions_compute_their_offsets_checked() {
    // Found by torchdiff's huge cases, run against a debug build: each of these overflowed.
    let e = Tensor::zeros(&[1 << 62, 0, 1 << 62, 1 << 40], DType::F64).unwrap();
    let e = e.as_strided(&[1 << 62, 0, 1 << 62, 1 << 40], &[2, 2, 0, 1], 0).unwrap();
    // The second chunk starts 2^62 elements in: 2^65 bytes.
    assert!(matches!(e.chunk(2, 0), Err(TensorError::SizeOverflow { op: "chunk", .. })));
    assert!(matches!(e.narrow(0, 1 << 61, 1), Err(TensorError::SizeOverflow { .. })));
    assert!(matches!(e.select(0, (1 << 62) - 1), Err(TensorError::SizeOverflow { .. })));
    assert!(matches!(e.narrow(0, isize::MIN, 1), Err(TensorError::RangeOutOfBounds { .. })));
    // Offsets that fit are kept, as PyTorch keeps them, though the view starts past its storage.
    let small = Tensor::zeros(&[4, 0], DType::F32).unwrap();
    let past = small.narrow(0, 3, 1).unwrap();
    assert_eq!((past.sizes(), past.storage_offset()), (&[1, 0][..], 3));
    assert_eq!(past.to_vec::<f32>().unwrap(), Vec::<f32>::new());
    assert_eq!(past.add(&past).unwrap().numel(), 0);
    // cat of empty tensors copies nothing, whatever their other sizes.
    let q = Tensor::zeros(&[1 << 40, 1 << 32, 0, 1 << 31], DType::BF16).unwrap();
    assert_eq!(Tensor::cat(&[&q, &q], 0).unwrap().sizes(), [1 << 41, 1 << 32, 0, 1 << 31]);
    assert_eq!(Tensor::stack(&[&q, &q], 1).unwrap().sizes(), [1 << 40, 2, 1 << 32, 0, 1 << 31]);
    // unsqueeze's new stride is size * stride of the dimension it goes before: 2^40 * 2^40
    // here (a debug build panicked, stack at dimension 0 with it).
    let h = Tensor::zeros(&[1 << 40, 1 << 40, 0], DType::F32).unwrap();
    assert_eq!(h.strides(), [1 << 40, 1, 1]);
    let u = h.unsqueeze(0).unwrap();
    assert_eq!((u.sizes(), u.strides()[1..].to_vec()), (&[1, 1 << 40, 1 << 40, 0][..], vec![1 << 40, 1, 1]));
    assert_eq!(u.squeeze_dim(0).unwrap().sizes(), h.sizes());
    assert_eq!(Tensor::stack(&[&h, &h], 0).unwrap().sizes(), [2, 1 << 40, 1 << 40, 0]);
    // cat of two empty tensors makes a dimension of 2^63, past isize::MAX: select's negative
    // index wrapped as `index + size as isize` and overflowed (a debug build panicked).
    let half = Tensor::zeros(&[0, 1 << 62], DType::F32).unwrap();
    let whole = Tensor::cat(&[&half, &half], -1).unwrap();
    assert_eq!(whole.sizes(), [0, 1 << 63]);
    assert_eq!(whole.select(1, 0).unwrap().sizes(), [0]);
    // -2^63 is the first of 2^63; the last starts (2^63 - 1) * 4 bytes in, past isize::MAX.
    assert_eq!(whole.select(1, isize::MIN).unwrap().storage_offset(), 0);
    assert!(matches!(whole.select(1, -1), Err(TensorError::SizeOverflow { op: "select", .. })));
    assert!(matches!(
        whole.select(0, -1),
        Err(TensorError::IndexOutOfRange { op: "select", index: -1, dim: 0, size: 0, .. })
    ));
}

#[test]
fn embedding_matmul_and_slice_keep_dimensions_past_isize_max_of_empty_tensors() {
    // Both went through an `isize` shape (a view, an expand): 2^63 became negative and was
    // refused with an error about the shape's sign.
    let table = Tensor::zeros(&[3, 4], DType::F32).unwrap();
    let ids = Tensor::zeros(&[0, 1 << 63], DType::I64).unwrap();
    assert_eq!(table.embedding(&ids).unwrap().sizes(), [0, 1 << 63, 4]);
    let batch = Tensor::zeros(&[1 << 63, 0, 2, 3], DType::F32).unwrap();
    let w = Tensor::zeros(&[3, 5], DType::F32).unwrap();
    assert_eq!(batch.matmul(&w).unwrap().sizes(), [1 << 63, 0, 2, 5]);
    let rows = Tensor::zeros(&[0, usize::MAX, 1, 3], DType::F32).unwrap();
    assert_eq!(rows.matmul(&w).unwrap().sizes(), [0, usize::MAX, 1, 5]);
    // slice's negative bounds count from the whole size (it was clamped to isize::MAX).
    let wide = Tensor::zeros(&[0, usize::MAX], DType::U8).unwrap();
    assert_eq!(wide.slice(1, 0, -1, 1).unwrap().sizes(), [0, usize::MAX - 1]);
    let tail = wide.slice(1, isize::MIN, -1, 1).unwrap();
    assert_eq!((tail.sizes(), tail.storage_offset()), (&[0, (1 << 63) - 1][..], (1 << 63) - 1));
    // A batch that does not broadcast still names matmul.
    let other = Tensor::zeros(&[2, 3, 5], DType::F32).unwrap();
    assert!(matches!(batch.matmul(&other), Err(TensorError::Broadcast { op: "matmul", .. })));
}

#[test]
fn outputs_whose_element_count_overflows_are_size_overflow_errors() {
    // Found by a fuzzer of op chains built with debug assertions: the output's layout was
    // checked before its size, and the saturated strides of an overflowing shape failed it.
    let a = Tensor::zeros(&[isize::MAX as usize, 4, 1 << 20, 0], DType::F32).unwrap();
    let b = Tensor::zeros(&[0, isize::MAX as usize], DType::F32).unwrap();
    let overflow = |r: Result<Tensor, TensorError>| match r {
        Err(TensorError::SizeOverflow { op, shape, .. }) => (op, shape),
        other => panic!("{:?}", other.map(|t| t.sizes().to_vec())),
    };
    // A sum over k = 0 is a full output of zeros: [2^63 - 1, 4, 2^20, 2^63 - 1].
    assert_eq!(overflow(a.matmul(&b)), ("matmul", vec![isize::MAX as usize, 4, 1 << 20, isize::MAX as usize]));
    let c = Tensor::zeros(&[0, 2, 3, usize::MAX], DType::F64).unwrap();
    assert_eq!(overflow(c.mean_dim(0, false)), ("mean_dim", vec![2, 3, usize::MAX]));
    assert_eq!(overflow(c.sum_dim(0, true)), ("sum_dim", vec![1, 2, 3, usize::MAX]));
}

#[test]
fn reductions_and_norms_of_empty_tensors_whose_other_sizes_overflow_are_empty() {
    // Found by torchdiff's huge cases against a debug build: the column reduction multiplied
    // the sizes around the reduced dimension (2 * 2^32 * 2^40 * 0 past 2^64) and the norms
    // the normalized shape's, before seeing that the tensor is empty.
    let e = Tensor::zeros(&[2, 1 << 32, 1 << 40, 0], DType::I16).unwrap();
    assert_eq!(e.max_dim(0, true).unwrap().sizes(), [1, 1 << 32, 1 << 40, 0]);
    assert_eq!(e.min_dim(-2, false).unwrap().sizes(), [2, 1 << 32, 0]);
    let f = Tensor::zeros(&[isize::MAX as usize, 1 << 62, isize::MAX as usize, 0], DType::F32).unwrap();
    assert_eq!(f.argmax_dim(0, true).unwrap().sizes(), [1, 1 << 62, isize::MAX as usize, 0]);
    assert_eq!(f.sum_dim(1, false).unwrap().sizes(), [isize::MAX as usize, isize::MAX as usize, 0]);
    let rows = Tensor::zeros(&[0, 1 << 40, 1 << 40], DType::F32).unwrap();
    assert_eq!(rows.layer_norm(&[1 << 40, 1 << 40], None, None, 1e-5).unwrap().sizes(), rows.sizes());
    assert_eq!(rows.rms_norm(&[1 << 40, 1 << 40], None, None).unwrap().sizes(), rows.sizes());
}

#[test]
fn work_on_empty_tensors_does_not_depend_on_their_other_dimensions() {
    let start = Instant::now();
    let wide = Tensor::zeros(&[1 << 31, 0], DType::F32).unwrap();
    assert_eq!(wide.to_string(), "tensor([], size=(2147483648, 0))");
    let batched = Tensor::zeros(&[1 << 32, 0, 0], DType::F32).unwrap();
    let product = batched.matmul(&Tensor::zeros(&[0, 4], DType::F32).unwrap()).unwrap();
    assert_eq!(product.sizes(), [1 << 32, 0, 4]);
    let long = Tensor::zeros(&[1, 0, 1 << 32], DType::F32).unwrap();
    assert!(matches!(long.chunk(1 << 40, 2), Err(TensorError::TooManyViews { .. })));
    assert_eq!(long.chunk(2, 2).unwrap().len(), 2);
    assert_eq!(wide.add(&wide).unwrap().sizes(), [1 << 31, 0]);
    assert_eq!(wide.sum_dim(0, false).unwrap().sizes(), [0]);
    assert!(start.elapsed() < Duration::from_secs(20), "empty tensors took {:?}", start.elapsed());
}

// ---- found by differential testing against PyTorch 2.15 (CPU, x86) ----

#[test]
fn an_integer_number_wraps_into_a_narrow_integer_tensor_as_in_pytorch() {
    let x = Tensor::from_vec(vec![9u8, 3, 200, 0], &[4], DType::U8).unwrap();
    // PyTorch: -1 into u8 is 255, 300 is 44; the arithmetic then wraps.
    assert_eq!(x.sub_scalar(-1).unwrap().to_vec::<u8>().unwrap(), [10, 4, 201, 1]);
    assert_eq!(x.mul_scalar(-1).unwrap().to_vec::<u8>().unwrap(), [247, 253, 56, 0]);
    assert_eq!(x.add_scalar(300).unwrap().to_vec::<u8>().unwrap(), [53, 47, 244, 44]);
    let y = x.clone();
    y.sub_scalar_(-1).unwrap();
    assert_eq!(x.to_vec::<u8>().unwrap(), [10, 4, 201, 1]);
    let mask = Tensor::from_vec(vec![true, false, false, false], &[4], DType::Bool).unwrap();
    assert_eq!(x.masked_fill(&mask, -1).unwrap().to_vec::<u8>().unwrap(), [255, 4, 201, 1]);
    // An i64 number is taken exactly, not through f64.
    let big = (1i64 << 53) + 1;
    let z = Tensor::zeros(&[1], DType::I64).unwrap();
    assert_eq!(z.add_scalar(big).unwrap().to_vec::<i64>().unwrap(), [big]);
    assert_eq!(z.add_scalar(i64::MIN).unwrap().to_vec::<i64>().unwrap(), [i64::MIN]);
}

#[test]
fn integer_powers_follow_pytorch() {
    let x = Tensor::from_vec(vec![-2i32, -1, 0, 1, 3], &[5], DType::I32).unwrap();
    assert_eq!(x.pow_scalar(3).unwrap().to_vec::<i32>().unwrap(), [-8, -1, 0, 1, 27]);
    assert_eq!(x.pow_scalar(0).unwrap().to_vec::<i32>().unwrap(), [1; 5]);
    // A negative integer number: refused (torch: "Integers to negative integer powers are not
    // allowed"), in place too, leaving the tensor as it was.
    for e in [x.pow_scalar(-1).unwrap_err(), x.pow_scalar_(-2).map(|_| ()).unwrap_err()] {
        assert!(matches!(e, TensorError::UnsupportedDType { dtype: DType::I32, .. }), "{e:?}");
        assert!(e.to_string().contains("negative integer powers"), "{e}");
    }
    assert_eq!(x.to_vec::<i32>().unwrap(), [-2, -1, 0, 1, 3]);
    let b = Tensor::from_vec(vec![true, false], &[2], DType::Bool).unwrap();
    assert!(b.pow_scalar(-1).unwrap_err().to_string().contains("negative integer powers"));
    assert_eq!(b.pow_scalar(2).unwrap().to_vec::<i64>().unwrap(), [1, 0]);
    // A float number promotes; a tensor of exponents is not checked (torch gives 1, -1 or 0).
    let f = x.narrow(0, 3, 2).unwrap().pow_scalar(-1.0).unwrap();
    assert_eq!((f.dtype(), f.to_vec::<f32>().unwrap()), (DType::F32, vec![1.0, 1.0 / 3.0]));
    let minus_one = Tensor::full(&[1], -1.0, DType::I32).unwrap();
    let r = x.narrow(0, 1, 4).unwrap().narrow(0, 1, 3).unwrap().add_scalar(1).unwrap().pow(&minus_one).unwrap();
    assert_eq!(r.to_vec::<i32>().unwrap(), [1, 0, 0]);
    let bases = Tensor::from_vec(vec![-1i64, 1, 2], &[3], DType::I64).unwrap();
    assert_eq!(bases.pow(&Tensor::full(&[1], -3.0, DType::I64).unwrap()).unwrap().to_vec::<i64>().unwrap(), [-1, 1, 0]);
    // Floats take any number.
    let g = Tensor::from_vec(vec![2.0f32, 4.0], &[2], DType::F32).unwrap();
    assert_eq!(g.pow_scalar(-1).unwrap().to_vec::<f32>().unwrap(), [0.5, 0.25]);
}

#[test]
fn floats_convert_to_narrow_integers_as_pytorch_does_on_x86() {
    let v = [255., -129., 128., 200., -200., 300., 1e10, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -1.];
    let x = Tensor::from_vec(v.to_vec(), &[v.len()], DType::F32).unwrap();
    // torch.tensor(v).to(torch.int8 / torch.uint8 / torch.int16), PyTorch 2.15 on x86.
    assert_eq!(x.to_dtype(DType::I8).unwrap().to_vec::<i8>().unwrap(), [-1, 127, -128, -56, 56, 44, 0, 0, 0, 0, -1]);
    assert_eq!(x.to_dtype(DType::U8).unwrap().to_vec::<u8>().unwrap(), [255, 127, 128, 200, 56, 44, 0, 0, 0, 0, 255]);
    assert_eq!(
        x.to_dtype(DType::I16).unwrap().to_vec::<i16>().unwrap(),
        [255, -129, 128, 200, -200, 300, 0, 0, 0, 0, -1]
    );
    // The same conversion in copy_, from f64 and from f16.
    let out = Tensor::zeros(&[v.len()], DType::U8).unwrap();
    out.copy_(&x.to_dtype(DType::F64).unwrap()).unwrap();
    assert_eq!(out.to_vec::<u8>().unwrap(), [255, 127, 128, 200, 56, 44, 0, 0, 0, 0, 255]);
    let h = Tensor::from_vec(vec![f16::from_f32(-2.0), f16::INFINITY], &[2], DType::F16).unwrap();
    assert_eq!(h.to_dtype(DType::U8).unwrap().to_vec::<u8>().unwrap(), [254, 0]);
    // i32 and i64 saturate (PyTorch leaves these undefined).
    assert_eq!(x.to_dtype(DType::I32).unwrap().get::<i32>(&[7]).unwrap(), i32::MAX);
    assert_eq!(x.to_dtype(DType::I64).unwrap().get::<i64>(&[8]).unwrap(), i64::MIN);
}

#[test]
fn slice_clamps_its_bounds_as_python_and_pytorch_do() {
    let x = arange(3);
    assert_eq!(x.slice(0, -100, 100, 1).unwrap().to_vec::<f32>().unwrap(), [0., 1., 2.]);
    assert_eq!(x.slice(0, -100, 0, 3).unwrap().sizes(), [0]);
    assert_eq!(x.slice(0, 5, 10, 1).unwrap().sizes(), [0]);
    assert_eq!(x.slice(0, 2, 1, 1).unwrap().sizes(), [0]);
    assert_eq!(x.slice(0, -2, 100, 2).unwrap().to_vec::<f32>().unwrap(), [1.]);
    let empty = Tensor::zeros(&[0, 1], DType::F32).unwrap();
    assert_eq!(empty.slice(0, 0, 5, 1).unwrap().sizes(), [0, 1]);
    // A clamped empty view at the end reads nothing and can be written through.
    let tail = x.slice(0, 3, 3, 1).unwrap();
    assert_eq!(tail.to_vec::<f32>().unwrap(), Vec::<f32>::new());
    tail.add_scalar_(1.0).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), [0., 1., 2.]);
    // narrow keeps PyTorch's strict check.
    assert!(matches!(x.narrow(0, 1, 3), Err(TensorError::RangeOutOfBounds { .. })));
}

#[test]
fn an_empty_tensor_with_a_stride_0_dimension_can_be_written_in_place() {
    // PyTorch refuses a stride-0 dimension of size > 1 only when there are elements.
    let e = Tensor::zeros(&[0, 1], DType::U8).unwrap().expand(&[0, 4]).unwrap();
    assert_eq!(e.strides()[1], 0);
    e.mul_scalar_(-1).unwrap();
    let x = Tensor::zeros(&[1], DType::F32).unwrap().expand(&[4]).unwrap();
    assert!(matches!(x.add_scalar_(1.0), Err(TensorError::InternalOverlap { .. })));
}

#[test]
fn masked_fill_broadcasts_the_tensor_and_the_mask_together() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3], DType::F32).unwrap();
    let mask = Tensor::from_vec(vec![true, false], &[2, 1], DType::Bool).unwrap();
    let y = x.masked_fill(&mask, 0.5).unwrap();
    assert_eq!(y.sizes(), [2, 3]);
    assert_eq!(y.to_vec::<f32>().unwrap(), [0.5, 0.5, 0.5, 1., 2., 3.]);
    // The in-place form cannot grow `x`.
    assert!(matches!(x.masked_fill_(&mask, 0.5), Err(TensorError::BadShape { .. })));
    assert_eq!(x.to_vec::<f32>().unwrap(), [1., 2., 3.]);
}

#[test]
fn printing_wraps_rows_and_the_dtype_as_pytorch_does() {
    // No nonzero finite value: PyTorch's column width stays 1, so 24 per line, and the dtype
    // goes to a line of its own when it would pass 80 columns.
    let v: Vec<f16> = (0..40).map(|i| if i % 2 == 0 { f16::INFINITY } else { f16::NEG_INFINITY }).collect();
    let t = Tensor::from_vec(v, &[40], DType::F16).unwrap();
    let row = |n: usize| ["inf", "-inf"].repeat(n / 2).join(", ");
    assert_eq!(t.to_string(), format!("tensor([{},\n        {}],\n       dtype=f16)", row(24), row(16)));
    let i = Tensor::from_vec(vec![i32::MIN, i32::MAX, 5, 7, 1, 2], &[6], DType::I32).unwrap();
    assert_eq!(
        i.to_string(),
        "tensor([-2147483648,  2147483647,           5,           7,           1,\n                  2], dtype=i32)"
    );
}

#[test]
fn softmax_of_a_0_d_tensor_is_its_one_element_row() {
    let tracker = Arc::new(TrackingAllocator::new(Arc::new(SystemAllocator::new())));
    let opts = TensorOptions::new().dtype(DType::F16).allocator(tracker.clone());
    let x = Tensor::full(&[], 3.0, &opts).unwrap();
    let one = x.softmax(0).unwrap();
    assert_eq!(one.sizes(), [] as [usize; 0]);
    assert_eq!(one.item::<f16>().unwrap(), f16::ONE);
    // The output comes from the input's allocator.
    drop(x);
    assert_eq!(tracker.live_chunks().len(), 1);
    // PyTorch: softmax(tensor(inf)) is nan.
    let inf = Tensor::full(&[], f64::INFINITY, &opts).unwrap().softmax(-1).unwrap();
    assert!(inf.item::<f16>().unwrap().is_nan());
}

#[test]
fn half_precision_softmax_sums_its_row_in_f32_as_pytorch_does() {
    // torch.zeros(4096, dtype=...).softmax(0) is 1/4096 everywhere. Summed in the dtype, the
    // row stalls at 2048 in f16 and at 256 in bf16 (1/2048 and 1/256 each).
    for dt in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        let p = Tensor::zeros(&[3, 4096], dt).unwrap().softmax(1).unwrap();
        let v = p.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        assert!(v.iter().all(|&x| x == 1.0 / 4096.0), "{dt:?}: {}", v[0]);
    }
    // Long rows of varied values against the f64 softmax of the same (rounded) values, rounded
    // once: halves within one unit of their last place (or the smallest subnormal), f32 within
    // 8 (its exp, its sum of up to 20011 terms in 16 lanes, its reciprocal and product). 20011
    // elements is past the 16384-element scratch row: there f32 keeps the exponentials in its
    // output and the halves compute them twice, and the last 11 elements are summed outside
    // the lanes.
    for n in [6000, 20011] {
        let x: Vec<f64> = (0..n).map(|i| ((i * 7919) % 1000) as f64 / 100.0 - 5.0).collect();
        let cases = [
            (DType::F16, 2f64.powi(-10), 2f64.powi(-24)),
            (DType::BF16, 2f64.powi(-7), 2f64.powi(-133)),
            (DType::F32, 2f64.powi(-20), 0.0),
        ];
        for (dt, ulp, tiny) in cases {
            let t = Tensor::from_vec(x.clone(), &[n], DType::F64).unwrap().to_dtype(dt).unwrap();
            let xs = t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
            let m = xs.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = xs.iter().map(|v| (v - m).exp()).sum();
            let got = t.softmax(0).unwrap().to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
            for (i, (&g, &v)) in got.iter().zip(&xs).enumerate() {
                let want = (v - m).exp() / z;
                assert!(
                    (g - want).abs() <= (want * ulp).max(tiny),
                    "{dt:?} row of {n}, element {i}: {g} against {want}"
                );
            }
        }
    }
}

#[test]
fn log_softmax_gives_pytorchs_answers_at_the_edges() {
    let f32s = |t: Tensor| t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    let inf = f32::INFINITY;
    for dt in [DType::F32, DType::F64, DType::BF16, DType::F16] {
        let ls = |v: &[f32]| {
            f32s(Tensor::from_slice(v, &[v.len()], DType::F32).unwrap().to_dtype(dt).unwrap().log_softmax(0).unwrap())
        };
        // torch.log_softmax of each row, in every float dtype.
        assert!(ls(&[-inf, -inf]).iter().all(|v| v.is_nan()), "{dt:?}: a row of -inf is NaN");
        assert_eq!(ls(&[0.0, -inf]), [0.0, -inf], "{dt:?}");
        assert!(ls(&[inf, 0.0]).iter().all(|v| v.is_nan()), "{dt:?}: inf makes the row NaN");
        assert!(ls(&[f32::NAN, 0.0]).iter().all(|v| v.is_nan()), "{dt:?}: NaN makes the row NaN");
        assert_eq!(ls(&[3.0]), [0.0], "{dt:?}");
        assert_eq!(
            ls(&[2.0, 2.0, 2.0, 2.0]),
            [-core::f32::consts::LN_2 * 2.0; 4].map(|v| f32s(Tensor::full(&[1], f64::from(v), dt).unwrap())[0]),
            "{dt:?}"
        );
        // 0-d: its own row.
        let zero_d = Tensor::full(&[], 5.0, dt).unwrap().log_softmax(-1).unwrap();
        assert_eq!(zero_d.sizes(), [] as [usize; 0]);
        assert_eq!(f32s(zero_d), [0.0]);
        assert!(f32s(Tensor::full(&[], f64::INFINITY, dt).unwrap().log_softmax(0).unwrap())[0].is_nan());
        // Empty rows and an empty set of rows keep their shape.
        assert_eq!(Tensor::zeros(&[0, 3], dt).unwrap().log_softmax(1).unwrap().sizes(), [0, 3]);
        assert_eq!(Tensor::zeros(&[3, 0], dt).unwrap().log_softmax(0).unwrap().sizes(), [3, 0]);
        assert_eq!(Tensor::zeros(&[2, 3], dt).unwrap().log_softmax(1).unwrap().dtype(), dt);
    }
    // (x - max) - ln(sum), in that order: with x near 1e6 (an ulp of 0.0625 there), adding the
    // maximum and the logarithm first would lose all but 4 bits of the answer.
    let x = Tensor::from_slice(&[1e6f32, 1e6 + 0.0625], &[2], DType::F32).unwrap();
    let got = f32s(x.log_softmax(0).unwrap());
    let l = (1.0 + (-0.0625f64).exp()).ln();
    let want = [-0.0625 - l, -l];
    for (g, w) in got.iter().zip(want) {
        assert!((f64::from(*g) - w).abs() < 1e-6, "{got:?} against {want:?}");
    }
    // Errors name the op.
    let i = Tensor::from_slice(&[1i64, 2], &[2], DType::I64).unwrap();
    let err = i.log_softmax(0).unwrap_err();
    assert!(matches!(err, TensorError::UnsupportedDType { op: "log_softmax", .. }), "{err}");
    assert!(err.to_string().contains("log_softmax needs a floating-point tensor"), "{err}");
    let err = Tensor::zeros(&[2, 3], DType::F32).unwrap().log_softmax(2).unwrap_err();
    assert!(err.to_string().starts_with("log_softmax: dimension 2"), "{err}");
    let err = Tensor::full(&[], 1.0, DType::F32).unwrap().log_softmax(1).unwrap_err();
    assert!(err.to_string().starts_with("log_softmax: dimension 1"), "{err}");
}

#[test]
fn log_softmax_of_half_precision_rows_is_computed_in_f32_and_rounded_once() {
    // bf16 [0, ln 0.002]: the sum 1.002 is 1 in bf16. PyTorch's CPU kernel along the last
    // dimension rounds the sum to bf16 first and gives 0 for the first element; rounded once
    // (PyTorch along other dimensions, and on CUDA) it is -0.002.
    let v = [0.0, 0.002f64.ln()];
    let x = Tensor::from_vec(v.to_vec(), &[2], DType::F64).unwrap().to_dtype(DType::BF16).unwrap();
    let xs = x.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
    let exact = -(1.0 + xs[1].exp()).ln();
    let first = x.log_softmax(0).unwrap().to_vec::<bf16>().unwrap()[0];
    assert_eq!(first, bf16::from_f64(exact), "{first} against {exact}");
    // Along the last dimension and the first, the same answer.
    let col = x.reshape(&[2, 1]).unwrap().log_softmax(0).unwrap().to_vec::<bf16>().unwrap()[0];
    assert_eq!(col, first);
    // Long rows of varied values against the f64 log_softmax of the same (rounded) values:
    // halves within one unit of their last place, f32 within 4 (its exp, its sum of up to 20011
    // terms in 16 lanes, its logarithm and two subtractions). 20011 elements is past the
    // 16384-element scratch row, and the last 11 elements are summed outside the lanes.
    for n in [1, 37, 6000, 20011] {
        let x: Vec<f64> = (0..n).map(|i| ((i * 7919) % 1000) as f64 / 50.0 - 10.0).collect();
        for (dt, ulp) in [
            (DType::F16, 2f64.powi(-10)),
            (DType::BF16, 2f64.powi(-7)),
            (DType::F32, 2f64.powi(-21)),
            (DType::F64, 1e-13),
        ] {
            let t = Tensor::from_vec(x.clone(), &[n], DType::F64).unwrap().to_dtype(dt).unwrap();
            let xs = t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
            let m = xs.iter().cloned().fold(f64::MIN, f64::max);
            let ls = xs.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            let got = t.log_softmax(0).unwrap().to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
            for (i, (&g, &v)) in got.iter().zip(&xs).enumerate() {
                let want = (v - m) - ls;
                assert!(
                    (g - want).abs() <= want.abs().max(ls) * ulp,
                    "{dt:?} row of {n}, element {i}: {g} against {want}"
                );
            }
        }
    }
}

#[test]
fn a_fill_value_the_dtype_cannot_hold_is_refused_as_pytorch_refuses_it() {
    let full = |v: f64, dt| Tensor::full(&[1], v, dt).map(|t| t.to_dtype(DType::F64).unwrap().item::<f64>().unwrap());
    // torch.full((1,), v, dtype=...) in PyTorch 2.15.
    assert_eq!(full(255.9, DType::U8).unwrap(), 255.0);
    assert_eq!(full(127.9, DType::I8).unwrap(), 127.0);
    for (v, dt) in [(256.0, DType::U8), (-1.0, DType::U8), (128.0, DType::I8), (-128.9, DType::I8), (1e10, DType::I32)]
    {
        assert!(matches!(full(v, dt), Err(TensorError::UnsupportedDType { op: "full", .. })), "{v} into {dt}");
    }
    assert!(full(f64::NAN, DType::I64).is_err());
    assert_eq!(full(i64::MIN as f64, DType::I64).unwrap(), i64::MIN as f64);
    // i64::MAX as f64 is 2^63, one past the largest i64.
    assert!(full(i64::MAX as f64, DType::I64).is_err());
    // PyTorch refuses this for two elements or more; for one it skips the check (inf).
    assert!(full(70000.0, DType::F16).is_err());
    assert_eq!(full(f64::INFINITY, DType::F16).unwrap(), f64::INFINITY);
    assert_eq!(full(0.5, DType::Bool).unwrap(), 1.0);

    let x = Tensor::zeros(&[2], DType::U8).unwrap();
    let m = Tensor::from_vec(vec![true, false], &[2], DType::Bool).unwrap();
    // The integer -1 wraps into u8, down to -255; the float -1.25 does not.
    assert_eq!(x.masked_fill(&m, -1).unwrap().to_vec::<u8>().unwrap(), [255, 0]);
    assert_eq!(x.masked_fill(&m, -255).unwrap().to_vec::<u8>().unwrap(), [1, 0]);
    assert_eq!(x.masked_fill(&m, 2.5).unwrap().to_vec::<u8>().unwrap(), [2, 0]);
    for v in [Scalar::Int(300), Scalar::Int(-256), Scalar::Float(-1.25), Scalar::Float(1e10)] {
        assert!(x.masked_fill(&m, v).is_err(), "{v:?}");
        assert!(x.masked_fill_(&m, v).is_err(), "{v:?}");
    }
    assert_eq!(x.to_vec::<u8>().unwrap(), [0, 0]);
    let i8s = Tensor::zeros(&[2], DType::I8).unwrap();
    assert_eq!(i8s.masked_fill(&m, -1.25).unwrap().to_vec::<i8>().unwrap(), [-1, 0]);
    assert!(i8s.masked_fill(&m, -129).is_err());
}

#[test]
fn rms_norm_s_default_eps_is_that_of_the_type_it_computes_in() {
    // F.rms_norm(torch.tensor([1e-3, 2e-3, -1e-3, 5e-4], dtype=torch.float16), [4]) in
    // PyTorch 2.15: its kernel adds f32's epsilon (1.19e-7), not f16's (9.8e-4).
    let x = Tensor::from_vec(vec![1e-3f32, 2e-3, -1e-3, 5e-4], &[4], DType::F32).unwrap().to_dtype(DType::F16).unwrap();
    let y = x.rms_norm(&[4], None, None).unwrap().to_vec::<f16>().unwrap();
    let want = [0.77099609375f64, 1.5419921875, -0.77099609375, 0.385498046875];
    assert_eq!(y.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), want);
}

#[test]
fn split_of_an_empty_dimension_takes_a_zero_split_size() {
    let e = Tensor::zeros(&[1, 5, 0], DType::BF16).unwrap();
    let parts = e.split(0, 2).unwrap();
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0].sizes(), [1, 5, 0]);
    assert!(matches!(e.split(0, 1), Err(TensorError::ZeroArgument { .. })));
}

#[test]
fn half_precision_arithmetic_rounds_numbers_and_alpha_where_pytorch_does() {
    let h = |v: &[f64]| {
        Tensor::from_vec(v.iter().map(|&x| f16::from_f64(x)).collect::<Vec<_>>(), &[v.len()], DType::F16).unwrap()
    };
    let vals = |t: &Tensor| t.to_vec::<f16>().unwrap().iter().map(|v| v.to_f64()).collect::<Vec<_>>();
    // PyTorch 2.15: mul and div keep the number in f32 (3.7, not f16's 3.69921875) ...
    let x = h(&[1.03125, 1.0625, 1.125, 1.203125]);
    assert_eq!(vals(&x.mul_scalar(3.7).unwrap()), [3.81640625, 3.931640625, 4.1640625, 4.453125]);
    assert_eq!(vals(&(&x * 3.7)), [3.81640625, 3.931640625, 4.1640625, 4.453125]);
    let y = x.clone();
    y.mul_scalar_(3.7).unwrap();
    assert_eq!(vals(&x), [3.81640625, 3.931640625, 4.1640625, 4.453125]);
    let x = h(&[1.015625, 1.0625, 1.09375, 1.140625]);
    assert_eq!(vals(&x.div_scalar(3.3).unwrap()), [0.307861328125, 0.322021484375, 0.33154296875, 0.345703125]);
    // ... and `x + alpha * y` rounds alpha to f16, then computes in f32 and rounds once.
    let (x, y) =
        (h(&[1.0625, 1.078125, 1.09375, 1.203125]), h(&[0.419921875, 0.39990234375, 0.3798828125, 0.239990234375]));
    assert_eq!(vals(&x.add_scaled(&y, 3.7).unwrap()), [2.615234375, 2.556640625, 2.498046875, 2.091796875]);
    assert_eq!(vals(&x.sub_scaled(&y, -3.7).unwrap()), [2.615234375, 2.556640625, 2.498046875, 2.091796875]);
    // A 0-d float tensor multiplies as a number does (PyTorch reads it as a CPU scalar).
    let x = h(&[1.03125, 1.0625, 1.125, 1.203125]);
    let s = Tensor::scalar(3.7, DType::F64).unwrap();
    assert_eq!(vals(&x.mul(&s).unwrap()), [3.81640625, 3.931640625, 4.1640625, 4.453125]);
    let out = Tensor::zeros(&[4], DType::F32).unwrap();
    x.mul_out(&s, &out).unwrap();
    let out64: Vec<f64> = out.to_vec::<f32>().unwrap().iter().map(|&v| f64::from(v)).collect();
    assert_eq!(out64, [3.81640625, 3.931640625, 4.1640625, 4.453125]);
    // add rounds the number to f16 first: 1e-4 - 1e-3 is 1.0002e-4 - f16(1e-3).
    let x = h(&[1e-4]);
    assert_eq!(vals(&x.sub_scalar(1e-3).unwrap()), [-0.0009002685546875]);
}

#[test]
fn true_division_of_integers_by_a_number_divides_by_that_number() {
    // torch.tensor([32, 2, 6], dtype=torch.uint8) / -3: the -3 is not wrapped into u8.
    let x = Tensor::from_vec(vec![32u8, 2, 6], &[3], DType::U8).unwrap();
    let q = x.div_scalar(-3).unwrap();
    assert_eq!(q.dtype(), DType::F32);
    assert_eq!(q.to_vec::<f32>().unwrap(), [32.0 / -3.0, 2.0 / -3.0, -2.0]);
    let b = Tensor::from_vec(vec![true, false], &[2], DType::Bool).unwrap();
    assert_eq!(b.div_scalar(2).unwrap().to_vec::<f32>().unwrap(), [0.5, 0.0]);
    // Comparisons keep PyTorch's wrapped number: u8 < -1 compares with 255.
    assert_eq!(x.lt_scalar(-1).unwrap().to_vec::<bool>().unwrap(), [true, true, true]);
}

#[test]
fn arange_makes_the_values_and_refusals_of_torch_arange() {
    let i64s = |s, e, st| Tensor::arange(s, e, st, DType::I64).unwrap().to_vec::<i64>().unwrap();
    // An integer dtype truncates start and step first, as torch.arange and numpy.arange do.
    assert_eq!(i64s(0.0, 3.0, 0.5), [0; 6]);
    assert_eq!(i64s(0.5, 3.7, 1.5), [0, 1, 2]);
    assert_eq!(i64s(-1.5, 1.5, 0.5), [-1; 6]);
    assert_eq!(i64s(0.3, -5.0, -2.0), [0, -2, -4]);
    // The count is ceil((end - start) / step) of the numbers as given.
    assert_eq!(i64s(0.0, 2.5, 1.0), [0, 1, 2]);
    // Values wrap into a narrower dtype.
    let u8s = Tensor::arange(250.0, 260.0, 1.0, DType::U8).unwrap().to_vec::<u8>().unwrap();
    assert_eq!(u8s, [250, 251, 252, 253, 254, 255, 0, 1, 2, 3]);
    // Floats: start + i * step, rounded once.
    let f = Tensor::arange(0.0, 1.0, 0.1, DType::F64).unwrap().to_vec::<f64>().unwrap();
    assert_eq!(f.len(), 10);
    assert_eq!(f[3], 3.0 * 0.1);
    assert_eq!(Tensor::arange(0.1, 0.1, 1.0, DType::F32).unwrap().sizes(), [0]);
    assert_eq!(Tensor::arange(0.1, 0.1, -1.0, DType::F32).unwrap().sizes(), [0]);
    // Refused as PyTorch refuses them: a step away from the end, even by less than one step.
    let bad = |s, e, st, d| match Tensor::arange(s, e, st, d) {
        Err(TensorError::BadRange { reason, .. }) => reason,
        other => panic!("expected BadRange, got {other:?}"),
    };
    assert_eq!(bad(0.1, 0.001, 1.0, DType::F32), "the step goes away from the end");
    assert_eq!(bad(-0.3, 0.7, -1.0, DType::I32), "the step goes away from the end");
    assert_eq!(bad(0.0, 5.0, f64::INFINITY, DType::F32), "start, end and step must be finite");
    assert_eq!(bad(0.0, f64::NAN, 1.0, DType::F32), "start, end and step must be finite");
    assert_eq!(bad(1e19, 1e19 + 4096.0, 1024.0, DType::I8), "an integer dtype needs a start and step that fit in i64");
    assert_eq!(bad(0.0, 10.0, 1e19, DType::I64), "an integer dtype needs a start and step that fit in i64");
    assert!(matches!(Tensor::arange(0.0, 5.0, 1.0, DType::Bool), Err(TensorError::UnsupportedDType { .. })));
}

#[test]
fn fills_refuse_a_float_number_beyond_the_dtype_range() {
    // torch.full([2], 1e39) and masked_fill(.., 70000.0) on f16: "value cannot be converted
    // to type float without overflow".
    for (v, d) in [(1e39, DType::F32), (70000.0, DType::F16), (65504.5, DType::F16), (3.4e38, DType::BF16)] {
        let e = Tensor::full(&[2], v, d);
        assert!(matches!(e, Err(TensorError::UnsupportedDType { op: "full", .. })), "{v} into {d}: {e:?}");
        let x = Tensor::zeros(&[2], d).unwrap();
        let mask = Tensor::from_vec(vec![true, false], &[2], DType::Bool).unwrap();
        assert!(x.masked_fill(&mask, Scalar::Float(v)).is_err(), "masked_fill {v} into {d}");
    }
    let h = Tensor::zeros(&[2], DType::F16).unwrap();
    let mask = Tensor::from_vec(vec![true, false], &[2], DType::Bool).unwrap();
    assert!(h.masked_fill(&mask, Scalar::Int(70000)).is_err());
    assert_eq!(h.masked_fill(&mask, Scalar::Int(-65504)).unwrap().to_vec::<f16>().unwrap()[0], f16::MIN);
    // The largest finite values, infinities and NaN fill.
    assert_eq!(Tensor::full(&[2], 65504.0, DType::F16).unwrap().to_vec::<f16>().unwrap()[0], f16::MAX);
    assert_eq!(Tensor::full(&[2], f64::from(f32::MAX), DType::F32).unwrap().to_vec::<f32>().unwrap()[1], f32::MAX);
    assert!(Tensor::full(&[2], f64::NEG_INFINITY, DType::F16).unwrap().to_vec::<f16>().unwrap()[0].is_infinite());
    assert!(Tensor::full(&[2], f64::NAN, DType::BF16).unwrap().to_vec::<bf16>().unwrap()[0].is_nan());
    assert_eq!(Tensor::full(&[2], 70000.0, DType::BF16).unwrap().to_vec::<bf16>().unwrap()[0].to_f64(), 70144.0);
    assert_eq!(Tensor::full(&[2], 1e300, DType::F64).unwrap().to_vec::<f64>().unwrap()[0], 1e300);
}

#[test]
fn view_strides_match_pytorch_also_on_dimensions_of_size_one() {
    // t[0:2:2] of a 4-element tensor: stride 2, as in PyTorch, though one element is taken.
    let x = arange(4);
    assert_eq!(x.slice(0, 0, 2, 2).unwrap().strides(), [2]);
    assert_eq!(x.slice(0, 7, 9, 3).unwrap().strides(), [3]);
    assert_eq!(x.slice(0, 0, 4, usize::MAX).unwrap().strides(), [1]); // stride * step overflows
    // expand: a new leading dimension of size 1 has a contiguous stride, an expanded one 0.
    let y = arange(3).view(&[3, 1]).unwrap();
    assert_eq!(y.expand(&[1, 1, 3, 1]).unwrap().strides(), [3, 3, 1, 1]);
    assert_eq!(y.expand(&[1, 2, 3, 4]).unwrap().strides(), [0, 0, 1, 0]);
    assert_eq!(arange(5).broadcast_to(&[1, 5]).unwrap().strides(), [5, 1]);
    assert_eq!(Tensor::scalar(5.0, DType::F32).unwrap().broadcast_to(&[1, 1]).unwrap().strides(), [0, 0]);
}

#[test]
fn conversions_to_half_precision_round_through_f32_as_pytorch_does() {
    // bf16.mul_(f32): the f32 product 3.5703127 lies just above a bf16 tie and rounds up
    // (`half`'s own from_f64 rounds it down).
    let x = Tensor::from_vec(vec![-1.5625f32], &[1], DType::BF16).unwrap();
    let y = Tensor::from_vec(vec![-2.285f32], &[1], DType::F32).unwrap();
    x.mul_(&y).unwrap();
    assert_eq!(x.to_vec::<bf16>().unwrap()[0].to_f64(), 3.578125);
    // f64 into f16 goes through f32, as torch's .to(torch.float16) does: 1 + 2^-11 + 2^-30
    // becomes the tie 1 + 2^-11 in f32, then 1.0; 1 + 2^-11 + 2^-20 stays above the tie.
    let v = Tensor::from_vec(
        vec![1.0 + 2f64.powi(-11) + 2f64.powi(-30), 1.0 + 2f64.powi(-11) + 2f64.powi(-20)],
        &[2],
        DType::F64,
    )
    .unwrap();
    let h = v.to_dtype(DType::F16).unwrap().to_vec::<f16>().unwrap();
    assert_eq!((h[0].to_f64(), h[1].to_f64()), (1.0, 1.0009765625));
    let b = v.to_dtype(DType::BF16).unwrap().to_vec::<bf16>().unwrap();
    assert_eq!((b[0].to_f64(), b[1].to_f64()), (1.0, 1.0));
    let p = Tensor::from_vec(vec![3.5703126341104507f64], &[1], DType::F64).unwrap();
    assert_eq!(p.to_dtype(DType::BF16).unwrap().to_vec::<bf16>().unwrap()[0].to_f64(), 3.578125);
}

/// Every f16 and bf16 value through each loop the kernels pick (contiguous, broadcast number,
/// strided, in place, in place strided, mixed with f32, casts contiguous and strided), which
/// run vectorised for the CPU's widest vector extension: each result must be the f32 result
/// rounded once, as the `half` crate rounds it (NaN for NaN).
#[test]
fn half_precision_kernels_round_every_value_once_in_every_loop() {
    fn check<H: tensormem_tensor::Element>(
        dt: DType,
        from_bits: fn(u16) -> H,
        to_f32: fn(H) -> f32,
        from_f32: fn(f32) -> H,
    ) {
        const N: usize = 1 << 16;
        let a: Vec<H> = (0..N).map(|i| from_bits(i as u16)).collect();
        let b: Vec<H> = (0..N).map(|i| from_bits((i as u16).wrapping_mul(40_503) ^ 0x1234)).collect();
        let (ta, tb) = (Tensor::from_slice(&a, &[N], dt).unwrap(), Tensor::from_slice(&b, &[N], dt).unwrap());
        let same = |got: &[H], want: &dyn Fn(usize) -> f32, what: &str| {
            assert_eq!(got.len(), N / 2usize.pow(u32::from(what.contains("strided"))), "{dt:?} {what}: length");
            for (i, &g) in got.iter().enumerate() {
                let (g, w) = (to_f32(g), to_f32(from_f32(want(i))));
                assert!(
                    (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits(),
                    "{dt:?} {what}, element {i}: {g:e} ({:#010x}), expected {w:e}",
                    g.to_bits()
                );
            }
        };
        let (fa, fb) = (|i: usize| to_f32(a[i]), |i: usize| to_f32(b[i]));
        same(&ta.add(&tb).unwrap().to_vec::<H>().unwrap(), &|i| fa(i) + fb(i), "add");
        same(&ta.mul(&tb).unwrap().to_vec::<H>().unwrap(), &|i| fa(i) * fb(i), "mul");
        same(&ta.sub_scalar(1.5).unwrap().to_vec::<H>().unwrap(), &|i| fa(i) - 1.5, "sub number");
        let inplace = Tensor::from_slice(&a, &[N], dt).unwrap();
        inplace.add_(&tb).unwrap();
        same(&inplace.to_vec::<H>().unwrap(), &|i| fa(i) + fb(i), "add_");
        // Every other element of each, in the two orders: runs with a stride of 2 elements.
        let (sa, sb) = (ta.slice(0, 0, N as isize, 2).unwrap(), tb.slice(0, 1, N as isize, 2).unwrap());
        same(&sa.add(&sb).unwrap().to_vec::<H>().unwrap(), &|i| fa(2 * i) + fb(2 * i + 1), "strided add");
        let copy = Tensor::from_slice(&a, &[N], dt).unwrap();
        copy.slice(0, 0, N as isize, 2).unwrap().mul_(&sb).unwrap();
        let got = copy.to_vec::<H>().unwrap();
        let evens: Vec<H> = got.iter().step_by(2).copied().collect();
        same(&evens, &|i| fa(2 * i) * fb(2 * i + 1), "strided mul_");
        let odd_kept = got.iter().zip(&a).skip(1).step_by(2).all(|(x, y)| to_f32(*x).to_bits() == to_f32(*y).to_bits());
        assert!(odd_kept, "{dt:?} strided mul_ wrote elements outside its view");
        // Functions of one operand: each widens, computes in f32 and rounds once.
        same(&ta.neg().unwrap().to_vec::<H>().unwrap(), &|i| -fa(i), "neg");
        same(
            &ta.relu().unwrap().to_vec::<H>().unwrap(),
            &|i| if fa(i) > 0.0 || fa(i).is_nan() { fa(i) } else { 0.0 },
            "relu",
        );
        same(&ta.exp().unwrap().to_vec::<H>().unwrap(), &|i| fa(i).exp(), "exp");
        // The other vectorised functions: the f32 kernel's result for the widened value (which
        // is within a few units of the exact one, so that a result near a tie of the half type
        // may round the other way from a libm function's).
        let wide = ta.to_dtype(DType::F32).unwrap();
        type Fun = fn(&Tensor) -> tensormem_tensor::Result<Tensor>;
        let funs: [(&str, Fun); 6] = [
            ("sigmoid", Tensor::sigmoid),
            ("tanh", Tensor::tanh),
            ("log", Tensor::log),
            ("gelu", Tensor::gelu),
            ("gelu_tanh", Tensor::gelu_tanh),
            ("silu", Tensor::silu),
        ];
        for (name, f) in funs {
            let want = f(&wide).unwrap().to_vec::<f32>().unwrap();
            same(&f(&ta).unwrap().to_vec::<H>().unwrap(), &|i| want[i], name);
        }
        let relu_in_place = Tensor::from_slice(&a, &[N], dt).unwrap();
        relu_in_place.relu_().unwrap();
        same(
            &relu_in_place.to_vec::<H>().unwrap(),
            &|i| if fa(i) > 0.0 || fa(i).is_nan() { fa(i) } else { 0.0 },
            "relu_",
        );
        // `a + alpha * b`: alpha rounded to the dtype (0.3 is 0.2998... in f16), the rest in f32.
        let al = to_f32(from_f32(0.3));
        same(&ta.add_scaled(&tb, 0.3).unwrap().to_vec::<H>().unwrap(), &|i| fa(i) + fb(i) * al, "add_scaled");
        // One value broadcast against every element, as either operand, and in place.
        let one = Tensor::from_slice(&[b[7]], &[1], dt).unwrap();
        same(&ta.sub(&one).unwrap().to_vec::<H>().unwrap(), &|i| fa(i) - fb(7), "sub broadcast value");
        same(&one.sub(&ta).unwrap().to_vec::<H>().unwrap(), &|i| fb(7) - fa(i), "broadcast value sub");
        let scaled = Tensor::from_slice(&a, &[N], dt).unwrap();
        scaled.mul_(&one).unwrap();
        same(&scaled.to_vec::<H>().unwrap(), &|i| fa(i) * fb(7), "mul_ broadcast value");
        // Contiguous runs starting at an odd element, of lengths that are no multiple of 8.
        for (start, len) in [(3usize, 1usize), (5, 37), (1, N - 11)] {
            let va = ta.slice(0, start as isize, (start + len) as isize, 1).unwrap();
            let vb = tb.slice(0, 0, len as isize, 1).unwrap();
            let got = va.add(&vb).unwrap().to_vec::<H>().unwrap();
            assert_eq!(got.len(), len, "{dt:?} offset add: length");
            for (i, &g) in got.iter().enumerate() {
                let (g, w) = (to_f32(g), to_f32(from_f32(fa(start + i) + fb(i))));
                assert!(
                    (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits(),
                    "{dt:?} offset add at {start}, element {i}"
                );
            }
        }
        // The sum adds the widened values in the f32 sum's lanes and blocks: the same total as
        // the sum of the tensor cast to f32 (the finite values, mixed magnitudes, odd length).
        let finite: Vec<H> = b.iter().copied().filter(|&v| to_f32(v).is_finite()).take(N - 7).collect();
        let tfin = Tensor::from_slice(&finite, &[finite.len()], dt).unwrap();
        let (hs, fs) = (tfin.sum().unwrap(), tfin.to_dtype(DType::F32).unwrap().sum().unwrap());
        let want = to_f32(from_f32(fs.item::<f32>().unwrap()));
        assert_eq!(to_f32(hs.item::<H>().unwrap()).to_bits(), want.to_bits(), "{dt:?} sum");
        // A float number multiplies in f32 (PyTorch's opmath); an f32 `out=` tensor receives the
        // half result (rounded), not the f32 sum.
        same(&ta.mul_scalar(0.1).unwrap().to_vec::<H>().unwrap(), &|i| fa(i) * 0.1, "mul by 0.1");
        let wide_out = Tensor::zeros(&[N], DType::F32).unwrap();
        ta.add_out(&tb, &wide_out).unwrap();
        let w = wide_out.to_vec::<f32>().unwrap();
        let rounded = |v: f32| to_f32(from_f32(v));
        let half_sum_in_f32 =
            (0..N).all(|i| (w[i].is_nan() && rounded(fa(i) + fb(i)).is_nan()) || w[i] == rounded(fa(i) + fb(i)));
        assert!(half_sum_in_f32, "{dt:?} add_out into an f32 tensor must receive the rounded sums");
        // An integer operand is rounded to the half type first: 2049 is 2048 in f16 (and bf16).
        let ints = Tensor::from_slice(&[2049i32, 2049], &[2], DType::I32).unwrap();
        let ones = Tensor::from_slice(&[from_f32(1.0), from_f32(0.0)], &[2], dt).unwrap();
        let sum: Vec<f32> = ones.add(&ints).unwrap().to_vec::<H>().unwrap().into_iter().map(to_f32).collect();
        assert_eq!(sum, [rounded(rounded(2049.0) + 1.0), rounded(2049.0)], "{dt:?} + i32");
        // Mixed with f32 (computes in f32), and casts both ways, contiguous and strided.
        let wide = tb.to_dtype(DType::F32).unwrap();
        let mixed = ta.add(&wide).unwrap();
        assert_eq!(mixed.dtype(), DType::F32);
        let m = mixed.to_vec::<f32>().unwrap();
        let exact = |got: f32, want: f32| (got.is_nan() && want.is_nan()) || got.to_bits() == want.to_bits();
        assert!((0..N).all(|i| exact(m[i], fa(i) + fb(i))), "{dt:?} + f32");
        let halves_in_place = Tensor::from_slice(&a, &[N], dt).unwrap();
        halves_in_place.add_(&wide).unwrap();
        same(&halves_in_place.to_vec::<H>().unwrap(), &|i| fa(i) + fb(i), "add_ of f32");
        // The same through strided runs: gathered, converted as a block, scattered.
        let wide_odd = wide.slice(0, 1, N as isize, 2).unwrap();
        let ms = sa.add(&wide_odd).unwrap().to_vec::<f32>().unwrap();
        assert!((0..N / 2).all(|i| exact(ms[i], fa(2 * i) + fb(2 * i + 1))), "{dt:?} strided + strided f32");
        let evens_in_place = Tensor::from_slice(&a, &[N], dt).unwrap();
        evens_in_place.slice(0, 0, N as isize, 2).unwrap().add_(&wide_odd).unwrap();
        let got = evens_in_place.to_vec::<H>().unwrap();
        same(
            &got.iter().step_by(2).copied().collect::<Vec<H>>(),
            &|i| fa(2 * i) + fb(2 * i + 1),
            "strided add_ of strided f32",
        );
        assert!(got.iter().zip(&a).skip(1).step_by(2).all(|(x, y)| to_f32(*x).to_bits() == to_f32(*y).to_bits()));
        let widened = ta.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        assert!((0..N).all(|i| exact(widened[i], fa(i))), "{dt:?} cast to f32");
        let strided_wide = sa.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        assert!((0..N / 2).all(|i| exact(strided_wide[i], fa(2 * i))), "{dt:?} strided cast to f32");
        let floats: Vec<f32> = (0..N as u32).map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761))).collect();
        let tf = Tensor::from_slice(&floats, &[N], DType::F32).unwrap();
        same(&tf.to_dtype(dt).unwrap().to_vec::<H>().unwrap(), &|i| floats[i], "cast from f32");
        let narrowed = tf.slice(0, 1, N as isize, 2).unwrap().to_dtype(dt).unwrap();
        same(&narrowed.to_vec::<H>().unwrap(), &|i| floats[2 * i + 1], "strided cast from f32");
    }
    check(DType::F16, f16::from_bits, f16::to_f32, f16::from_f32);
    check(DType::BF16, bf16::from_bits, bf16::to_f32, bf16::from_f32);
}

/// Figures from PyTorch 2.15 (`x.stride()` of each result).
#[test]
fn outputs_are_laid_out_as_pytorch_lays_them_out() {
    let a = arange(12).view(&[4, 3]).unwrap(); // a.t(): [3, 4], strides [1, 3]
    let at = a.t().unwrap();
    let b = arange(12).view(&[3, 4]).unwrap();
    let strides = |t: Tensor| t.strides().to_vec();
    // Element-wise: the first input that tells the dimensions apart decides.
    assert_eq!(strides(at.exp().unwrap()), [1, 3]);
    assert_eq!(strides(at.add(&b).unwrap()), [1, 3]);
    assert_eq!(strides(b.add(&at).unwrap()), [4, 1]);
    assert_eq!(strides(at.add(&at).unwrap()), [1, 3]);
    assert_eq!(strides(at.mul_scalar(2.0).unwrap()), [1, 3]);
    assert_eq!(strides(at.gt(&b).unwrap()), [1, 3]);
    let pos = at.gt_scalar(0.0).unwrap();
    assert_eq!(strides(at.where_cond(&pos, &Tensor::scalar(0.0, DType::F32).unwrap()).unwrap()), [1, 3]);
    // A row broadcast over a transposed matrix: the matrix decides.
    assert_eq!(strides(arange(4).add(&at).unwrap()), [1, 3]);
    // `to` and `*_like` keep a dense layout, and a strided one's order, packed.
    assert_eq!(strides(at.to_dtype(DType::F16).unwrap()), [1, 3]);
    assert_eq!(strides(Tensor::zeros_like(&at).unwrap()), [1, 3]);
    let stepped = at.slice(0, 0, 3, 2).unwrap(); // [2, 4], strides [2, 3]
    assert_eq!(strides(Tensor::zeros_like(&stepped).unwrap()), [1, 2]);
    assert_eq!(strides(stepped.to_dtype(DType::F64).unwrap()), [1, 2]);
    assert_eq!(strides(Tensor::full_like(&at.expand(&[2, 3, 4]).unwrap(), 1.0).unwrap()), [12, 1, 3]);
    // A quantised tensor's blocks have one layout: zeros like it are contiguous.
    let q = Tensor::ones(&[2, 3, 64], DType::F32).unwrap().to_dtype(DType::Q8_0).unwrap();
    let qz = Tensor::zeros_like(&q.permute(&[1, 0, 2]).unwrap()).unwrap();
    assert_eq!((qz.dtype(), qz.sizes(), qz.strides()), (DType::Q8_0, &[3, 2, 64][..], &[128, 64, 1][..]));
    assert_eq!(qz.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(), [0.0; 384]);
    // Channels-last 4-d tensors stay channels-last; permuted 3-d ones keep their order.
    let nhwc = arange(120).view(&[2, 4, 5, 3]).unwrap().permute(&[0, 3, 1, 2]).unwrap();
    assert_eq!(strides(nhwc.relu().unwrap()), [60, 1, 15, 3]);
    assert_eq!(strides(nhwc.add(&nhwc).unwrap()), [60, 1, 15, 3]);
    let p = arange(24).view(&[2, 3, 4]).unwrap().permute(&[2, 0, 1]).unwrap();
    assert_eq!(strides(p.exp().unwrap()), [1, 12, 4]);
    // An operand of another dtype counts as PyTorch's converted copy of it (`to`, packed).
    let f = arange(40).as_strided(&[1, 3, 4], &[36, 0, 1], 0).unwrap();
    let g = arange(12).to_dtype(DType::F64).unwrap().as_strided(&[1, 3, 4], &[1, 4, 1], 0).unwrap();
    assert_eq!(strides(f.ge(&g).unwrap()), [12, 4, 1]);
    // `pow` by a number is a unary op of its tensor in PyTorch; `mul` by one is binary.
    let odd = arange(100).as_strided(&[4, 1, 1, 2], &[2, 8, 8, 1], 3).unwrap();
    assert_eq!(strides(odd.pow_scalar(2.0).unwrap()), [2, 2, 2, 1]);
    assert_eq!(strides(odd.mul_scalar(2.0).unwrap()), [2, 8, 8, 1]);
    // Contiguous inputs give contiguous outputs; values are PyTorch's whatever the layout.
    assert_eq!(strides(a.add(&a).unwrap()), [3, 1]);
    let sum = at.add(&b).unwrap();
    let want: Vec<f32> = (0..12).map(|i| ((i % 4) * 3 + i / 4 + i) as f32).collect();
    assert_eq!(sum.to_vec::<f32>().unwrap(), want);
    assert!(matches!(sum.as_slice::<f32>().unwrap_err(), TensorError::NotContiguous { .. }));
    assert_eq!(sum.contiguous().unwrap().as_slice::<f32>().unwrap().to_vec(), want);
    // Every byte of a transposed fresh output is written: its storage holds the values.
    assert_eq!(sum.storage().nbytes(), 12 * 4);
    assert_eq!(
        sum.as_strided(&[12], &[1], 0).unwrap().to_vec::<f32>().unwrap().iter().sum::<f32>(),
        want.iter().sum::<f32>()
    );
}

#[test]
fn a_product_by_a_transposed_column_keeps_the_sign_of_zero() {
    // [5, 1] x [1, 9], the right one a transposed column (strides [1, 1]): PyTorch gives -0
    // for 0 x -3, whatever the stride of the size-1 dimension.
    let a = Tensor::from_slice(&[0.0f32, 1.0, 0.0, -2.0, 0.0], &[5, 1], DType::F32).unwrap();
    let col = Tensor::from_slice(&[-3.0f32, 0.0, 2.0, -1.0, 0.0, 0.0, 0.0, 0.0, 1.0], &[9, 1], DType::F32).unwrap();
    for b in [col.t().unwrap(), col.t().unwrap().contiguous().unwrap(), col.view(&[1, 9]).unwrap()] {
        let c = a.matmul(&b).unwrap().to_vec::<f32>().unwrap();
        assert!(c[0] == 0.0 && c[0].is_sign_negative() && c[3].is_sign_negative(), "{:?}: {c:?}", b.strides());
        assert_eq!(c[9..18], [-3.0, 0.0, 2.0, -1.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
    }
}
