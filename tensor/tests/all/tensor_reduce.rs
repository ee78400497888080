//! Reductions along one dimension that is not innermost (`sum_dim`, `mean_dim`, `max_dim`,
//! `min_dim`, `argmax_dim`), against plain loops in f64, in every dtype: shapes whose rows
//! cross the kernel's blocks of rows and tasks of columns, NaN, ties, thread counts, and
//! layouts that take the other path.

use tensormem_tensor::{DType, Tensor, TensorOptions, set_num_threads};

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
    // columns. [4, 6, 15] along 1: 15 columns, moved innermost and reduced as rows. [301, 70]
    // along 0: 70 columns (f16 widened through scratch), 301 rows. [600, 4, 16] along 1: 600
    // tasks of 16 columns and 4 rows.
    let cases: [(&[usize], usize); 7] = [
        (&[603, 40], 0),
        (&[3, 5, 2100], 1),
        (&[7, 9, 16], 0),
        (&[7, 9, 16], 1),
        (&[4, 6, 15], 1),
        (&[301, 70], 0),
        (&[600, 4, 16], 1),
    ];
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
    // Rows of 31 and 63 (one value at a time), 64 and 96 (lanes, no remainder), 117 (a
    // remainder of 21), 2047 (one block), 2048 and 2049 (two), 5000 and 50257 (a
    // vocabulary's logits): values with many ties, so the first maximum is not the only one;
    // then NaN in a first lane, a later lane and the last element.
    for len in [31usize, 63, 64, 96, 117, 2047, 2048, 2049, 5000, 50257] {
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
    // Where the first maximum is against the row's blocks of 1024 (the last one longer, up to
    // 2047): alone, tied with a later one in the same or a later block, after a smaller
    // maximum of an earlier block, and -0.0 tied with +0.0; rows of -inf only.
    for len in [64usize, 1000, 1024, 2047, 2048, 3071, 3072, 4100] {
        for at in [0, 1, 31, 32, 1023, 1024, 1025, 2047, 2048, 3070, 4099].into_iter().filter(|&a| a < len) {
            let mut v: Vec<f32> = (0..len).map(|i| -1.0 - (i % 13) as f32).collect();
            v[at] = 3.0;
            for &later in &[at + 1, at + 40, at + 1100] {
                let mut w = v.clone();
                if later < len {
                    w[later] = 3.0;
                }
                if at > 0 {
                    w[0] = 2.0;
                }
                let x = Tensor::from_vec(w.clone(), &[len], DType::F32).unwrap();
                assert_eq!(x.argmax().unwrap().item::<i64>().unwrap(), at as i64, "rows of {len}, maximum at {at}");
                let h = x.to_dtype(DType::BF16).unwrap();
                assert_eq!(h.argmax().unwrap().item::<i64>().unwrap(), at as i64, "bf16 rows of {len}, at {at}");
                let i = x.to_dtype(DType::I32).unwrap();
                assert_eq!(i.argmax().unwrap().item::<i64>().unwrap(), at as i64, "i32 rows of {len}, at {at}");
            }
            let mut z = vec![-0.0f32; len];
            z[at] = 0.0;
            let x = Tensor::from_vec(z, &[len], DType::F32).unwrap();
            assert_eq!(x.argmax().unwrap().item::<i64>().unwrap(), 0, "zeros of {len}");
            let mut n = vec![-1.0f32; len];
            n[len - 1] = 7.0;
            n[at] = f32::NAN;
            let x = Tensor::from_vec(n, &[len], DType::F32).unwrap();
            assert_eq!(x.argmax().unwrap().item::<i64>().unwrap(), at as i64, "NaN at {at} of {len}");
        }
        let x = Tensor::full(&[2, len], f64::NEG_INFINITY, DType::F32).unwrap();
        assert_eq!(x.argmax_dim(1, false).unwrap().to_vec::<i64>().unwrap(), [0, 0], "-inf rows of {len}");
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

#[test]
fn max_and_min_of_rows_are_exact_and_nan_anywhere_wins() {
    // Rows that end inside the first lanes (5), fill them (32), and cross the row kernel's
    // blocks of 1024 (f16 rows of at least one block are widened a block at a time): the
    // extreme at the start, the end and inside; NaN in the first block, a later one and last.
    for len in [5usize, 32, 33, 1023, 1024, 2047, 2048, 2049, 5000] {
        for dt in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I16, DType::U8] {
            let x = tensor(&[3, len], dt);
            let v = f64s(&x);
            let ls = lines(&v, &[3, len], 1);
            let max: Vec<f64> = ls.iter().map(|l| l.iter().copied().fold(f64::MIN, f64::max)).collect();
            let min: Vec<f64> = ls.iter().map(|l| l.iter().copied().fold(f64::MAX, f64::min)).collect();
            assert_eq!(f64s(&x.max_dim(1, false).unwrap()), max, "{dt:?} max of rows of {len}");
            assert_eq!(f64s(&x.min_dim(1, false).unwrap()), min, "{dt:?} min of rows of {len}");
            assert_eq!(f64s(&x.max().unwrap()), [max.iter().copied().fold(f64::MIN, f64::max)]);
            for at in [0, len - 1, len / 2, 1030.min(len - 1)] {
                let mut w = v.clone();
                w[at] = 120.0;
                w[len + at] = if dt == DType::U8 { 0.0 } else { -120.0 };
                let y = Tensor::from_vec(w.clone(), &[3, len], DType::F64).unwrap().to_dtype(dt).unwrap();
                let got_max = f64s(&y.max_dim(1, false).unwrap());
                let got_min = f64s(&y.min_dim(1, false).unwrap());
                assert_eq!(got_max[0], f64s(&y)[at], "{dt:?} rows of {len}, maximum at {at}");
                assert_eq!(got_min[1], f64s(&y)[len + at], "{dt:?} rows of {len}, minimum at {at}");
                if dt.is_floating_point() {
                    w[2 * len + at] = f64::NAN;
                    let y = Tensor::from_vec(w, &[3, len], DType::F64).unwrap().to_dtype(dt).unwrap();
                    assert!(f64s(&y.max_dim(1, false).unwrap())[2].is_nan(), "{dt:?} rows of {len}, NaN at {at}");
                    assert!(f64s(&y.min_dim(1, false).unwrap())[2].is_nan(), "{dt:?} rows of {len}, NaN at {at}");
                    assert!(f64s(&y.max().unwrap())[0].is_nan());
                }
            }
        }
    }
    // A row of -inf (its maximum is no finite stand-in) and a row of +inf's minimum.
    let x = Tensor::full(&[2, 3000], f64::NEG_INFINITY, DType::F16).unwrap();
    assert_eq!(f64s(&x.max_dim(1, false).unwrap()), [f64::NEG_INFINITY; 2]);
    let x = Tensor::full(&[2, 40], f64::INFINITY, DType::F32).unwrap();
    assert_eq!(f64s(&x.min_dim(1, false).unwrap()), [f64::INFINITY; 2]);
}

#[test]
fn half_precision_extremes_order_every_bit_pattern_as_its_value() {
    // f16 and bf16 maxima and minima compare bit patterns as integers: rows of 1000 patterns
    // scattered over all 65536 (NaNs left out, so every sign, subnormal, infinity and the
    // largest values appear), against the values' order; then a NaN of either sign anywhere.
    type Half = (DType, fn(u16) -> f64, fn(&[u16]) -> Tensor, [u16; 2]);
    let halves: [Half; 2] = [
        (
            DType::F16,
            |b| f64::from(half::f16::from_bits(b).to_f32()),
            |b| Tensor::from_vec(b.iter().map(|&b| half::f16::from_bits(b)).collect(), &[b.len()], DType::F16).unwrap(),
            [0x7E01, 0xFC01],
        ),
        (
            DType::BF16,
            |b| f64::from(half::bf16::from_bits(b).to_f32()),
            |b| {
                Tensor::from_vec(b.iter().map(|&b| half::bf16::from_bits(b)).collect(), &[b.len()], DType::BF16)
                    .unwrap()
            },
            [0x7FC1, 0xFF81],
        ),
    ];
    for (dt, value, tensor, nans) in halves {
        let bits: Vec<u16> =
            (0..65536u32).map(|i| (i.wrapping_mul(40503) as u16) ^ 0x1234).filter(|&b| !value(b).is_nan()).collect();
        for (k, row) in bits.chunks(1000).enumerate() {
            let x = tensor(row);
            let max = row.iter().map(|&b| value(b)).fold(f64::NEG_INFINITY, f64::max);
            let min = row.iter().map(|&b| value(b)).fold(f64::INFINITY, f64::min);
            assert_eq!(f64s(&x.max().unwrap()), [max], "{dt:?} row {k}: max");
            assert_eq!(f64s(&x.min().unwrap()), [min], "{dt:?} row {k}: min");
            for (at, nan) in [(k * 7 % row.len(), nans[0]), (row.len() - 1, nans[1])] {
                let mut with_nan = row.to_vec();
                with_nan[at] = nan;
                let y = tensor(&with_nan);
                assert!(f64s(&y.max().unwrap())[0].is_nan(), "{dt:?} row {k}: NaN {nan:#06x} at {at}, max");
                assert!(f64s(&y.min_dim(0, false).unwrap())[0].is_nan(), "{dt:?} row {k}: NaN {nan:#06x} at {at}, min");
            }
        }
        // The same rows as 50 rows of 20 columns, reduced over dimension 0 (the column
        // kernel), and with a NaN of either sign in column 3.
        for (k, row) in bits.chunks(1000).enumerate().filter(|(_, r)| r.len() == 1000) {
            let x = tensor(row).view(&[50, 20]).unwrap();
            let cols: Vec<Vec<f64>> = (0..20).map(|j| (0..50).map(|i| value(row[i * 20 + j])).collect()).collect();
            let max: Vec<f64> = cols.iter().map(|c| c.iter().copied().fold(f64::NEG_INFINITY, f64::max)).collect();
            let min: Vec<f64> = cols.iter().map(|c| c.iter().copied().fold(f64::INFINITY, f64::min)).collect();
            assert_eq!(f64s(&x.max_dim(0, false).unwrap()), max, "{dt:?} columns of row {k}: max");
            assert_eq!(f64s(&x.min_dim(0, false).unwrap()), min, "{dt:?} columns of row {k}: min");
            for nan in nans {
                let mut with_nan = row.to_vec();
                with_nan[20 * 31 + 3] = nan;
                let y = tensor(&with_nan).view(&[50, 20]).unwrap();
                let (ymax, ymin) = (f64s(&y.max_dim(0, false).unwrap()), f64s(&y.min_dim(0, false).unwrap()));
                assert!(ymax[3].is_nan() && ymin[3].is_nan(), "{dt:?} columns of row {k}: NaN {nan:#06x}");
                assert_eq!((&ymax[..3], &ymin[4..]), (&max[..3], &min[4..]), "{dt:?} columns of row {k}");
            }
        }
        // Zeros of both signs: the maximum is +0 and the minimum -0 (IEEE 754's maximum and
        // minimum; PyTorch's pick between equal zeros depends on their order).
        let zeros: Vec<u16> = (0..300).map(|i| if i % 3 == 0 { 0 } else { 0x8000 }).collect();
        let z = tensor(&zeros);
        assert!(f64s(&z.max().unwrap())[0].is_sign_positive(), "{dt:?} max of zeros");
        assert!(f64s(&z.min().unwrap())[0].is_sign_negative(), "{dt:?} min of zeros");
        // Every column of 15 rows of 20 holds zeros of both signs.
        let zc = z.view(&[15, 20]).unwrap();
        assert!(
            f64s(&zc.max_dim(0, false).unwrap()).iter().all(|v| v.is_sign_positive()),
            "{dt:?} column max of zeros"
        );
        assert!(
            f64s(&zc.min_dim(0, false).unwrap()).iter().all(|v| v.is_sign_negative()),
            "{dt:?} column min of zeros"
        );
        // The same across the row kernel's blocks of 1024: one zero of the other sign, in a
        // later block than all the rest.
        let mut late = vec![0x8000u16; 5000];
        late[4000] = 0;
        assert!(f64s(&tensor(&late).max().unwrap())[0].is_sign_positive(), "{dt:?} max of zeros, +0 late");
        let mut late = vec![0u16; 5000];
        late[4000] = 0x8000;
        assert!(f64s(&tensor(&late).min().unwrap())[0].is_sign_negative(), "{dt:?} min of zeros, -0 late");
        // And across the pieces of two kernel threads (4 MB).
        let mut wide = vec![0x8000u16; 1 << 21];
        wide[(1 << 21) - 1] = 0;
        let wide = tensor(&wide);
        for threads in [1, 2] {
            set_num_threads(threads);
            assert!(f64s(&wide.max().unwrap())[0].is_sign_positive(), "{dt:?} max of zeros, {threads} threads");
            assert!(f64s(&wide.neg().unwrap().min().unwrap())[0].is_sign_negative(), "{dt:?} min, {threads} threads");
        }
    }
}
