//! bf16 matmul on AMX tiles (Intel Xeon 4th generation and later) against the f32 route: the
//! same values where the sums are exact, within one bf16 rounding elsewhere; AMX's subnormal
//! flushing; the switch and its environment variable. Where the CPU has no AMX every product
//! takes the f32 route and these tests check that route alone (they say so on stderr).

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

/// `a x b` through the f32 route: exact f32 products and sums, rounded once to bf16.
fn via_f32(a: &Tensor, b: &Tensor) -> Vec<u16> {
    let c = a.to_dtype(DType::F32).unwrap().matmul(&b.to_dtype(DType::F32).unwrap()).unwrap();
    bits(&c.to_dtype(DType::BF16).unwrap())
}

/// The bf16 bits of each element (widening to f32 is exact and keeps them in the top half).
fn bits(t: &Tensor) -> Vec<u16> {
    t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap().iter().map(|x| (x.to_bits() >> 16) as u16).collect()
}

/// Small whole numbers (-4..=4) in bf16, so every product and partial sum is exact in f32.
fn ints(sizes: &[usize], seed: u64) -> Tensor {
    let n: usize = sizes.iter().product();
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 9) as f32 - 4.0
        })
        .collect();
    Tensor::from_vec(v, sizes, DType::F32).unwrap().to_dtype(DType::BF16).unwrap()
}

/// Operand `rows x cols` in one of four layouts: contiguous, transposed, every other column of a
/// wider matrix, every other row of a taller one.
fn layout(rows: usize, cols: usize, kind: usize, seed: u64) -> Tensor {
    match kind {
        0 => ints(&[rows, cols], seed),
        1 => ints(&[cols, rows], seed).t().unwrap(),
        2 => ints(&[rows, 2 * cols], seed).slice(1, 0, 2 * cols as isize, 2).unwrap(),
        _ => ints(&[2 * rows, cols], seed).slice(0, 1, 2 * rows as isize, 2).unwrap(),
    }
}

#[test]
fn whole_number_products_match_the_f32_route_bit_for_bit_in_every_layout_and_edge_size() {
    note_route();
    let shapes = [
        (16, 32, 16),
        (17, 33, 19),
        (31, 63, 33),
        (32, 64, 32),
        (100, 70, 45),
        (64, 1000, 48),
        (130, 257, 65),
        (40, 300, 300),
        (300, 96, 40), // more than 8 panels of 32 rows: B packed whole before the products
        (520, 64, 80),
        (15, 64, 64), // below the tile route's sizes: f32 route either way
        (64, 31, 64), // likewise (k < 32)
        (64, 64, 15), // likewise
    ];
    for (i, &(n, k, m)) in shapes.iter().enumerate() {
        for ka in 0..4 {
            for kb in 0..4 {
                // A product of NaNs first: its freed scratch comes back to the next product, whose
                // padding must be written, not inherited.
                let nan = |r: usize, c: usize| Tensor::full(&[r, c], f64::NAN, DType::BF16).unwrap();
                drop(nan(n, k).matmul(&nan(k, m)).unwrap());
                let a = layout(n, k, ka, (i * 16 + ka * 4 + kb) as u64);
                let b = layout(k, m, kb, (i * 16 + ka * 4 + kb + 1000) as u64);
                let c = a.matmul(&b).unwrap();
                assert_eq!((c.dtype(), c.sizes()), (DType::BF16, &[n, m][..]));
                assert_eq!(bits(&c), via_f32(&a, &b), "{n}x{k}x{m}, layouts {ka}/{kb}");
            }
        }
    }
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
    for &(n, k, m) in &[(64, 512, 64), (33, 4096, 40), (256, 256, 256)] {
        let a = Tensor::randn(&[n, k], DType::F32).unwrap().to_dtype(DType::BF16).unwrap();
        let b = Tensor::randn(&[k, m], DType::F32).unwrap().to_dtype(DType::BF16).unwrap();
        let c = a.matmul(&b).unwrap().to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        let (av, bv) = (
            a.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
            b.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
        );
        for i in 0..n {
            for j in 0..m {
                let (mut exact, mut size) = (0.0, 0.0);
                for p in 0..k {
                    exact += av[i * k + p] * bv[p * m + j];
                    size += (av[i * k + p] * bv[p * m + j]).abs();
                }
                let got = c[i * m + j] as f64;
                // One bf16 rounding (2^-8 relative) plus f32 summation error (k ulps of the sum
                // of magnitudes, generously).
                let bound = exact.abs() / 256.0 + size * (k as f64) * 2f64.powi(-24);
                assert!((got - exact).abs() <= bound, "{n}x{k}x{m} [{i}, {j}]: {got} vs exact {exact}");
            }
        }
    }
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
