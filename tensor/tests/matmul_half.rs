//! bf16 and f16 matmul on AMX tiles (Intel's server cores from Sapphire Rapids on) and bf16 on
//! AVX512-BF16 registers (by default on AMD Zen 4 and later; Intel's turned on by the switch),
//! and f16 and bf16 products of few rows on AVX-512's or AVX2's fused multiply-adds (CI runs
//! these tests again with `TENSORMEM_CPU_CAPABILITY=avx2` for the second), against the f32
//! route: the same values where the sums are exact, within one rounding elsewhere; the hardware routes' subnormal
//! flushing (bf16 only); f16 infinities and NaNs; the switches and their environment variables.
//! The bf16 tests run every route this CPU has in turn; where it has neither AMX nor
//! AVX512-BF16 they check the f32 route alone (they say so on stderr).

use std::sync::Mutex;

use tensormem_tensor::{
    AMX_ENV, AVX512_BF16_ENV, CPU_CAPABILITY_ENV, DType, Tensor, amx_enabled, avx512_bf16_enabled, cpu_capability,
    set_amx, set_avx512_bf16,
};

/// Whether Linux lists each of `wanted` (and AVX-512 F, BW and VL) for this CPU (read
/// independently of the library's own detection), and `TENSORMEM_CPU_CAPABILITY` does not cap
/// the kernels below AVX-512 (`cpu_capability` reads the cap; `tests/cpu_capability.rs` checks
/// it).
fn cpu_lists(wanted: &[&str]) -> bool {
    let capped = std::env::var_os(CPU_CAPABILITY_ENV).is_some() && cpu_capability() != "avx512";
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    !capped
        && cfg!(all(target_arch = "x86_64", target_os = "linux"))
        && ["avx512f", "avx512bw", "avx512vl"].iter().chain(wanted).all(|f| has(f))
}

fn cpu_lists_amx() -> bool {
    cpu_lists(&["amx_bf16", "amx_tile"])
}

fn cpu_lists_avx512_bf16() -> bool {
    cpu_lists(&["avx512_bf16"])
}

/// Whether AVX512-BF16's route is on by default here: the CPU lists it and is AMD's, whose
/// `vdpbf16ps` outruns its f32 multiply-adds (Intel's runs at half their rate).
fn avx512_bf16_by_default() -> bool {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let amd = info.lines().any(|l| l.starts_with("vendor_id") && l.ends_with("AuthenticAMD"));
    cpu_lists_avx512_bf16() && amd
}

/// Whether Linux lists AVX-512 F, BW and VL: products of few rows by a transposed weight run as
/// dot products on fused multiply-adds where no faster route is on.
fn cpu_lists_avx512() -> bool {
    cpu_lists(&[])
}

fn note_route() {
    if !amx_enabled() {
        eprintln!("no AMX here: f16 matmul takes the f32 route, which these tests check alone");
    }
}

/// The name [`on_each_bf16_route`] gives the f32 route.
const F32_ROUTE: &str = "f32 route";

/// Serialises the tests that turn the switches, so that each product takes the route its test set.
static SWITCHES: Mutex<()> = Mutex::new(());

/// Runs `check(route)` on every bf16 route this CPU has, in turn: AMX tiles, AVX512-BF16
/// registers, the f32 route (whose products of few rows by a transposed weight run as dot
/// products on fused multiply-adds on AVX-512, with its arithmetic); then restores the switches.
fn on_each_bf16_route(mut check: impl FnMut(&str)) {
    let _only_us = SWITCHES.lock().unwrap_or_else(|e| e.into_inner());
    let before = (amx_enabled(), avx512_bf16_enabled());
    if set_amx(true) {
        check("AMX tiles");
    }
    set_amx(false);
    if set_avx512_bf16(true) {
        check("AVX512-BF16");
    } else {
        eprintln!("no AVX512-BF16 here: that route is not checked");
    }
    set_avx512_bf16(false);
    check(F32_ROUTE);
    set_amx(before.0);
    set_avx512_bf16(before.1);
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
const SHAPES: [(usize, usize, usize); 20] = [
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
    // Fewer than 16 rows: the f32 route, or dot products of rows and columns (bf16 on
    // AVX512-BF16, f16 on AVX-512) where B's columns are contiguous (layout 1; also for the
    // shapes above of fewer than 32 rows); inner sizes below, at and past a step (32 bf16, 16
    // f16), columns past the kernel's blocks of 4, a single column and a single inner element.
    (15, 64, 64),
    (1, 768, 70),
    (7, 33, 5),
    (5, 1, 9),
    (2, 100, 1),
    (13, 300, 200),
    // By B's rows (layout 0): more columns than one span of the by-rows kernel's sums (1024),
    // the last span's columns past its 8-lane steps, an inner size past its steps of 4 rows.
    (2, 37, 1030),
    (64, 31, 64), // below the tile route's sizes: f32 route either way (k < 32)
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
/// With `any_zero`, a zero of either sign matches a zero: the bf16 hardware routes start each
/// sum at +0 and add the zero pairs that pad an odd inner size, so an exact sum of -0 products
/// (`0 x -3`) comes out +0 there.
fn same_as_the_f32_route(a: &Tensor, b: &Tensor, what: &str, any_zero: bool) {
    let c = a.matmul(b).unwrap();
    assert_eq!((c.dtype(), c.sizes()), (a.dtype(), &[a.sizes()[0], b.sizes()[1]][..]), "{what}");
    let zero = |v: Vec<u16>| -> Vec<u16> {
        if any_zero { v.into_iter().map(|x| if x == 0x8000 { 0 } else { x }).collect() } else { v }
    };
    assert_eq!(zero(bits(&c)), zero(via_f32(a, b)), "{what}");
}

/// Random normal `n x k` by `k x m` products in `dt` (the right operand a transposed weight,
/// as `Linear` stores it, and one with contiguous rows, as GPT-2's `Conv1D`) within one
/// rounding of `dt` (`unit`, relative; `floor`, absolute) plus f32 summation error (k ulps of
/// the sum of magnitudes, generously) of the exact result.
fn within_one_rounding(dt: DType, shapes: &[(usize, usize, usize)], unit: f64, floor: f64) {
    for (&(n, k, m), b_rows) in shapes.iter().flat_map(|s| [(s, false), (s, true)]) {
        let a = Tensor::randn(&[n, k], DType::F32).unwrap().to_dtype(dt).unwrap();
        let b = if b_rows {
            Tensor::randn(&[k, m], DType::F32).unwrap().to_dtype(dt).unwrap()
        } else {
            Tensor::randn(&[m, k], DType::F32).unwrap().to_dtype(dt).unwrap().t().unwrap()
        };
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
                let what = format!("{dt:?} {n}x{k}x{m}, b's rows contiguous: {b_rows}, [{i}, {j}]");
                assert!((got - exact).abs() <= bound, "{what}: {got} vs exact {exact}");
            }
        }
    }
}

#[test]
fn whole_number_products_match_the_f32_route_bit_for_bit_in_every_layout_and_edge_size() {
    on_each_bf16_route(|route| {
        every_shape_and_layout(|n, k, m, ka, kb, seed| {
            // A product of NaNs first: its freed scratch comes back to the next product, whose
            // padding must be written, not inherited.
            let nan = |r: usize, c: usize| Tensor::full(&[r, c], f64::NAN, DType::BF16).unwrap();
            drop(nan(n, k).matmul(&nan(k, m)).unwrap());
            let (a, b) = (layout(n, k, ka, seed), layout(k, m, kb, seed + 1000));
            let what = format!("{route}: {n}x{k}x{m}, layouts {ka}/{kb}");
            same_as_the_f32_route(&a, &b, &what, route != F32_ROUTE);
        });
    });
}

#[test]
fn batched_and_broadcast_products_match_each_matrix_product() {
    on_each_bf16_route(|route| {
        let a = ints(&[3, 1, 40, 64], 1);
        let b = ints(&[2, 64, 48], 2).transpose(1, 2).unwrap().contiguous().unwrap().transpose(1, 2).unwrap();
        let c = a.matmul(&b).unwrap();
        assert_eq!(c.sizes(), [3, 2, 40, 48]);
        for i in 0..3 {
            for j in 0..2 {
                let want = via_f32(&a.select(0, i).unwrap().select(0, 0).unwrap(), &b.select(0, j).unwrap());
                assert_eq!(bits(&c.select(0, i).unwrap().select(0, j).unwrap()), want, "{route}: batch {i}, {j}");
            }
        }
        // A matrix times a batch of vectors laid out as matrices, and a 1-D operand.
        let v = ints(&[64], 3);
        let mv = ints(&[50, 64], 4).matmul(&v).unwrap();
        assert_eq!(bits(&mv), via_f32(&ints(&[50, 64], 4), &v.unsqueeze(1).unwrap()), "{route}");
        // A decode step: a vector times a transposed weight, and one query per head times the
        // transposed keys (few rows, B's columns contiguous).
        let w = ints(&[96, 64], 5);
        let vw = v.matmul(&w.t().unwrap()).unwrap();
        assert_eq!(vw.sizes(), [96]);
        assert_eq!(bits(&vw), via_f32(&v.unsqueeze(0).unwrap(), &w.t().unwrap()), "{route}: vector x weight");
        // The weight broadcast over a batch of token groups, and a right operand whose batch
        // dimension has stride 1 (its rows do not: the route reads B's rows' stride, not that).
        let x = ints(&[2, 3, 64], 8);
        let xw = x.matmul(&w.t().unwrap()).unwrap();
        for i in 0..2 {
            let want = via_f32(&x.select(0, i).unwrap(), &w.t().unwrap());
            assert_eq!(bits(&xw.select(0, i).unwrap()), want, "{route}: weight broadcast, batch {i}");
        }
        let odd = ints(&[64, 40, 3], 9).permute(&[2, 0, 1]).unwrap();
        assert_eq!(odd.strides(), [1, 120, 3]);
        let xo = ints(&[2, 3, 4, 64], 10);
        let c = xo.matmul(&odd).unwrap();
        for i in 0..2 {
            for j in 0..3 {
                let (l, r) = (xo.select(0, i).unwrap().select(0, j).unwrap(), odd.select(0, j).unwrap());
                assert_eq!(bits(&c.select(0, i).unwrap().select(0, j).unwrap()), via_f32(&l, &r), "{route}: {i}, {j}");
            }
        }
        let (q, keys) = (ints(&[12, 1, 64], 6), ints(&[12, 40, 64], 7));
        let scores = q.matmul(&keys.transpose(1, 2).unwrap()).unwrap();
        assert_eq!(scores.sizes(), [12, 1, 40]);
        for h in 0..12 {
            let want = via_f32(&q.select(0, h).unwrap(), &keys.select(0, h).unwrap().t().unwrap());
            assert_eq!(bits(&scores.select(0, h).unwrap()), want, "{route}: head {h}");
        }
    });
}

#[test]
fn random_products_are_within_one_bf16_rounding_of_the_exact_result() {
    // One bf16 rounding is 2^-8 relative.
    on_each_bf16_route(|route| {
        eprintln!("{route}");
        let shapes = [(64, 512, 64), (33, 4096, 40), (256, 256, 256), (4, 1000, 37), (1, 768, 2304), (3, 1000, 1030)];
        within_one_rounding(DType::BF16, &shapes, 1.0 / 256.0, 0.0);
    });
}

#[test]
fn infinities_and_nans_propagate_like_ieee_arithmetic() {
    on_each_bf16_route(|route| {
        let mut a = vec![1.0f32; 32 * 64];
        a[0] = f32::INFINITY; // row 0
        a[64] = f32::NAN; // row 1
        let mut b = vec![1.0f32; 64 * 32];
        b[5] = 0.0; // inner row 0, column 5
        let a = Tensor::from_vec(a, &[32, 64], DType::F32).unwrap().to_dtype(DType::BF16).unwrap();
        let b = Tensor::from_vec(b, &[64, 32], DType::F32).unwrap().to_dtype(DType::BF16).unwrap();
        let c = a.matmul(&b).unwrap().to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(c[0], f32::INFINITY, "{route}");
        assert!(c[5].is_nan(), "{route}: inf x 0 is NaN");
        assert!(c[32..64].iter().all(|x| x.is_nan()), "{route}: a NaN row gives NaN");
        for (i, &x) in c.iter().enumerate().skip(64) {
            assert_eq!(x, if i % 32 == 5 { 63.0 } else { 64.0 }, "{route}: element {i}");
        }
    });
}

#[test]
fn the_switches_turn_the_hardware_routes_off_and_on_and_only_they_flush_subnormals() {
    let _only_us = SWITCHES.lock().unwrap_or_else(|e| e.into_inner());
    let before = (amx_enabled(), avx512_bf16_enabled());
    // A tiny normal bf16 (2^-120) times 2^-10 is 2^-130: subnormal in f32 and bf16.
    let a = Tensor::full(&[32, 64], 2f64.powi(-120), DType::BF16).unwrap();
    let mut b = vec![0.0f32; 64 * 32];
    b[..32].fill(2f32.powi(-10)); // inner row 0
    let b = Tensor::from_vec(b, &[64, 32], DType::F32).unwrap().to_dtype(DType::BF16).unwrap();
    let first = |c: Tensor| c.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()[0];
    // And a subnormal input: 2^-130 (in bf16) times 1.
    let tiny = Tensor::full(&[32, 64], 2f64.powi(-130), DType::BF16).unwrap();
    let mut ones = vec![0.0f32; 64 * 32];
    ones[..32].fill(1.0);
    let ones = Tensor::from_vec(ones, &[64, 32], DType::F32).unwrap().to_dtype(DType::BF16).unwrap();

    assert!(!set_amx(false));
    assert!(!amx_enabled());
    assert!(!set_avx512_bf16(false));
    assert!(!avx512_bf16_enabled());
    // 2^-130 is 2^19 times 2^-149, the smallest subnormal (`powi(-130)` overflows on the way
    // in a debug build and gives 0).
    let subnormal = f32::from_bits(1 << 19);
    assert_eq!(first(a.matmul(&b).unwrap()), subnormal, "the f32 route keeps subnormal results");
    assert_eq!(first(tiny.matmul(&ones).unwrap()), subnormal, "and reads subnormal inputs");
    // Fewer rows than a panel by B's columns: dot products on fused multiply-adds on AVX-512,
    // with the f32 route's arithmetic.
    let few = |t: &Tensor| t.slice(0, 0, 15, 1).unwrap();
    let b_columns = b.t().unwrap().contiguous().unwrap().t().unwrap();
    let ones_columns = ones.t().unwrap().contiguous().unwrap().t().unwrap();
    assert_eq!(first(few(&a).matmul(&b_columns).unwrap()), subnormal, "15 rows by B's columns keep them");
    assert_eq!(first(few(&tiny).matmul(&ones_columns).unwrap()), subnormal, "and read subnormal inputs");

    let on = set_avx512_bf16(true);
    assert_eq!(on, cpu_lists_avx512_bf16(), "set_avx512_bf16(true) is on exactly where the CPU lists AVX512-BF16");
    assert_eq!(avx512_bf16_enabled(), on);
    if on {
        assert_eq!(first(a.matmul(&b).unwrap()), 0.0, "vdpbf16ps flushes subnormal results to zero");
        assert_eq!(first(tiny.matmul(&ones).unwrap()), 0.0, "and reads subnormal inputs as zero");
        // Fewer than 16 rows: dot products on the same registers where B's columns are
        // contiguous, else the f32 route.
        assert_eq!(first(few(&a).matmul(&b_columns).unwrap()), 0.0, "15 rows by B's columns flush too");
        assert_eq!(first(few(&tiny).matmul(&ones_columns).unwrap()), 0.0, "and read subnormal inputs as zero");
        assert_eq!(first(few(&a).matmul(&b).unwrap()), subnormal, "15 rows by B's rows keep them (widened)");
        // f16 products do not take it.
        let (ah, bh) = (a.to_dtype(DType::F16).unwrap(), b.to_dtype(DType::F16).unwrap());
        assert_eq!(bits(&ah.matmul(&bh).unwrap()), via_f32(&ah, &bh), "f16 takes the f32 route");
    } else {
        eprintln!("no AVX512-BF16 here: bf16 matmul without AMX takes the f32 route");
    }
    set_avx512_bf16(false);

    let on = set_amx(true);
    assert_eq!(on, cpu_lists_amx(), "set_amx(true) is on exactly where the CPU lists AMX-BF16");
    assert_eq!(amx_enabled(), on);
    if on {
        assert_eq!(first(a.matmul(&b).unwrap()), 0.0, "AMX flushes subnormal results to zero, as oneDNN does");
    } else {
        note_route();
        assert_eq!(first(a.matmul(&b).unwrap()), subnormal, "AVX512-BF16 stays off: the f32 route");
    }
    set_amx(before.0);
    set_avx512_bf16(before.1);
}

/// Runs this test binary again with `env` set to `value`, on `child_reads_the_environment`;
/// returns what the child reports for (`amx_enabled`, `avx512_bf16_enabled`).
fn child(env: &str, value: &str) -> (bool, bool) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_reads_the_environment", "--nocapture"])
        .env_remove(AMX_ENV)
        .env_remove(AVX512_BF16_ENV)
        .env(env, value)
        .env("TENSORMEM_TEST_AMX_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child with {env}={value} failed: {stdout}");
    let line = stdout.lines().find_map(|l| l.strip_prefix("enabled=")).expect("the child reports");
    let mut v = line.trim().split(',').map(|x| x == "true");
    (v.next().unwrap(), v.next().unwrap())
}

#[test]
fn child_reads_the_environment() {
    if std::env::var_os("TENSORMEM_TEST_AMX_CHILD").is_some() {
        println!("enabled={},{}", amx_enabled(), avx512_bf16_enabled());
    }
}

#[test]
fn the_environment_variables_turn_the_routes_off_at_startup() {
    let (amx, dots) = (cpu_lists_amx(), cpu_lists_avx512_bf16());
    for off in ["0", "off", "FALSE", " false "] {
        let by_default = avx512_bf16_by_default();
        assert_eq!(child(AMX_ENV, off), (false, by_default), "{AMX_ENV}={off:?} turns AMX off, AVX512-BF16 alone");
        assert_eq!(child(AVX512_BF16_ENV, off), (amx, false), "{AVX512_BF16_ENV}={off:?} turns AVX512-BF16 off");
    }
    // Unset, empty or unreadable: each route's default (AVX512-BF16's: on AMD only).
    let by_default = avx512_bf16_by_default();
    for value in ["", "maybe"] {
        for env in [AMX_ENV, AVX512_BF16_ENV] {
            assert_eq!(child(env, value), (amx, by_default), "{env}={value:?} leaves both at their default");
        }
    }
    for on in ["1", "on", "TRUE", " true "] {
        assert_eq!(child(AMX_ENV, on), (amx, by_default), "{AMX_ENV}={on:?}: AMX where the CPU has it");
        assert_eq!(child(AVX512_BF16_ENV, on), (amx, dots), "{AVX512_BF16_ENV}={on:?}: wherever the CPU has it");
    }
}

#[test]
fn avx512_bf16_is_on_by_default_only_where_it_outruns_f32_multiply_adds() {
    // Read by a child with neither variable set (`child` removes both, then sets AMX's to on).
    let (amx, dots) = child(AMX_ENV, "1");
    assert_eq!(amx, cpu_lists_amx());
    assert_eq!(dots, avx512_bf16_by_default(), "AVX512-BF16 on by default exactly on AMD CPUs that list it");
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
            same_as_the_f32_route(&a, &b, &format!("{n}x{k}x{m}, layouts {ka}/{kb}"), false);
        }
    });
}

#[test]
fn random_f16_products_are_within_one_f16_rounding_of_the_exact_result() {
    note_route();
    // One f16 rounding is 2^-11 relative, 2^-25 absolute below f16's normals.
    let shapes = [(64, 512, 64), (33, 4096, 40), (256, 256, 256), (300, 768, 100), (2, 768, 1030)];
    within_one_rounding(DType::F16, &shapes, 1.0 / 2048.0, 2f64.powi(-25));
}

#[test]
fn f16_infinities_and_nans_give_the_f32_routes_results() {
    note_route();
    // Split into parts, inf x 1 would be inf x 1 + inf x 0 = NaN; such operands take the f32
    // route. Few panels (B packed while multiplying) and many (B packed first), the value in A,
    // in B or in the last matrix of a batch only.
    // And 5 rows: dot products by B's columns where they are contiguous; here, by its rows.
    for &(n, k, m) in &[(32, 64, 32), (300, 96, 40), (5, 64, 40)] {
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
    let few = a.narrow(0, 0, 5).unwrap();
    assert_eq!(bits(&few.matmul(&b).unwrap()), via_f32(&few, &b), "5 rows by B's rows");
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

/// 3 rows by a transposed 40 x 64 weight in `dt`: row 0 holds an infinity, row 1 a NaN, the
/// weight's column 5 a zero; each result is IEEE arithmetic's.
fn few_row_infinities_and_nans(dt: DType) {
    let mut a = vec![1.0f32; 3 * 64];
    a[0] = f32::INFINITY;
    a[64] = f32::NAN;
    let mut wv = vec![1.0f32; 40 * 64];
    wv[5 * 64] = 0.0;
    let a = Tensor::from_vec(a, &[3, 64], DType::F32).unwrap().to_dtype(dt).unwrap();
    let w = Tensor::from_vec(wv, &[40, 64], DType::F32).unwrap().to_dtype(dt).unwrap().t().unwrap();
    let c = a.matmul(&w).unwrap().to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    for (i, &x) in c.iter().enumerate() {
        let (r, col) = (i / 40, i % 40);
        let want = match (r, col) {
            (0, 5) | (1, _) => f32::NAN,
            (0, _) => f32::INFINITY,
            (_, 5) => 63.0,
            _ => 64.0,
        };
        assert!(x == want || (x.is_nan() && want.is_nan()), "{dt:?} [{r}, {col}]: {x} vs {want}");
    }
}

#[test]
fn few_row_f16_products_keep_the_f32_routes_values_and_empty_sums_are_positive_zero() {
    note_route();
    // Fewer than 32 rows by a transposed weight: dot products of rows and columns where the CPU
    // has AVX-512, with the f32 route's arithmetic. Subnormal inputs and results are kept.
    let sub = ints_of(&[8, 64], 3, 1023, 2f32.powi(-24), DType::F16);
    let w = small(&[48, 64], 4).t().unwrap();
    let c = sub.matmul(&w).unwrap();
    assert_eq!(bits(&c), via_f32(&sub, &w));
    let subnormal = bits(&c).iter().filter(|&&x| x & 0x7c00 == 0 && x & 0x3ff != 0).count();
    assert!(subnormal > 10, "{subnormal} subnormal results of 384");
    few_row_infinities_and_nans(DType::F16);
    // An empty inner dimension: +0 on every route, in both dtypes.
    on_each_bf16_route(|route| {
        for dt in [DType::BF16, DType::F16] {
            let a = Tensor::zeros(&[3, 0], dt).unwrap();
            let w = Tensor::zeros(&[5, 0], dt).unwrap().t().unwrap();
            let c = a.matmul(&w).unwrap();
            assert_eq!(c.sizes(), [3, 5]);
            assert_eq!(bits(&c), vec![0u16; 15], "{route}, {dt:?}");
        }
    });
}

#[test]
fn few_row_bf16_products_off_avx512_bf16_keep_the_f32_routes_values() {
    let _only_us = SWITCHES.lock().unwrap_or_else(|e| e.into_inner());
    let before = (amx_enabled(), avx512_bf16_enabled());
    set_amx(false);
    set_avx512_bf16(false);
    if !cpu_lists_avx512() {
        eprintln!("no AVX-512 here: few-row bf16 products take the f32 route, which this checks alone");
    }
    // Subnormal bf16 (multiples of 2^-133) by small whole numbers: exact sums, subnormal results.
    // (`powi(-133)` overflows on the way in a debug build; this is 2^-133.)
    let sub = ints_of(&[8, 64], 3, 127, f32::from_bits(1 << 16), DType::BF16);
    let w = ints(&[48, 64], 4).t().unwrap();
    let c = sub.matmul(&w).unwrap();
    assert_eq!(bits(&c), via_f32(&sub, &w), "subnormal inputs and results are kept");
    let subnormal = bits(&c).iter().filter(|&&x| x & 0x7f80 == 0 && x & 0x7f != 0).count();
    assert!(subnormal > 10, "{subnormal} subnormal results of 384");
    // A sum of only -0 products is -0 on AVX-512, the exact sum (the f32 route's gemm, which
    // takes them elsewhere, gives -0 or +0 by shape); odd inner sizes and one row.
    for (n, k) in [(1, 1), (3, 17), (31, 33), (5, 100)] {
        let z = Tensor::full(&[n, k], -0.0, DType::BF16).unwrap();
        let w = ints(&[9, k], 5).abs().unwrap().t().unwrap();
        let sums = bits(&z.matmul(&w).unwrap());
        if cpu_lists_avx512() {
            assert_eq!(sums, vec![0x8000; n * 9], "{n}x{k}: -0 sums");
        } else {
            assert!(sums.iter().all(|&x| x & 0x7fff == 0), "{n}x{k}: zero sums {sums:?}");
        }
        let (a, w) = (ints(&[n, k], 6), ints(&[9, k], 7).t().unwrap());
        assert_eq!(bits(&a.matmul(&w).unwrap()), via_f32(&a, &w), "{n}x{k}: whole numbers");
    }
    few_row_infinities_and_nans(DType::BF16);
    // Random values: within one bf16 rounding of the exact result.
    within_one_rounding(DType::BF16, &[(1, 768, 96), (16, 768, 64), (31, 1000, 37)], 1.0 / 256.0, 0.0);
    set_amx(before.0);
    set_avx512_bf16(before.1);
}
