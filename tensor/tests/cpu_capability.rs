//! `TENSORMEM_CPU_CAPABILITY` caps the vector extensions the kernels use, and every capability
//! computes the same bits. Each capability runs this binary again as a child process with the
//! variable set (the kernels read it once per process); the child prints the capability it runs
//! at and a hash of each op's result, and the parent compares them.

use std::process::{Command, ExitCode};

use tensormem_tensor::{CPU_CAPABILITY_ENV, DType, Result, Tensor, TensorOptions, cpu_capability, set_half_tables};

const CHILD: &str = "TENSORMEM_TEST_CHILD";

/// FNV-1a over the values' bits, widened to `f64` (exact from every float dtype), every NaN
/// as one (which NaN a NaN result is may differ between routes: see the `isa` module).
fn hash(t: &Tensor) -> Result<u64> {
    let mut h = 0xcbf2_9ce4_8422_2325_u64;
    for v in t.to_dtype(DType::F64)?.to_vec::<f64>()? {
        let bits = if v.is_nan() { f64::NAN.to_bits() } else { v.to_bits() };
        for b in bits.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    Ok(h)
}

/// Operands in `dt`: a 37x301 `randn` activation (odd lengths: every loop's tail) scaled by
/// 1, 8 and 1e-20, then the edges (zeros, infinities, NaN, the largest and smallest values).
fn operand(dt: DType, seed: u64) -> Result<Tensor> {
    let x = Tensor::randn(&[37, 301], TensorOptions::new().dtype(DType::F32).seed(seed))?;
    let edges = [0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40, -1e-40, 3e38, -3e38, 65504.0, 1.0];
    let mut rows = vec![x.clone(), x.mul_scalar(8.0)?, x.mul_scalar(1e-20)?];
    let mut edge = vec![1.0f32; 301];
    for (i, e) in edge.iter_mut().enumerate() {
        *e = edges[i % edges.len()];
    }
    rows.push(Tensor::from_vec(edge, &[1, 301], DType::F32)?);
    Tensor::cat(&rows.iter().collect::<Vec<_>>(), 0)?.to_dtype(dt)
}

/// Each op's name and the hash of its result, for f32, bf16 and f16 operands.
fn results() -> Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    for dt in [DType::F32, DType::BF16, DType::F16] {
        let x = operand(dt, 1)?;
        let y = operand(dt, 2)?;
        let w = operand(dt, 3)?.select(0, 5)?;
        let mut put = |name: &str, t: Tensor| -> Result<()> {
            out.push((format!("{name} {dt:?}"), hash(&t)?));
            Ok(())
        };
        put("add", x.add(&y)?)?;
        put("mul", x.mul(&y)?)?;
        put("div", x.div(&y)?)?;
        put("add f32 operand", x.add(&y.to_dtype(DType::F32)?)?)?;
        put("transposed add", x.t()?.contiguous()?.add(&y.t()?)?)?;
        put("maximum", x.maximum(&y)?)?;
        // (A copy: `contiguous` of a contiguous tensor is the tensor itself.)
        let in_place = Tensor::zeros_like(&x)?;
        in_place.copy_(&x)?;
        in_place.add_(&y)?;
        put("add_", in_place)?;
        put("sum", x.sum_dim(1, false)?)?;
        put("mean", x.mean_dim(0, false)?)?;
        put("sum over rows", x.sum_dim(0, false)?)?;
        put("max over rows", x.max_dim(0, false)?)?;
        put("min over rows", x.min_dim(0, false)?)?;
        put("argmax over rows", x.argmax_dim(0, false)?)?;
        put("argmax", x.argmax_dim(1, false)?)?;
        put("softmax", x.softmax(-1)?)?;
        put("log_softmax", x.log_softmax(0)?)?;
        put("layer_norm", x.layer_norm(&[301], Some(&w), Some(&w), 1e-5)?)?;
        put("rms_norm", x.rms_norm(&[301], Some(&w), None)?)?;
        put("to f32", x.to_dtype(DType::F32)?)?;
        put("to bf16", x.to_dtype(DType::BF16)?)?;
        put("to f16", x.to_dtype(DType::F16)?)?;
        for tables in [true, false] {
            set_half_tables(tables);
            let t = if tables { "" } else { ", computed" };
            put(&format!("gelu{t}"), x.gelu()?)?;
            put(&format!("gelu_tanh{t}"), x.gelu_tanh()?)?;
            put(&format!("silu{t}"), x.silu()?)?;
            put(&format!("sigmoid{t}"), x.sigmoid()?)?;
            put(&format!("tanh{t}"), x.tanh()?)?;
            put(&format!("exp{t}"), x.exp()?)?;
            put(&format!("log{t}"), x.abs()?.log()?)?;
        }
        put("sqrt", x.abs()?.sqrt()?)?;
    }
    Ok(out)
}

fn child() -> ExitCode {
    println!("capability {}", cpu_capability());
    match results() {
        Ok(r) => {
            for (name, h) in r {
                println!("{h:016x} {name}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("child failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// This binary run as a child with `TENSORMEM_CPU_CAPABILITY` set to `value` (unset: `None`):
/// the capability it reported and its result lines.
fn run(value: Option<&str>) -> (String, Vec<String>) {
    let mut cmd = Command::new(std::env::current_exe().expect("the test binary's path"));
    cmd.env(CHILD, "1");
    match value {
        Some(v) => cmd.env(CPU_CAPABILITY_ENV, v),
        None => cmd.env_remove(CPU_CAPABILITY_ENV),
    };
    let out = cmd.output().expect("the child runs");
    let stdout = String::from_utf8(out.stdout).expect("UTF-8 output");
    assert!(out.status.success(), "child with {value:?} failed: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    let mut lines = stdout.lines().map(str::to_owned);
    let first = lines.next().expect("the capability line");
    let capability = first.strip_prefix("capability ").expect("the capability line first").to_owned();
    (capability, lines.collect())
}

fn main() -> ExitCode {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let rank = |c: &str| ["default", "avx2", "avx512"].iter().position(|&n| n == c).expect("a known capability");
    let (widest, want) = run(None);
    assert_eq!(want.len(), 3 * 36, "every op of every dtype");
    println!("this CPU: {widest}");
    for (value, cap) in [
        ("default", "default"),
        ("avx2", "avx2"),
        (" AVX2 ", "avx2"),
        ("avx512", "avx512"),
        ("", "avx512"),
        ("sse9", "avx512"),
    ] {
        let (got_cap, got) = run(Some(value));
        // The capability asked for, or the CPU's widest where it has less.
        let expected = ["default", "avx2", "avx512"][rank(cap).min(rank(&widest))];
        assert_eq!(got_cap, expected, "{CPU_CAPABILITY_ENV}={value:?} on a {widest} CPU");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g, w, "{CPU_CAPABILITY_ENV}={value:?} ({got_cap}) against {widest}");
        }
        assert_eq!(got.len(), want.len());
        println!("{CPU_CAPABILITY_ENV}={value:?}: {got_cap}, the same {} results", got.len());
    }
    ExitCode::SUCCESS
}
