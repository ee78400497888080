//! What a small kernel call asks of the process heap, counted by `tensormem::GlobalAllocator` as the
//! `#[global_allocator]` (its own test binary, one test, since the figures are process-wide).
//!
//! A tensor's sizes and strides sit inline up to 6 dimensions, as do the iteration plan's and
//! the lock list's, so a view allocates nothing and an element-wise op on a fresh output
//! allocates only its storage's header (the data comes from the tensor's allocator). Layouts
//! of more dimensions spill to the heap and give the same values.

use tensormem::GlobalAllocator;
use tensormem_tensor::{DType, Tensor};

#[global_allocator]
static GLOBAL: GlobalAllocator = GlobalAllocator::new();

/// Heap allocations per call of `f`, over `n` calls after a warm-up.
fn allocs_per_call(n: u64, mut f: impl FnMut()) -> f64 {
    for _ in 0..16 {
        f();
    }
    let before = GLOBAL.stats().unwrap().num_allocs;
    for _ in 0..n {
        f();
    }
    (GLOBAL.stats().unwrap().num_allocs - before) as f64 / n as f64
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

#[test]
fn small_ops_allocate_only_their_storage() {
    let a = Tensor::arange(0.0, 120.0, 1.0, DType::F32).unwrap().view(&[2, 3, 4, 5]).unwrap();
    let b = Tensor::full(&[2, 3, 4, 5], 0.5, DType::F32).unwrap();
    let row = Tensor::arange(0.0, 5.0, 1.0, DType::F32).unwrap();
    let at = a.permute(&[3, 1, 2, 0]).unwrap();
    let out = Tensor::zeros_like(&a).unwrap();

    // Views and element access: no heap at all.
    let total = a.sum().unwrap();
    let views = allocs_per_call(1000, || {
        assert_eq!(total.item::<f32>().unwrap(), 7140.0);
        assert_eq!(a.get::<f32>(&[1, 2, -1, 4]).unwrap(), 119.0);
        let v = a.permute(&[0, 2, 1, 3]).unwrap().slice(1, 1, 3, 1).unwrap().unsqueeze(0).unwrap();
        let v = v.expand(&[3, -1, -1, -1, -1]).unwrap().select(0, 1).unwrap().narrow(-1, 1, 3).unwrap();
        assert_eq!(v.sizes(), [2, 2, 3, 3]);
        let w = a.view(&[6, -1]).unwrap().t().unwrap().squeeze().unwrap();
        assert_eq!(w.sizes(), [20, 6]);
    });
    assert_eq!(views, 0.0, "heap allocations per chain of views and reads");

    // Fresh outputs: the storage's header only (element-wise: contiguous, broadcast, permuted;
    // reductions, products, joins, conversions, `*_like`); a number operand is a 0-d tensor,
    // as PyTorch wraps it, with a storage of its own. (Kernels with a working buffer, such as
    // softmax's row scratch or a transposed copy's tiles, allocate it too.)
    let m = Tensor::rand(&[8, 16], DType::F32).unwrap();
    for (name, op, expected) in [
        ("add", Box::new(|| a.add(&b).unwrap()) as Box<dyn Fn() -> Tensor>, 1.0),
        ("add row", Box::new(|| a.add(&row).unwrap()), 1.0),
        ("permuted mul", Box::new(|| at.mul(&at).unwrap()), 1.0),
        ("exp", Box::new(|| at.exp().unwrap()), 1.0),
        ("gelu", Box::new(|| m.gelu().unwrap()), 1.0),
        ("times a number", Box::new(|| &a * 0.125), 2.0),
        ("sum", Box::new(|| a.sum().unwrap()), 1.0),
        ("sum_dim", Box::new(|| a.sum_dim(-1, false).unwrap()), 1.0),
        ("max_dim", Box::new(|| m.max_dim(-1, true).unwrap()), 1.0),
        ("matmul", Box::new(|| m.matmul(&m.t().unwrap()).unwrap()), 1.0),
        ("cat", Box::new(|| Tensor::cat(&[&m, &m], 0).unwrap()), 1.0),
        ("to f16", Box::new(|| at.to_dtype(DType::F16).unwrap()), 1.0),
        ("zeros_like", Box::new(|| Tensor::zeros_like(&at).unwrap()), 1.0),
    ] {
        let per_call = allocs_per_call(1000, || drop(op()));
        assert_eq!(per_call, expected, "heap allocations per {name}");
    }
    // In place and out=: none.
    let into = allocs_per_call(1000, || {
        out.add_(&b).unwrap();
        a.mul_out(&b, &out).unwrap();
    });
    assert_eq!(into, 0.0, "heap allocations per add_ and mul_out");
    assert_eq!(values(&out), values(&a).iter().map(|x| x * 0.5).collect::<Vec<_>>());

    // Eight dimensions spill to the heap and compute the same: a permuted 8-d add against
    // the same add on the contiguous copy.
    let big = Tensor::arange(0.0, 256.0, 1.0, DType::F32).unwrap().view(&[2; 8]).unwrap();
    let p = big.permute(&[7, 0, 6, 1, 5, 2, 4, 3]).unwrap();
    let sum = p.add(&big).unwrap();
    assert_eq!(sum.sizes(), [2; 8]);
    let expected: Vec<f32> = values(&p.contiguous().unwrap()).iter().zip(values(&big)).map(|(x, y)| x + y).collect();
    assert_eq!(values(&sum), expected);
    // Element (1, 0, 0, 0, 0, 0, 0, 1) of `p` is `big`'s (0, 0, 0, 1, 0, 0, 0, 1) = 16 + 1;
    // of `big` it is 128 + 1.
    assert_eq!(sum.get::<f32>(&[1, 0, 0, 0, 0, 0, 0, 1]).unwrap(), 17.0 + 129.0);
    assert_eq!(big.unsqueeze(3).unwrap().squeeze().unwrap().sizes(), [2; 8]);
}
