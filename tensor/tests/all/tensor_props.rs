//! Property tests: random shapes, random view chains and random broadcasts, every kernel
//! checked against a naive reference on dense row-major data; views never copy, and
//! `contiguous()` of a view equals the reference gather.

use proptest::prelude::*;
use tensormem_tensor::{DType, Tensor};

/// Dense row-major reference data: every view is computed by gathering with index maps.
#[derive(Clone, Debug)]
struct Ref {
    shape: Vec<usize>,
    data: Vec<f64>,
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

impl Ref {
    fn build(shape: Vec<usize>, f: impl Fn(&[usize]) -> f64) -> Ref {
        let data = (0..numel(&shape)).map(|i| f(&unravel(i, &shape))).collect();
        Ref { shape, data }
    }

    fn at(&self, idx: &[usize]) -> f64 {
        let mut off = 0;
        for (d, &i) in idx.iter().enumerate() {
            off = off * self.shape[d] + i;
        }
        self.data[off]
    }

    /// The value at `idx` of this array broadcast to a shape with `idx.len()` dimensions.
    fn at_broadcast(&self, idx: &[usize]) -> f64 {
        let lead = idx.len() - self.shape.len();
        let own: Vec<usize> =
            (0..self.shape.len()).map(|d| if self.shape[d] == 1 { 0 } else { idx[lead + d] }).collect();
        self.at(&own)
    }
}

/// One random view step; its numbers are reduced modulo the current shape.
#[derive(Clone, Debug)]
enum Step {
    Transpose(usize, usize),
    Narrow(usize, usize, usize),
    Select(usize, usize),
    Slice(usize, usize, usize, usize),
    Unsqueeze(usize),
    Expand(usize, usize),
    Permute(usize),
}

fn step() -> impl Strategy<Value = Step> {
    let n = 0usize..64;
    prop_oneof![
        (n.clone(), n.clone()).prop_map(|(a, b)| Step::Transpose(a, b)),
        (n.clone(), n.clone(), n.clone()).prop_map(|(a, b, c)| Step::Narrow(a, b, c)),
        (n.clone(), n.clone()).prop_map(|(a, b)| Step::Select(a, b)),
        (n.clone(), n.clone(), n.clone(), 1usize..4).prop_map(|(a, b, c, s)| Step::Slice(a, b, c, s)),
        n.clone().prop_map(Step::Unsqueeze),
        (n.clone(), 1usize..4).prop_map(|(a, b)| Step::Expand(a, b)),
        n.prop_map(Step::Permute),
    ]
}

/// Applies `s` to both; `None` when the step does not apply (0-d tensor, rank too high).
fn apply(t: &Tensor, r: &Ref, s: &Step) -> Option<(Tensor, Ref)> {
    let nd = r.shape.len();
    if nd == 0 && !matches!(s, Step::Unsqueeze(_)) {
        return None;
    }
    Some(match *s {
        Step::Transpose(a, b) => {
            let (a, b) = (a % nd, b % nd);
            let mut shape = r.shape.clone();
            shape.swap(a, b);
            let rr = Ref::build(shape, |i| {
                let mut j = i.to_vec();
                j.swap(a, b);
                r.at(&j)
            });
            (t.transpose(a as isize, b as isize).unwrap(), rr)
        }
        Step::Narrow(d, start, len) => {
            let d = d % nd;
            let size = r.shape[d];
            let start = start % (size + 1);
            let len = len % (size - start + 1);
            let mut shape = r.shape.clone();
            shape[d] = len;
            let rr = Ref::build(shape, |i| {
                let mut j = i.to_vec();
                j[d] += start;
                r.at(&j)
            });
            (t.narrow(d as isize, start as isize, len).unwrap(), rr)
        }
        Step::Select(d, i) => {
            let d = d % nd;
            if r.shape[d] == 0 {
                return None;
            }
            let i = i % r.shape[d];
            let mut shape = r.shape.clone();
            shape.remove(d);
            let rr = Ref::build(shape, |idx| {
                let mut j = idx.to_vec();
                j.insert(d, i);
                r.at(&j)
            });
            (t.select(d as isize, i as isize).unwrap(), rr)
        }
        Step::Slice(d, start, end, step) => {
            let d = d % nd;
            let size = r.shape[d];
            let start = start % (size + 1);
            let end = start + end % (size - start + 1);
            let mut shape = r.shape.clone();
            shape[d] = (end - start).div_ceil(step);
            let rr = Ref::build(shape, |i| {
                let mut j = i.to_vec();
                j[d] = start + j[d] * step;
                r.at(&j)
            });
            (t.slice(d as isize, start as isize, end as isize, step).unwrap(), rr)
        }
        Step::Unsqueeze(d) => {
            if nd >= 5 {
                return None;
            }
            let d = d % (nd + 1);
            let mut shape = r.shape.clone();
            shape.insert(d, 1);
            let rr = Ref::build(shape, |i| {
                let mut j = i.to_vec();
                j.remove(d);
                r.at(&j)
            });
            (t.unsqueeze(d as isize).unwrap(), rr)
        }
        Step::Expand(d, to) => {
            let d = d % nd;
            if r.shape[d] != 1 {
                return None;
            }
            let mut shape = r.shape.clone();
            shape[d] = to;
            let rr = Ref::build(shape.clone(), |i| {
                let mut j = i.to_vec();
                j[d] = 0;
                r.at(&j)
            });
            let target: Vec<isize> = shape.iter().map(|&s| s as isize).collect();
            (t.expand(&target).unwrap(), rr)
        }
        Step::Permute(seed) => {
            // A rotation by `seed` positions.
            let perm: Vec<usize> = (0..nd).map(|i| (i + seed) % nd).collect();
            let shape = perm.iter().map(|&p| r.shape[p]).collect();
            let rr = Ref::build(shape, |i| {
                let mut j = vec![0; nd];
                for (k, &p) in perm.iter().enumerate() {
                    j[p] = i[k];
                }
                r.at(&j)
            });
            let dims: Vec<isize> = perm.iter().map(|&p| p as isize).collect();
            (t.permute(&dims).unwrap(), rr)
        }
    })
}

fn base(shape: &[usize], seed: u64) -> (Tensor, Ref) {
    let r = Ref::build(shape.to_vec(), |i| {
        let mut h = seed;
        for &x in i {
            h = h.wrapping_mul(31).wrapping_add(x as u64 + 7);
        }
        (h % 41) as f64 - 20.0
    });
    (Tensor::from_slice(&r.data, shape, DType::F64).unwrap(), r)
}

fn chained(shape: &[usize], seed: u64, steps: &[Step]) -> (Tensor, Tensor, Ref) {
    let (t, r) = base(shape, seed);
    let (mut v, mut rv) = (t.clone(), r);
    for s in steps {
        if let Some((nv, nr)) = apply(&v, &rv, s) {
            v = nv;
            rv = nr;
        }
    }
    (t, v, rv)
}

fn shape() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..6, 1..4)
}

/// A shape that broadcasts to `s`: some dimensions set to 1, some leading ones dropped.
fn broadcastable(s: &[usize], mask: u32, drop: usize) -> Vec<usize> {
    let drop = drop % (s.len() + 1);
    s[drop..].iter().enumerate().map(|(i, &x)| if mask >> i & 1 == 1 { 1 } else { x }).collect()
}

fn expected(r: &Ref, rw: &Ref, f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
    (0..r.data.len())
        .map(|i| {
            let idx = unravel(i, &r.shape);
            f(r.at(&idx), rw.at_broadcast(&idx))
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn view_chains_share_storage_and_gather_like_the_reference(
        shape in shape(), seed in any::<u64>(), steps in prop::collection::vec(step(), 0..6)
    ) {
        let (t, v, r) = chained(&shape, seed, &steps);
        prop_assert!(v.shares_storage(&t));
        prop_assert_eq!(v.sizes(), &r.shape[..]);
        prop_assert_eq!(v.to_vec::<f64>().unwrap(), r.data.clone());
        let c = v.contiguous().unwrap();
        prop_assert!(c.is_contiguous());
        prop_assert_eq!(c.to_vec::<f64>().unwrap(), r.data.clone());
        let flat = v.reshape(&[-1]).unwrap();
        prop_assert_eq!(flat.to_vec::<f64>().unwrap(), r.data);
    }

    #[test]
    fn binary_kernels_on_views_and_broadcasts_match_the_reference(
        shape in shape(), seed in any::<u64>(), steps in prop::collection::vec(step(), 0..5),
        mask in any::<u32>(), drop in 0usize..4, seed2 in any::<u64>(), transpose_other in any::<bool>()
    ) {
        let (_, v, r) = chained(&shape, seed, &steps);
        let oshape = broadcastable(&r.shape, mask, drop);
        let (w, rw) = if transpose_other && oshape.len() >= 2 {
            // A transposed operand exercises the tiled path.
            let mut ts = oshape.clone();
            let n = ts.len();
            ts.swap(n - 1, n - 2);
            let (w0, r0) = base(&ts, seed2);
            let w = w0.transpose(-1, -2).unwrap();
            let rw = Ref::build(oshape.clone(), |i| {
                let mut j = i.to_vec();
                j.swap(n - 1, n - 2);
                r0.at(&j)
            });
            (w, rw)
        } else {
            base(&oshape, seed2)
        };
        prop_assert_eq!(v.add(&w).unwrap().to_vec::<f64>().unwrap(), expected(&r, &rw, |a, b| a + b));
        prop_assert_eq!(v.sub(&w).unwrap().to_vec::<f64>().unwrap(), expected(&r, &rw, |a, b| a - b));
        prop_assert_eq!(v.mul(&w).unwrap().to_vec::<f64>().unwrap(), expected(&r, &rw, |a, b| a * b));
        prop_assert_eq!(v.maximum(&w).unwrap().to_vec::<f64>().unwrap(), expected(&r, &rw, f64::max));
        prop_assert_eq!(v.minimum(&w).unwrap().to_vec::<f64>().unwrap(), expected(&r, &rw, f64::min));
        prop_assert_eq!(v.add(&w).unwrap().sizes().to_vec(), r.shape.clone());
        // Integers take the same paths: exact values.
        let (vi, wi) = (v.to_dtype(DType::I32).unwrap(), w.to_dtype(DType::I32).unwrap());
        let want: Vec<i32> = expected(&r, &rw, |a, b| a * b).iter().map(|&x| x as i32).collect();
        prop_assert_eq!(vi.mul(&wi).unwrap().to_vec::<i32>().unwrap(), want);
        let lt: Vec<bool> = expected(&r, &rw, |a, b| (a < b) as u8 as f64).iter().map(|&x| x == 1.0).collect();
        prop_assert_eq!(v.lt(&w).unwrap().to_vec::<bool>().unwrap(), lt);
        // In place into a fresh contiguous copy.
        let c = v.to_dtype(DType::F32).unwrap().to_dtype(DType::F64).unwrap();
        c.add_(&w).unwrap();
        prop_assert_eq!(c.to_vec::<f64>().unwrap(), expected(&r, &rw, |a, b| a + b));
    }

    #[test]
    fn unary_kernels_and_casts_match_the_reference(
        shape in shape(), seed in any::<u64>(), steps in prop::collection::vec(step(), 0..5)
    ) {
        let (_, v, r) = chained(&shape, seed, &steps);
        let got = v.neg().unwrap().to_vec::<f64>().unwrap();
        prop_assert_eq!(got, r.data.iter().map(|x| -x).collect::<Vec<_>>());
        let got = v.relu().unwrap().to_vec::<f64>().unwrap();
        prop_assert_eq!(got, r.data.iter().map(|x| x.max(0.0)).collect::<Vec<_>>());
        let got = v.exp().unwrap().to_vec::<f64>().unwrap();
        prop_assert_eq!(got, r.data.iter().map(|x| x.exp()).collect::<Vec<_>>());
        let got = v.to_dtype(DType::I8).unwrap().to_vec::<i8>().unwrap();
        prop_assert_eq!(got, r.data.iter().map(|&x| x as i8).collect::<Vec<_>>());
        let got = v.to_dtype(DType::F16).unwrap().to_vec::<half::f16>().unwrap();
        prop_assert_eq!(got, r.data.iter().map(|&x| half::f16::from_f32(x as f32)).collect::<Vec<_>>());
    }

    #[test]
    fn reductions_match_the_reference(
        shape in shape(), seed in any::<u64>(), steps in prop::collection::vec(step(), 0..5), dim in 0usize..8
    ) {
        let (_, v, r) = chained(&shape, seed, &steps);
        prop_assert_eq!(v.sum().unwrap().item::<f64>().unwrap(), r.data.iter().sum::<f64>());
        if r.shape.is_empty() {
            return Ok(());
        }
        let d = dim % r.shape.len();
        let mut out_shape = r.shape.clone();
        out_shape.remove(d);
        let lines: Vec<Vec<f64>> = (0..numel(&out_shape))
            .map(|o| {
                let idx = unravel(o, &out_shape);
                (0..r.shape[d])
                    .map(|k| {
                        let mut j = idx.clone();
                        j.insert(d, k);
                        r.at(&j)
                    })
                    .collect()
            })
            .collect();
        let sums: Vec<f64> = lines.iter().map(|l| l.iter().sum()).collect();
        prop_assert_eq!(v.sum_dim(d as isize, false).unwrap().to_vec::<f64>().unwrap(), sums);
        prop_assert_eq!(v.sum_dim(d as isize, true).unwrap().sizes()[d], 1);
        if r.shape[d] > 0 {
            let maxes: Vec<f64> = lines.iter().map(|l| l.iter().copied().fold(f64::NEG_INFINITY, f64::max)).collect();
            prop_assert_eq!(v.max_dim(d as isize, false).unwrap().to_vec::<f64>().unwrap(), maxes);
            let arg: Vec<i64> = lines
                .iter()
                .map(|l| {
                    let mut best = 0;
                    for (k, &x) in l.iter().enumerate() {
                        if x > l[best] {
                            best = k;
                        }
                    }
                    best as i64
                })
                .collect();
            prop_assert_eq!(v.argmax_dim(d as isize, false).unwrap().to_vec::<i64>().unwrap(), arg);
        }
    }

    #[test]
    fn matmul_matches_the_naive_product(
        n in 1usize..7, k in 1usize..7, m in 1usize..7, batch in 1usize..3, seed in any::<u64>(),
        ta in any::<bool>(), tb in any::<bool>()
    ) {
        let (a, ra) = base(&[batch, n, k], seed);
        let (b, rb) = base(&[k, m], seed ^ 1);
        // Optionally pass transposed views (the same values).
        let a = if ta { a.transpose(1, 2).unwrap().contiguous().unwrap().transpose(1, 2).unwrap() } else { a };
        let b = if tb { b.t().unwrap().contiguous().unwrap().t().unwrap() } else { b };
        let got = a.matmul(&b).unwrap().to_vec::<f64>().unwrap();
        let want: Vec<f64> = (0..batch * n * m)
            .map(|o| {
                let i = unravel(o, &[batch, n, m]);
                (0..k).map(|p| ra.at(&[i[0], i[1], p]) * rb.at(&[p, i[2]])).sum()
            })
            .collect();
        prop_assert_eq!(got, want.clone());
        let gi = a.to_dtype(DType::I64).unwrap().matmul(&b.to_dtype(DType::I64).unwrap()).unwrap();
        let want_i: Vec<i64> = want.iter().map(|&x| x as i64).collect();
        prop_assert_eq!(gi.to_vec::<i64>().unwrap(), want_i);
    }
}

/// Large enough to take the tiled and threaded paths: a transposed 300x700 plus a row.
#[test]
fn large_transposed_and_broadcast_inputs_match_the_reference() {
    let (a, ra) = base(&[700, 300], 11);
    let (row, rr) = base(&[700], 12);
    let got = a.t().unwrap().add(&row).unwrap().to_vec::<f64>().unwrap();
    for i in 0..300 {
        for j in 0..700 {
            assert_eq!(got[i * 700 + j], ra.at(&[j, i]) + rr.at(&[j]));
        }
    }
    let c = a.t().unwrap().contiguous().unwrap().to_dtype(DType::F32).unwrap();
    let ct = a.to_dtype(DType::F32).unwrap().t().unwrap().contiguous().unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), ct.to_vec::<f32>().unwrap());
    assert_eq!(ct.get::<f32>(&[5, 7]).unwrap(), ra.at(&[7, 5]) as f32);
}

/// Transposed 1-, 2- and 4-byte tensors go through a register transpose of 16x16, 8x8 or 4x4
/// blocks and element by element at the edges: sizes around multiples of 4, 8 and 16 and of the
/// tile, several tiles and a batch dimension, each element checked against its source.
#[test]
fn transposed_tensors_gather_every_element() {
    let sizes = [
        (8, 8),
        (9, 8),
        (10, 13),
        (8, 9),
        (16, 16),
        (16, 31),
        (17, 33),
        (33, 40),
        (37, 53),
        (64, 96),
        (130, 65),
        (300, 77),
        (1000, 9),
    ];
    for &(rows, cols) in &sizes {
        for &(batch, dt) in &[
            (1, DType::I16),
            (2, DType::F16),
            (1, DType::BF16),
            (1, DType::U8),
            (2, DType::I8),
            (1, DType::Bool),
            (1, DType::F32),
            (2, DType::I32),
        ] {
            let n = batch * rows * cols;
            // Small integers, exact in every one of these types; a third of them zero for bool.
            let data: Vec<f64> = (0..n)
                .map(|i| match dt {
                    DType::U8 => (i % 251) as f64,
                    DType::I8 => (i % 241) as f64 - 120.0,
                    DType::Bool => (i % 3 != 0) as u8 as f64,
                    _ => (i % 509) as f64 - 254.0,
                })
                .collect();
            let t = Tensor::from_slice(&data, &[batch, rows, cols], DType::F64).unwrap().to_dtype(dt).unwrap();
            let tt = t.transpose(1, 2).unwrap();
            // A cast to a wider type into a contiguous tensor reads through the same tiles
            // (`to_dtype` keeps the transposed layout, as PyTorch's `to` does).
            let wider = if dt == DType::F32 { DType::F64 } else { DType::F32 };
            let widened = Tensor::empty(tt.sizes(), wider).unwrap();
            widened.copy_(&tt).unwrap();
            for got in [tt.contiguous().unwrap(), widened] {
                assert!(got.is_contiguous());
                let got = got.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
                for b in 0..batch {
                    for c in 0..cols {
                        for r in 0..rows {
                            let want = data[(b * rows + r) * cols + c];
                            let at = (b * cols + c) * rows + r;
                            assert_eq!(got[at], want, "{dt:?} {batch}x{rows}x{cols}, element [{b}, {c}, {r}]");
                        }
                    }
                }
            }
        }
    }
}
