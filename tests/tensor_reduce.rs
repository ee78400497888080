//! Reductions along one dimension that is not innermost (`sum_dim`, `mean_dim`, `max_dim`,
//! `min_dim`, `argmax_dim`), against plain loops in f64, in every dtype: shapes whose rows
//! cross the kernel's blocks of rows and tasks of columns, NaN, ties, thread counts, and
//! layouts that take the other path.

use tensormem::tensor::{DType, Tensor, TensorOptions, set_num_threads};

const DTYPES: [DType; 10] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::U8,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::Bool,
];

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// Each output position's line along `d` of `v` (a contiguous tensor of `sizes`).
fn lines(v: &[f64], sizes: &[usize], d: usize) -> Vec<Vec<f64>> {
    let inner: usize = sizes[d + 1..].iter().product();
    let outer: usize = sizes[..d].iter().product();
    let len = sizes[d];
    let mut out = Vec::new();
    for o in 0..outer {
        for j in 0..inner {
            out.push((0..len).map(|r| v[(o * len + r) * inner + j]).collect());
        }
    }
    out
}

/// The first index of the largest value (the first NaN if any), as PyTorch's argmax.
fn first_argmax(line: &[f64]) -> i64 {
    if let Some(i) = line.iter().position(|v| v.is_nan()) {
        return i as i64;
    }
    let mut best = 0;
    for (i, &v) in line.iter().enumerate() {
        if v > line[best] {
            best = i;
        }
    }
    best as i64
}

/// Small integers with ties, which every dtype holds exactly (0 or 1 for bool, 0..100 for
/// u8), so sums are exact in every accumulator.
fn tensor(sizes: &[usize], dt: DType) -> Tensor {
    let n: usize = sizes.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| {
            let k = (i * 7919 % 101) as f32;
            match dt {
                DType::Bool => (k > 50.0) as u8 as f32,
                DType::U8 => k,
                _ => k - 50.0,
            }
        })
        .collect();
    Tensor::from_vec(v, sizes, DType::F32).unwrap().to_dtype(dt).unwrap()
}

#[test]
fn outer_and_middle_dimensions_reduce_to_plain_loop_values_in_every_dtype() {
    // [603, 40] along 0: rows cross the 256-row blocks with a remainder of 3 four-row steps
    // short, 40 columns (a group of 16 and a tail). [3, 5, 2100] along 1: three blocks of
    // columns wider than a 1024-column task. [7, 9, 16] along 0 and 1: 144 and exactly 16
    // columns. [4, 6, 15] along 1: 15 columns, moved innermost and reduced as rows.
    let cases: [(&[usize], usize); 5] =
        [(&[603, 40], 0), (&[3, 5, 2100], 1), (&[7, 9, 16], 0), (&[7, 9, 16], 1), (&[4, 6, 15], 1)];
    for (sizes, d) in cases {
        for dt in DTYPES {
            let x = tensor(sizes, dt);
            let ls = lines(&f64s(&x), sizes, d);
            let what = format!("{dt:?} {sizes:?} along {d}");
            let mut shape = sizes.to_vec();
            shape.remove(d);

            let s = x.sum_dim(d as isize, false).unwrap();
            let want_dtype = if dt.is_floating_point() { dt } else { DType::I64 };
            assert_eq!((s.sizes(), s.dtype()), (&shape[..], want_dtype), "{what}");
            let sums: Vec<f64> = ls.iter().map(|l| l.iter().sum()).collect();
            let want = Tensor::from_vec(sums.clone(), &shape, DType::F64).unwrap().to_dtype(want_dtype).unwrap();
            assert_eq!(f64s(&s), f64s(&want), "{what}: sum");
            let mut kept = sizes.to_vec();
            kept[d] = 1;
            assert_eq!(x.sum_dim(d as isize, true).unwrap().sizes(), &kept[..], "{what}: keepdim");

            if dt.is_floating_point() {
                let n = sizes[d] as f64;
                let tol = if matches!(dt, DType::F16 | DType::BF16) { 1e-2 } else { 1e-6 };
                for (k, (&g, &w)) in f64s(&x.mean_dim(d as isize, false).unwrap()).iter().zip(&sums).enumerate() {
                    assert!((g - w / n).abs() <= tol * (w / n).abs().max(1.0), "{what}: mean {k}: {g} vs {}", w / n);
                }
            } else {
                assert!(x.mean_dim(d as isize, false).is_err(), "{what}: mean of integers");
            }

            if dt == DType::Bool {
                assert!(x.argmax_dim(d as isize, false).is_err(), "{what}: argmax of bool");
                continue;
            }
            let max: Vec<f64> = ls.iter().map(|l| l.iter().copied().fold(f64::MIN, f64::max)).collect();
            let min: Vec<f64> = ls.iter().map(|l| l.iter().copied().fold(f64::MAX, f64::min)).collect();
            let arg: Vec<i64> = ls.iter().map(|l| first_argmax(l)).collect();
            let m = x.max_dim(d as isize, false).unwrap();
            assert_eq!((m.sizes(), m.dtype()), (&shape[..], dt), "{what}");
            assert_eq!(f64s(&m), max, "{what}: max");
            assert_eq!(f64s(&x.min_dim(d as isize, false).unwrap()), min, "{what}: min");
            let a = x.argmax_dim(d as isize, false).unwrap();
            assert_eq!((a.sizes(), a.dtype()), (&shape[..], DType::I64), "{what}");
            assert_eq!(a.to_vec::<i64>().unwrap(), arg, "{what}: argmax");
        }
    }
}

#[test]
fn nan_wins_max_min_and_argmax_of_its_column_only() {
    // NaN at rows 10 and 20 of column 3, at row 602 (the last, in the remainder) of column 39,
    // at row 0 of column 17: those columns' max and min are NaN and their argmax is the first
    // NaN's row; every other column keeps its values.
    let (rows, cols) = (603usize, 40usize);
    let nans = [(10usize, 3usize), (20, 3), (602, 39), (0, 17)];
    for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let mut v = f64s(&tensor(&[rows, cols], dt));
        for &(r, c) in &nans {
            v[r * cols + c] = f64::NAN;
        }
        let x = Tensor::from_vec(v.clone(), &[rows, cols], DType::F64).unwrap().to_dtype(dt).unwrap();
        let ls = lines(&v, &[rows, cols], 0);
        let (max, min, arg) =
            (f64s(&x.max_dim(0, false).unwrap()), f64s(&x.min_dim(0, false).unwrap()), x.argmax_dim(0, false).unwrap());
        let arg = arg.to_vec::<i64>().unwrap();
        for (c, l) in ls.iter().enumerate() {
            let has_nan = nans.iter().any(|&(_, k)| k == c);
            assert_eq!((max[c].is_nan(), min[c].is_nan()), (has_nan, has_nan), "{dt:?} column {c}");
            if !has_nan {
                assert_eq!(max[c], l.iter().copied().fold(f64::MIN, f64::max), "{dt:?} column {c}");
            }
            assert_eq!(arg[c], first_argmax(l), "{dt:?} column {c}");
        }
        assert_eq!((arg[3], arg[39], arg[17]), (10, 602, 0), "{dt:?}");
    }
}

#[test]
fn column_reductions_do_not_depend_on_threads_or_layout() {
    // 2000x1100 f32 (8.8 MB: split between two kernel threads, at a boundary inside a block of
    // columns): the same bits at 1 and 2 threads. The maximum and argmax equal those of the
    // transposed copy reduced as rows; the sums agree with it to rounding.
    let x = Tensor::rand(&[2000, 1100], TensorOptions::new().seed(5)).unwrap();
    let run = |threads: usize| {
        set_num_threads(threads);
        (
            x.sum_dim(0, false).unwrap().to_vec::<f32>().unwrap(),
            x.mean_dim(0, false).unwrap().to_vec::<f32>().unwrap(),
            x.max_dim(0, false).unwrap().to_vec::<f32>().unwrap(),
            x.argmax_dim(0, false).unwrap().to_vec::<i64>().unwrap(),
        )
    };
    let (one, two) = (run(1), run(2));
    assert_eq!(one, two);
    let rows = x.t().unwrap().contiguous().unwrap();
    assert_eq!(rows.max_dim(1, false).unwrap().to_vec::<f32>().unwrap(), one.2);
    assert_eq!(rows.argmax_dim(1, false).unwrap().to_vec::<i64>().unwrap(), one.3);
    let exact = lines(&f64s(&x), &[2000, 1100], 0);
    for (k, (&s, l)) in one.0.iter().zip(&exact).enumerate() {
        let want: f64 = l.iter().sum();
        assert!((f64::from(s) - want).abs() <= 1e-6 * want, "column {k}: {s} vs {want}");
    }
    // A transposed view (dimension 0 innermost in memory) and a strided one take the rows path.
    let t = rows.t().unwrap();
    assert_eq!(t.max_dim(0, false).unwrap().to_vec::<f32>().unwrap(), one.2);
    assert_eq!(t.argmax_dim(0, false).unwrap().to_vec::<i64>().unwrap(), one.3);
    let every_other = x.slice(1, 0, 1100, 2).unwrap();
    let want: Vec<f32> = one.2.iter().step_by(2).copied().collect();
    assert_eq!(every_other.max_dim(0, false).unwrap().to_vec::<f32>().unwrap(), want);
}

#[test]
fn argmax_of_long_rows_is_the_first_maximum_in_every_dtype() {
    // Rows of 31 (one value at a time), 32 and 48 (lanes, no remainder), 117 (a remainder of
    // 5) and 50257 (a vocabulary's logits): values with many ties, so the first maximum is
    // not the only one; then NaN in a first lane, a later lane and the remainder.
    for len in [31usize, 32, 48, 117, 50257] {
        for dt in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::U8, DType::I8, DType::I32, DType::I64] {
            let x = tensor(&[3, len], dt);
            let ls = lines(&f64s(&x), &[3, len], 1);
            let want: Vec<i64> = ls.iter().map(|l| first_argmax(l)).collect();
            assert_eq!(x.argmax_dim(1, false).unwrap().to_vec::<i64>().unwrap(), want, "{dt:?} rows of {len}");
            if !dt.is_floating_point() {
                continue;
            }
            for col in [0, 17, len - 1, len / 2] {
                let mut v = f64s(&x);
                v[len + col] = f64::NAN;
                v[len + len - 1] = f64::NAN;
                let y = Tensor::from_vec(v.clone(), &[3, len], DType::F64).unwrap().to_dtype(dt).unwrap();
                let want: Vec<i64> = lines(&v, &[3, len], 1).iter().map(|l| first_argmax(l)).collect();
                assert_eq!(want[1], col as i64);
                assert_eq!(
                    y.argmax_dim(1, false).unwrap().to_vec::<i64>().unwrap(),
                    want,
                    "{dt:?} rows of {len}, NaN at {col}"
                );
            }
        }
    }
    // The maximum in the remainder, once alone and once tied with an earlier lane.
    for (at, tie) in [(115usize, false), (116, true)] {
        let mut v = vec![0.0f32; 117];
        v[at] = 5.0;
        if tie {
            v[20] = 5.0;
        }
        let x = Tensor::from_vec(v, &[117], DType::F32).unwrap();
        assert_eq!(x.argmax().unwrap().item::<i64>().unwrap(), if tie { 20 } else { at as i64 });
    }
}
