//! Bad inputs to tensor operations: each gives an error that names the op and the shapes, and
//! leaves the tensors untouched.

use tensormem_tensor::{DType, Tensor, TensorError};

fn t(sizes: &[usize]) -> Tensor {
    let n: usize = sizes.iter().product();
    Tensor::arange(0.0, n as f64, 1.0, DType::F32)
        .unwrap()
        .reshape(&sizes.iter().map(|&s| s as isize).collect::<Vec<_>>())
        .unwrap()
}

fn msg(r: Result<impl std::fmt::Debug, TensorError>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn shapes_that_cannot_broadcast() {
    let e = t(&[3, 4]).add(&t(&[5])).unwrap_err();
    assert!(matches!(e, TensorError::Broadcast { op: "add", dim: 0, lhs_size: 4, rhs_size: 5, .. }), "{e:?}");
    assert_eq!(e.to_string(), "add: shapes [3, 4] and [5] cannot be broadcast (dimension 0 from the right: 4 vs 5)");
    assert!(msg(t(&[2, 3]).lt(&t(&[3, 2]))).starts_with("lt: shapes [2, 3] and [3, 2]"));
    let e = msg(t(&[3]).add_(&t(&[2, 3])));
    assert!(e.starts_with("add_: cannot use shape [2, 3] with a tensor of shape [3]"), "{e}");
}

#[test]
fn dims_and_indices_out_of_range() {
    let x = t(&[2, 3]);
    assert_eq!(
        msg(x.select(2, 0)),
        "select: dimension 2 is out of range for a tensor of shape [2, 3] (expected -2 to 1)"
    );
    assert_eq!(
        msg(x.select(-3, 0)),
        "select: dimension -3 is out of range for a tensor of shape [2, 3] (expected -2 to 1)"
    );
    assert_eq!(
        msg(x.select(1, 3)),
        "select: index 3 is out of range for dimension 1 of size 3 (tensor of shape [2, 3])"
    );
    assert!(msg(x.select(1, -4)).starts_with("select: index -4 is out of range"));
    assert!(msg(x.transpose(0, 5)).starts_with("transpose: dimension 5"));
    assert!(msg(x.unsqueeze(4)).starts_with("unsqueeze: dimension 4"));
    assert!(msg(x.sum_dim(-3, false)).starts_with("sum_dim: dimension -3"));
    assert!(msg(x.softmax(2)).starts_with("softmax: dimension 2"));
    assert_eq!(
        msg(x.get::<f32>(&[0, 3])),
        "get: index 3 is out of range for dimension 1 of size 3 (tensor of shape [2, 3])"
    );
    assert_eq!(msg(x.get::<f32>(&[0])), "get: 1 indices given for a tensor of shape [2, 3]");
    assert!(msg(x.permute(&[0, 0])).starts_with("permute: dimension 0 appears more than once in [0, 0]"));
    assert!(msg(x.permute(&[0])).starts_with("permute: [0] cannot be used with a tensor of shape [2, 3]"));
    assert!(
        msg(x.permute(&[-1, 0, 1])).starts_with("permute: [-1, 0, 1] cannot be used with a tensor of shape [2, 3]")
    );
}

#[test]
fn the_range_a_dimension_error_gives_is_the_range_the_op_accepts() {
    // Inserting a dimension has one more position than the tensor has dimensions.
    assert_eq!(
        msg(t(&[2, 3]).unsqueeze(3)),
        "unsqueeze: dimension 3 is out of range for a tensor of shape [2, 3] (expected -3 to 2)"
    );
    assert!(t(&[2, 3]).unsqueeze(-3).is_ok() && t(&[2, 3]).unsqueeze(2).is_ok());
    // A 0-d tensor: most ops wrap -1 and 0 (PyTorch's rule); size, select, cat and
    // index_select need a real dimension, so no value is in range.
    let s = Tensor::scalar(1.0, DType::F32).unwrap();
    assert_eq!(
        msg(s.unsqueeze(1)),
        "unsqueeze: dimension 1 is out of range for a tensor of shape [] (expected -1 to 0)"
    );
    assert_eq!(
        msg(s.sum_dim(1, false)),
        "sum_dim: dimension 1 is out of range for a tensor of shape [] (expected -1 to 0)"
    );
    let none = "is out of range for a tensor of shape [] (it needs a tensor with at least one dimension)";
    assert_eq!(msg(s.size(0)), format!("size: dimension 0 {none}"));
    assert_eq!(msg(s.size(-1)), format!("size: dimension -1 {none}"));
    assert_eq!(msg(s.select(0, 0)), format!("select: dimension 0 {none}"));
    assert_eq!(msg(Tensor::cat(&[&s, &s], 0)), format!("cat: dimension 0 {none}"));
    let e = s.narrow(0, 0, 1).unwrap_err();
    assert!(matches!(e, TensorError::DimOutOfRange { op: "narrow", positions: 0, .. }), "{e:?}");
}

#[test]
fn views_that_strides_cannot_express() {
    let x = t(&[4, 6]).t().unwrap();
    let e = x.view(&[24]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "view: a tensor of shape [6, 4] and strides [1, 6] cannot be viewed as [24] without a copy; use reshape()"
    );
    assert!(x.reshape(&[24]).is_ok());
    assert_eq!(msg(x.reshape(&[5, 5])), "reshape: shape [5, 5] is invalid for a tensor of shape [6, 4] (24 elements)");
    assert!(msg(x.view(&[-1, -1])).starts_with("view: shape [-1, -1] is invalid"));
    assert!(msg(x.view(&[7, -1])).starts_with("view: shape [7, -1] is invalid"));
}

#[test]
fn as_strided_past_the_end_of_storage() {
    let x = t(&[2, 3]);
    let e = x.as_strided(&[2, 3], &[3, 1], 1).unwrap_err();
    assert_eq!(
        e.to_string(),
        "as_strided: sizes [2, 3], strides [3, 1] and offset 1 reach element 7 but the storage holds 6 elements"
    );
    assert!(x.as_strided(&[3], &[usize::MAX], 0).is_err());
    assert!(msg(x.as_strided(&[3], &[1, 1], 0)).contains("same length"));
    assert!(x.as_strided(&[2, 3], &[3, 1], 0).is_ok());
}

#[test]
fn narrow_refuses_a_range_past_the_end_slice_clamps_it_zero_steps_are_refused() {
    let x = t(&[4, 5]);
    assert_eq!(
        msg(x.narrow(1, 3, 3)),
        "narrow: range start 3, length 3 does not fit in dimension 1 of size 5 (tensor of shape [4, 5])"
    );
    assert!(msg(x.narrow(0, -5, 1)).starts_with("narrow: range start -5"));
    // slice clamps its bounds, as Python's t[2:7] does; only narrow refuses them.
    assert_eq!(x.slice(1, 2, 7, 1).unwrap().sizes(), [4, 3]);
    assert_eq!(x.slice(1, 3, 2, 1).unwrap().sizes(), [4, 0]);
    assert_eq!(msg(x.slice(0, 0, 4, 0)), "slice: step must be greater than zero (tensor of shape [4, 5])");
    assert!(msg(x.chunk(0, 0)).starts_with("chunk: chunks must be greater than zero"));
    assert!(msg(x.split(0, 0)).starts_with("split: split_size must be greater than zero"));
    assert_eq!(
        msg(Tensor::arange(0.0, 1.0, 0.0, DType::F32)),
        "arange: cannot make the range from 0 to 1 by 0: the step must not be zero"
    );
    assert_eq!(
        msg(Tensor::arange(0.0, 1.0, -1.0, DType::F32)),
        "arange: cannot make the range from 0 to 1 by -1: the step goes away from the end"
    );
}

#[test]
fn wrong_rust_types_and_shapes_of_data() {
    let x = t(&[2]);
    assert_eq!(msg(x.to_vec::<i32>()), "to_vec: the tensor holds f32 but i32 was asked for (shape [2])");
    assert!(
        msg(x.item::<f32>()).starts_with("item: a tensor with 2 elements (shape [2]) cannot be converted to a scalar")
    );
    assert!(msg(x.set(&[0], 1i64)).starts_with("set: the tensor holds f32 but i64"));
    assert!(
        msg(Tensor::from_vec(vec![1.0f32; 5], &[2, 3], DType::F32))
            .starts_with("from_vec: cannot use shape [2, 3] with a tensor of shape [5]")
    );
    assert!(msg(Tensor::rand(&[2], DType::I32)).starts_with("rand: not supported for dtype i32"));
    assert!(msg(Tensor::zeros(&[3, 31], DType::Q8_0)).contains("last dimension must be a multiple of 32"));
    assert!(msg(Tensor::ones(&[3, 32], DType::Q8_0)).starts_with("ones: not supported for dtype q8_0"));
    assert!(msg(x.to_dtype(DType::Q4_0)).contains("multiple of 32"));
    assert!(msg(Tensor::ones(&[2], DType::I32).unwrap().mean()).starts_with("mean: not supported for dtype i32"));
    assert!(
        msg(Tensor::ones(&[2], DType::Bool).unwrap().sub(&Tensor::ones(&[2], DType::Bool).unwrap()))
            .starts_with("sub: not supported for dtype bool")
    );
    assert!(
        msg(Tensor::zeros(&[0], DType::F32).unwrap().max())
            .starts_with("max: a tensor of shape [0]: cannot reduce over zero elements")
    );
    // expand names the sizes as given, -1 and negatives included.
    let four = Tensor::zeros(&[4], DType::F32).unwrap();
    assert_eq!(
        msg(four.expand(&[-2])),
        "expand: [-2] cannot be used with a tensor of shape [4]: sizes must be >= 0, or -1 to keep an existing dimension"
    );
    assert!(msg(four.expand(&[-1, 4])).starts_with("expand: [-1, 4] cannot be used with a tensor of shape [4]"));
    assert!(matches!(four.expand(&[3]), Err(TensorError::InvalidArguments { op: "expand", .. })));
    assert_eq!(msg(Tensor::cat(&[], 0)), "cat: no tensors given (it needs at least one)");
    let q = Tensor::zeros(&[2, 32], DType::Q8_0).unwrap();
    assert_eq!(
        msg(q.add(&q)),
        "add: no common dtype for q8_0 and q8_0; quantised tensors are not computed on directly: dequantize with to_dtype(DType::F32) first"
    );
    assert!(msg(Tensor::cat(&[&q, &four], 0)).ends_with("dequantize with to_dtype(DType::F32) first"));
    assert_eq!(msg(Tensor::stack(&[], 1)), "stack: no tensors given (it needs at least one)");
    assert!(msg(Tensor::zeros(&[usize::MAX, 4], DType::F32)).contains("needs more bytes than fit in memory"));
}

#[test]
fn matmul_with_mismatched_inner_dimensions() {
    let e = t(&[2, 3]).matmul(&t(&[4, 5])).unwrap_err();
    assert!(matches!(e, TensorError::MatmulShape { lhs_inner: 3, rhs_inner: 4, .. }));
    assert_eq!(e.to_string(), "matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 vs 4 in the inner dimension)");
    assert!(msg(t(&[3]).matmul(&t(&[4]))).contains("(3 vs 4 in the inner dimension)"));
    assert!(msg(t(&[2, 2, 3]).matmul(&t(&[3, 3, 4]))).starts_with("matmul: shapes [2] and [3] cannot be broadcast"));
    assert!(msg(Tensor::scalar(1.0, DType::F32).unwrap().matmul(&t(&[2]))).contains("at least one dimension"));
}

#[test]
fn overlapping_in_place_outputs() {
    let x = t(&[3, 3]);
    let before = x.to_vec::<f32>().unwrap();
    let e = x.add_(&x.t().unwrap()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "add_: the output (shape [3, 3]) partially overlaps input 0 (shape [3, 3]); clone the input first"
    );
    assert!(matches!(x.mul_(&x.select(0, 1).unwrap()).unwrap_err(), TensorError::PartialOverlap { input: 0, .. }));
    let row = x.select(0, 0).unwrap();
    assert!(row.add_(&x.select(0, 1).unwrap()).is_ok(), "disjoint rows of one storage are fine");
    row.sub_(&x.select(0, 1).unwrap()).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), before, "nothing else changed");
    let expanded = t(&[1, 3]).expand(&[4, 3]).unwrap();
    let e = expanded.add_(&t(&[3])).unwrap_err();
    assert!(
        e.to_string().starts_with("add_: more than one element of the output (shape [4, 3], strides [0, 1])"),
        "{e}"
    );
    assert!(matches!(expanded.relu_().unwrap_err(), TensorError::InternalOverlap { .. }));
    assert!(x.narrow(0, 0, 2).unwrap().copy_(&x.narrow(0, 1, 2).unwrap()).is_err());
}

#[test]
fn mmap_offset_or_length_past_the_end_of_the_file() {
    let path = std::env::temp_dir().join(format!("tensormem-errors-{}.bin", std::process::id()));
    std::fs::write(&path, [0u8; 100]).unwrap();
    // SAFETY: the test owns the file and does not change it while mapped.
    let e = unsafe { Tensor::from_file(&path, 96, DType::F32, &[2]) }.unwrap_err();
    assert!(e.to_string().contains("bytes 96..104 of"), "{e}");
    assert!(e.to_string().ends_with("do not fit in the file (100 bytes)"), "{e}");
    // SAFETY: as above.
    let e = unsafe { Tensor::from_file(&path, 0, DType::F64, &[13]) }.unwrap_err();
    assert!(matches!(e, TensorError::FileRange { len: 104, file_len: 100, .. }), "{e}");
    // SAFETY: as above.
    let e = unsafe { Tensor::from_file(&path, u64::MAX, DType::U8, &[1]) }.unwrap_err();
    assert!(matches!(e, TensorError::FileRange { .. }), "{e}");
    let missing = path.with_extension("missing");
    // SAFETY: as above (the file does not exist).
    let e = unsafe { Tensor::from_file(&missing, 0, DType::U8, &[1]) }.unwrap_err();
    assert!(e.to_string().starts_with("map_file: "), "{e}");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn errors_name_the_method_called_also_where_it_works_through_another() {
    let x = t(&[2, 32]);
    let q = x.to_dtype(DType::Q8_0).unwrap();
    let bool_mask = Tensor::zeros(&[2, 32], DType::Bool).unwrap();
    // Each of these ran another public method and reported that one's name ("sum", "narrow",
    // "permute", "unsqueeze", "add", "full", "where").
    let cases = [
        ("sum_dim", msg(x.sum_dim(2, false))),
        ("mean_dim", msg(q.mean_dim(0, false))),
        ("max_dim", msg(t(&[0, 3]).max_dim(0, false))),
        ("min_dim", msg(x.min_dim(-3, true))),
        ("argmax_dim", msg(x.argmax_dim(2, false))),
        ("squeeze_dim", msg(x.squeeze_dim(3))),
        ("chunk", msg(q.chunk(3, 1))),
        ("split", msg(q.split(5, 1))),
        ("movedim", msg(q.movedim(0, 1))),
        ("t", msg(q.t())),
        ("stack", msg(Tensor::stack(&[&q, &x], 0))),
        ("add_scalar", msg(q.add_scalar(1.0))),
        ("mul_scalar_", msg(t(&[2]).to_dtype(DType::I32).unwrap().mul_scalar_(0.5))),
        ("add_scaled", msg(x.add_scaled(&t(&[3]), 2.0))),
        ("add_scaled_", msg(t(&[1, 32]).add_scaled_(&x, 2.0))),
        ("sub_scaled", msg(q.sub_scaled(&x, 2.0))),
        ("gt_scalar", msg(q.gt_scalar(0.5))),
        ("where_cond", msg(x.where_cond(&x, &x))),
        ("ones", msg(Tensor::ones(&[32], DType::Q8_0))),
        ("ones_like", msg(Tensor::ones_like(&q))),
        ("full_like", msg(Tensor::full_like(&x, f64::NAN).and_then(|_| Tensor::full_like(&q, 1.0)))),
        ("new_ones", msg(q.new_ones(&[32]))),
        ("new_full", msg(x.new_full(&[2], 1e39))),
        ("scalar", msg(Tensor::scalar(300.0, DType::U8))),
        ("zeros", msg(Tensor::zeros(&[1 << 62, 4], DType::F32))),
        ("new_zeros", msg(x.new_zeros(&[1 << 62, 4]))),
        ("masked_fill", msg(q.masked_fill(&bool_mask, 0.0))),
    ];
    for (op, m) in cases {
        assert!(m.starts_with(&format!("{op}: ")), "{op}: {m}");
    }
    // The quantised refusals say what to do.
    assert!(msg(q.masked_fill(&bool_mask, 0.0)).ends_with("dequantize with to_dtype(DType::F32) first"));
    assert!(msg(Tensor::ones(&[32], DType::Q8_0)).ends_with("create the values in f32 and convert with to_dtype"));
    assert!(msg(Tensor::rand(&[3], DType::I64)).contains("random values are made in floating-point dtypes"));
    let e = msg(Tensor::stack(&[&q, &q], 2));
    assert!(e.starts_with("stack: not supported for dtype q8_0") && e.contains("would split the blocks of 32"), "{e}");
    assert_eq!(Tensor::stack(&[&q, &q], 1).unwrap().sizes(), [2, 2, 32]);
}

#[test]
fn empty_views_of_quantised_tensors_keep_no_block_alignment() {
    let q = t(&[2, 32]).to_dtype(DType::Q8_0).unwrap();
    // Empty views: no block is split, whatever the offset and strides (PyTorch takes them all).
    let e = q.narrow(1, 5, 0).unwrap();
    assert_eq!((e.sizes(), e.dtype()), (&[2, 0][..], DType::Q8_0));
    assert_eq!(e.to_dtype(DType::F32).unwrap().sizes(), [2, 0]);
    assert_eq!(q.slice(1, 3, 3, 2).unwrap().sizes(), [2, 0]);
    // An embedding table of empty rows: the lookup was refused by its own reshape ("view").
    let table = Tensor::zeros(&[3, 0], DType::Q8_0).unwrap();
    let ids = Tensor::from_vec(vec![0i64, 2], &[2], DType::I64).unwrap();
    let rows = table.embedding(&ids).unwrap();
    assert_eq!((rows.sizes(), rows.dtype()), (&[2, 0][..], DType::Q8_0));
    // Non-empty views still keep whole blocks, and the last size of an empty one counts them.
    assert!(matches!(q.narrow(1, 5, 1), Err(TensorError::UnsupportedDType { op: "narrow", .. })));
    assert!(matches!(e.view(&[0, 5]), Err(TensorError::UnsupportedDType { op: "view", .. })));
}
