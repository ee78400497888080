//! bf16 and f16 matmul on AMX tiles (Intel Xeon 4th generation and later) against the f32
//! route: the same values where the sums are exact, within one rounding elsewhere; AMX's
//! subnormal flushing (bf16 only); f16 infinities and NaNs; the switch and its environment
//! variable. Where the CPU has no AMX every product takes the f32 route and these tests check
//! that route alone (they say so on stderr).

use tensormem::tensor::{AMX_ENV, DType, Tensor, amx_enabled, set_amx};

/// Whether Linux lists AMX-BF16, AMX-TILE and AVX-512BW for this CPU (read independently of the
/// library's own detection).
fn cpu_lists_amx() -> bool {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    cfg!(all(target_arch = "x86_64", target_os = "linux")) && has("amx_bf16") && has("amx_tile") && has("avx512bw")
}

fn note_route() {
    if !amx_enabled() {
        eprintln!("no AMX here: bf16 matmul takes the f32 route, which these tests check alone");
    }
}

/// `a x b` through the f32 route: exact f32 products, f32 sums, rounded once to `a`'s dtype.
fn via_f32(a: &Tensor, b: &Tensor) -> Vec<u16> {
    let c = a.to_dtype(DType::F32).unwrap().matmul(&b.to_dtype(DType::F32).unwrap()).unwrap();
    bits(&c.to_dtype(a.dtype()).unwrap())
}

/// The bits of each element of a bf16 or f16 tensor.
fn bits(t: &Tensor) -> Vec<u16> {
    match t.dtype() {
        DType::F16 => t.to_vec::<half::f16>().unwrap().iter().map(|x| x.to_bits()).collect(),
        _ => t.to_vec::<half::bf16>().unwrap().iter().map(|x| x.to_bits()).collect(),
    }
}

/// Whole numbers `-r..=r` times `scale`, of dtype `dt`, from a seeded xorshift.
fn ints_of(sizes: &[usize], seed: u64, r: u64, scale: f32, dt: DType) -> Tensor {
    let n: usize = sizes.iter().product();
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x % (2 * r + 1)) as f32 - r as f32) * scale
        })
        .collect();
    Tensor::from_vec(v, sizes, DType::F32).unwrap().to_dtype(dt).unwrap()
}

/// Small whole numbers (-4..=4) in bf16, so every product and partial sum is exact in f32.
fn ints(sizes: &[usize], seed: u64) -> Tensor {
    ints_of(sizes, seed, 4, 1.0, DType::BF16)
}

/// Operand `rows x cols` in one of four layouts: contiguous, transposed, every other column of a
/// wider matrix, every other row of a taller one; its values from `make(sizes, seed)`.
fn layout_of(rows: usize, cols: usize, kind: usize, seed: u64, make: impl Fn(&[usize], u64) -> Tensor) -> Tensor {
    match kind {
        0 => make(&[rows, cols], seed),
        1 => make(&[cols, rows], seed).t().unwrap(),
        2 => make(&[rows, 2 * cols], seed).slice(1, 0, 2 * cols as isize, 2).unwrap(),
        _ => make(&[2 * rows, cols], seed).slice(0, 1, 2 * rows as isize, 2).unwrap(),
    }
}

fn layout(rows: usize, cols: usize, kind: usize, seed: u64) -> Tensor {
    layout_of(rows, cols, kind, seed, ints)
}

/// The product sizes the exactness tests run: edges of every tile dimension, few and many
/// panels of 32 rows, and sizes below the tile route's.
const SHAPES: [(usize, usize, usize); 14] = [
    (16, 32, 16),
    (17, 33, 19),
    (31, 63, 33),
    (32, 64, 32),
    (100, 70, 45),
    (64, 1000, 48),
    (130, 257, 65),
    (40, 300, 300),
    (40, 1536, 200), // a long inner dimension: several column groups of B, the last one partial
    (300, 96, 40),   // more than 8 panels of 32 rows: B packed whole before the products
    (520, 64, 80),
    (15, 64, 64), // below the tile route's sizes: f32 route either way
    (64, 31, 64), // likewise (k < 32)
    (64, 64, 15), // likewise
];

/// Calls `check(n, k, m, layout of A, layout of B, seed)` for every shape of [`SHAPES`] and every
/// pair of layouts.
fn every_shape_and_layout(mut check: impl FnMut(usize, usize, usize, usize, usize, u64)) {
    for (i, &(n, k, m)) in SHAPES.iter().enumerate() {
        for ka in 0..4 {
            for kb in 0..4 {
                check(n, k, m, ka, kb, (i * 16 + ka * 4 + kb) as u64);
            }
        }
    }
}

/// `a x b` (matrices) has `a`'s dtype, `n x m` elements and the f32 route's bits.
fn same_as_the_f32_route(a: &Tensor, b: &Tensor, what: &str) {
    let c = a.matmul(b).unwrap();
    assert_eq!((c.dtype(), c.sizes()), (a.dtype(), &[a.sizes()[0], b.sizes()[1]][..]), "{what}");
    assert_eq!(bits(&c), via_f32(a, b), "{what}");
}

/// Random normal `n x k` by `k x m` products in `dt` (the right operand a transposed weight,
/// as `Linear` stores it) within one rounding of `dt` (`unit`, relative; `floor`, absolute)
/// plus f32 summation error (k ulps of the sum of magnitudes, generously) of the exact result.
fn within_one_rounding(dt: DType, shapes: &[(usize, usize, usize)], unit: f64, floor: f64) {
    for &(n, k, m) in shapes {
        let a = Tensor::randn(&[n, k], DType::F32).unwrap().to_dtype(dt).unwrap();
        let b = Tensor::randn(&[m, k], DType::F32).unwrap().to_dtype(dt).unwrap().t().unwrap();
        let c = a.matmul(&b).unwrap().to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        let (av, bv) = (
            a.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
            b.contiguous().unwrap().to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
        );
        for i in 0..n {
            for j in 0..m {
                let (mut exact, mut size) = (0.0, 0.0);
                for p in 0..k {
                    exact += av[i * k + p] * bv[p * m + j];
                    size += (av[i * k + p] * bv[p * m + j]).abs();
                }
                let got = c[i * m + j];
                let bound = exact.abs() * unit + floor + size * (k as f64) * 2f64.powi(-24);
                assert!((got - exact).abs() <= bound, "{dt:?} {n}x{k}x{m} [{i}, {j}]: {got} vs exact {exact}");
            }
        }
    }
}

#[test]
fn whole_number_products_match_the_f32_route_bit_for_bit_in_every_layout_and_edge_size() {
    note_route();
    every_shape_and_layout(|n, k, m, ka, kb, seed| {
        // A product of NaNs first: its freed scratch comes back to the next product, whose
        // padding must be written, not inherited.
        let nan = |r: usize, c: usize| Tensor::full(&[r, c], f64::NAN, DType::BF16).unwrap();
        drop(nan(n, k).matmul(&nan(k, m)).unwrap());
        let (a, b) = (layout(n, k, ka, seed), layout(k, m, kb, seed + 1000));
        same_as_the_f32_route(&a, &b, &format!("{n}x{k}x{m}, layouts {ka}/{kb}"));
    });
}

#[test]
fn batched_and_broadcast_products_match_each_matrix_product() {
    note_route();
    let a = ints(&[3, 1, 40, 64], 1);
    let b = ints(&[2, 64, 48], 2).transpose(1, 2).unwrap().contiguous().unwrap().transpose(1, 2).unwrap();
    let c = a.matmul(&b).unwrap();
    assert_eq!(c.sizes(), [3, 2, 40, 48]);
    for i in 0..3 {
        for j in 0..2 {
            let want = via_f32(&a.select(0, i).unwrap().select(0, 0).unwrap(), &b.select(0, j).unwrap());
            assert_eq!(bits(&c.select(0, i).unwrap().select(0, j).unwrap()), want, "batch {i}, {j}");
        }
    }
    // A matrix times a batch of vectors laid out as matrices, and a 1-D operand.
    let v = ints(&[64], 3);
    let mv = ints(&[50, 64], 4).matmul(&v).unwrap();
    assert_eq!(bits(&mv), via_f32(&ints(&[50, 64], 4), &v.unsqueeze(1).unwrap()));
}

#[test]
fn random_products_are_within_one_bf16_rounding_of_the_exact_result() {
    note_route();
    // One bf16 rounding is 2^-8 relative.
    within_one_rounding(DType::BF16, &[(64, 512, 64), (33, 4096, 40), (256, 256, 256)], 1.0 / 256.0, 0.0);
}

#[test]
fn infinities_and_nans_propagate_like_ieee_arithmetic() {
    let mut a = vec![1.0f32; 32 * 64];
    a[0] = f32::INFINITY; // row 0
    a[64] = f32::NAN; // row 1
    let mut b = vec![1.0f32; 64 * 32];
    b[5] = 0.0; // inner row 0, column 5
    let a = Tensor::from_vec(a, &[32, 64], DType::F32).unwrap().to_dtype(DType::BF16).unwrap();
    let b = Tensor::from_vec(b, &[64, 32], DType::F32).unwrap().to_dtype(DType::BF16).unwrap();
    let c = a.matmul(&b).unwrap().to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(c[0], f32::INFINITY);
    assert!(c[5].is_nan(), "inf x 0 is NaN");
    assert!(c[32..64].iter().all(|x| x.is_nan()), "a NaN row gives NaN");
    for (i, &x) in c.iter().enumerate().skip(64) {
        assert_eq!(x, if i % 32 == 5 { 63.0 } else { 64.0 }, "element {i}");
    }
}

#[test]
fn the_switch_turns_the_tile_route_off_and_on_and_only_amx_flushes_subnormals() {
    let before = amx_enabled();
    // A tiny normal bf16 (2^-120) times 2^-10 is 2^-130: subnormal in f32 and bf16.
    let a = Tensor::full(&[32, 64], 2f64.powi(-120), DType::BF16).unwrap();
    let mut b = vec![0.0f32; 64 * 32];
    b[..32].fill(2f32.powi(-10)); // inner row 0
    let b = Tensor::from_vec(b, &[64, 32], DType::F32).unwrap().to_dtype(DType::BF16).unwrap();
    let first = |c: Tensor| c.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()[0];

    assert!(!set_amx(false));
    assert!(!amx_enabled());
    // 2^-130 is 2^19 times 2^-149, the smallest subnormal (`powi(-130)` overflows on the way
    // in a debug build and gives 0).
    assert_eq!(first(a.matmul(&b).unwrap()), f32::from_bits(1 << 19), "the f32 route keeps subnormal results");

    let on = set_amx(true);
    assert_eq!(on, cpu_lists_amx(), "set_amx(true) is on exactly where the CPU lists AMX-BF16");
    assert_eq!(amx_enabled(), on);
    if on {
        assert_eq!(first(a.matmul(&b).unwrap()), 0.0, "AMX flushes subnormal results to zero, as oneDNN does");
    } else {
        note_route();
    }
    set_amx(before);
}

/// Runs this test binary again with `TENSORMEM_AMX` set, on `child_reads_the_environment`.
fn child(value: &str) -> bool {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_reads_the_environment", "--nocapture"])
        .env(AMX_ENV, value)
        .env("TENSORMEM_TEST_AMX_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child with {AMX_ENV}={value} failed: {stdout}");
    let line = stdout.lines().find_map(|l| l.strip_prefix("amx_enabled=")).expect("the child reports");
    line.trim() == "true"
}

#[test]
fn child_reads_the_environment() {
    if std::env::var_os("TENSORMEM_TEST_AMX_CHILD").is_some() {
        println!("amx_enabled={}", amx_enabled());
    }
}

#[test]
fn the_environment_variable_turns_the_route_off_at_startup() {
    for off in ["0", "off", "FALSE", " false "] {
        assert!(!child(off), "{AMX_ENV}={off:?} turns AMX off");
    }
    for on in ["1", "on", "true", "", "maybe"] {
        assert_eq!(child(on), cpu_lists_amx(), "{AMX_ENV}={on:?} leaves AMX on where the CPU has it");
    }
}

/// Makes an operand of the given sizes from a seed.
type Make = fn(&[usize], u64) -> Tensor;

/// f16 values with 11 significant bits (`-2047..=2047` times 2^-10), which the tile route splits
/// into two bf16 parts, each nonzero for most of them.
fn fine(sizes: &[usize], seed: u64) -> Tensor {
    ints_of(sizes, seed, 2047, 2f32.powi(-10), DType::F16)
}

/// Small whole numbers (-4..=4) in f16 (a high part only).
fn small(sizes: &[usize], seed: u64) -> Tensor {
    ints_of(sizes, seed, 4, 1.0, DType::F16)
}

#[test]
fn f16_products_with_exact_sums_match_the_f32_route_bit_for_bit_in_every_layout_and_edge_size() {
    note_route();
    // |a| < 2, |b| <= 4 and k <= 1536: every product and sum is a multiple of 2^-10 below 2^14,
    // exact in f32, so both routes round the same value once. The fine values go first on the
    // left, then on the right, so the splitting of A and of B (both packings) is checked.
    every_shape_and_layout(|n, k, m, ka, kb, seed| {
        // A product first whose freed scratch comes back to the next one: its padding must be
        // written, not inherited.
        drop(fine(&[n, k], 7).matmul(&fine(&[k, m], 8)).unwrap());
        for (left, right) in [(fine as Make, small as Make), (small, fine)] {
            let (a, b) = (layout_of(n, k, ka, seed, left), layout_of(k, m, kb, seed + 1000, right));
            same_as_the_f32_route(&a, &b, &format!("{n}x{k}x{m}, layouts {ka}/{kb}"));
        }
    });
}

#[test]
fn random_f16_products_are_within_one_f16_rounding_of_the_exact_result() {
    note_route();
    // One f16 rounding is 2^-11 relative, 2^-25 absolute below f16's normals.
    let shapes = [(64, 512, 64), (33, 4096, 40), (256, 256, 256), (300, 768, 100)];
    within_one_rounding(DType::F16, &shapes, 1.0 / 2048.0, 2f64.powi(-25));
}

#[test]
fn f16_infinities_and_nans_give_the_f32_routes_results() {
    note_route();
    // Split into parts, inf x 1 would be inf x 1 + inf x 0 = NaN; such operands take the f32
    // route. Few panels (B packed while multiplying) and many (B packed first), the value in A,
    // in B or in the last matrix of a batch only.
    for &(n, k, m) in &[(32, 64, 32), (300, 96, 40)] {
        for place in 0..4 {
            let mut a = vec![1.0f32; 3 * n * k];
            let mut b = vec![1.0f32; 3 * k * m];
            b[5] = 0.0; // matrix 0, inner row 0, column 5
            match place {
                0 => a[0] = f32::INFINITY,
                1 => a[k] = f32::NAN, // matrix 0, row 1
                2 => b[1] = f32::NEG_INFINITY,
                _ => b[2 * k * m + 3] = f32::INFINITY, // matrix 2, inner row 0, column 3
            }
            let a = Tensor::from_vec(a, &[3, n, k], DType::F32).unwrap().to_dtype(DType::F16).unwrap();
            let b = Tensor::from_vec(b, &[3, k, m], DType::F32).unwrap().to_dtype(DType::F16).unwrap();
            let c = a.matmul(&b).unwrap();
            assert_eq!(bits(&c), via_f32(&a, &b), "{n}x{k}x{m}, place {place}");
            let c = c.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
            let want = |i: usize| match place {
                0 if i < m => {
                    if i == 5 {
                        f32::NAN
                    } else {
                        f32::INFINITY
                    }
                }
                1 if (m..2 * m).contains(&i) => f32::NAN,
                2 if i % m == 1 && i < n * m => f32::NEG_INFINITY,
                3 if i % m == 3 && i >= 2 * n * m => f32::INFINITY,
                _ => k as f32 - if i % m == 5 && i < n * m { 1.0 } else { 0.0 },
            };
            for (i, &x) in c.iter().enumerate() {
                let w = want(i);
                assert!(x == w || (x.is_nan() && w.is_nan()), "{n}x{k}x{m}, place {place}, element {i}: {x} vs {w}");
            }
        }
    }
}

#[test]
fn f16_subnormal_inputs_and_results_are_kept_and_overflow_gives_infinity() {
    note_route();
    // Subnormal f16 values (up to 1023 x 2^-24, normal numbers in bf16) times small whole
    // numbers: exact sums, many of them subnormal f16 results. AMX flushes only bf16
    // subnormals, which no part of an f16 is.
    let a = ints_of(&[40, 64], 3, 1023, 2f32.powi(-24), DType::F16);
    let b = small(&[64, 48], 4);
    let c = a.matmul(&b).unwrap();
    assert_eq!(bits(&c), via_f32(&a, &b));
    let subnormal = bits(&c).iter().filter(|&&x| x & 0x7c00 == 0 && x & 0x3ff != 0).count();
    assert!(subnormal > 100, "{subnormal} subnormal results of 1920");
    // The largest f16 (65504, whose high part 65280 and low part 224 are both exact) times
    // ones overflows to infinity; with alternating signs the sum is exactly zero.
    let big = Tensor::full(&[32, 64], 65504.0, DType::F16).unwrap();
    let ones = Tensor::ones(&[64, 32], DType::F16).unwrap();
    let alt: Vec<f32> = (0..64 * 32).map(|i| if (i / 32) % 2 == 0 { 1.0 } else { -1.0 }).collect();
    let alt = Tensor::from_vec(alt, &[64, 32], DType::F32).unwrap().to_dtype(DType::F16).unwrap();
    let first = |c: Tensor| c.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    assert!(first(big.matmul(&ones).unwrap()).iter().all(|&x| x == f32::INFINITY));
    assert!(first(big.matmul(&alt).unwrap()).iter().all(|&x| x == 0.0));
    let half_big = Tensor::full(&[32, 64], 1023.0, DType::F16).unwrap();
    assert!(first(half_big.matmul(&ones).unwrap()).iter().all(|&x| x == 65472.0), "1023 x 64 is an f16");
}

#[test]
fn f16_products_of_two_fine_operands_use_every_part_of_both() {
    note_route();
    // Both operands with 11 significant bits: each product needs all four products of parts
    // (high and low of each), and its last bits matter after one f16 rounding. A holds at most
    // three nonzero values per row (inner index = row mod 32), so every sum of 22-bit products
    // below 12 is exact in f32 and both routes round the same value.
    for &(n, k, m) in &[(32, 64, 32), (70, 96, 50), (300, 64, 40)] {
        let full = fine(&[n, k], 11).to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        let sparse: Vec<f32> =
            full.iter().enumerate().map(|(i, &x)| if (i % k) % 32 == (i / k) % 32 { x } else { 0.0 }).collect();
        let a = Tensor::from_vec(sparse, &[n, k], DType::F32).unwrap().to_dtype(DType::F16).unwrap();
        for kb in 0..2 {
            let b = layout_of(k, m, kb, 12, fine);
            assert_eq!(bits(&a.matmul(&b).unwrap()), via_f32(&a, &b), "{n}x{k}x{m}, layout {kb}");
        }
    }
}
