//! `tensormem demo`: a small transformer-style inference loop (embedding, attention with a
//! growing KV cache, MLP, layer norms) on tensors through the registry-selected allocator.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tensormem::history::{self, HistoryOptions};
use tensormem::telemetry::{MetricsServer, memory_summary, snapshot_json};
use tensormem::{AllocConf, AllocatorRegistry, ByteSize, CONFIGURED_PRIORITY, scope};
use tensormem_tensor::{DType, Tensor, TensorOptions};

use crate::Outcome;
use crate::output::sayln;

/// Options of `tensormem demo`.
#[derive(clap::Args, Debug)]
pub(crate) struct DemoArgs {
    /// Allocator to run on, by registry name (default: the registry's choice, which honours
    /// TENSORMEM_ALLOCATOR and TENSORMEM_ALLOC_CONF).
    #[arg(long)]
    allocator: Option<String>,
    /// Serve Prometheus /metrics on this address while the demo runs (e.g. 127.0.0.1:9464).
    #[arg(long)]
    serve: Option<String>,
    /// Tokens to generate, 1 to 1024 (the KV cache grows with each, and with it the time a
    /// step takes).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=MAX_STEPS))]
    steps: u64,
    /// Directory for history.json, timeline.html and snapshot.json (created if missing; its
    /// parent must exist; the three files in it are replaced).
    #[arg(long, default_value = "tensormem-demo")]
    out: PathBuf,
}

/// The most tokens the demo generates: its attention reads the whole KV cache each step, so the
/// time grows with the square of the steps.
const MAX_STEPS: u64 = 1024;

const LAYERS: usize = 4;
const D_MODEL: usize = 256;
const D_FF: usize = 1024;
const VOCAB: usize = 2048;
const PROMPT: usize = 64;

struct Layer {
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    w1: Tensor,
    w2: Tensor,
    k_cache: Option<Tensor>,
    v_cache: Option<Tensor>,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Checks `--out` before anything is written: an existing folder, or a new one whose parent
/// exists.
fn check_out(out: &Path) -> Outcome {
    if out.exists() {
        if !out.is_dir() {
            return Err(format!("--out {}: exists and is not a folder", out.display()).into());
        }
        return Ok(());
    }
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !parent.is_dir() {
        return Err(format!(
            "--out {}: the folder {} does not exist (create it first, or choose another --out)",
            out.display(),
            parent.display()
        )
        .into());
    }
    Ok(())
}

pub(crate) fn run(args: DemoArgs) -> Outcome {
    // Every argument is checked before the file system is touched.
    check_out(&args.out)?;
    let registry = AllocatorRegistry::global();
    if let Some(name) = &args.allocator {
        if name.eq_ignore_ascii_case("bfc") && registry.get_by_name("bfc").is_none() {
            // BFC is registered when configured; the demo asks for it by name, so make it by
            // the configuration's rule (its limit: bfc.memory_limit, else the machine's memory).
            let conf = AllocConf::from_env().map_err(err)?;
            let bfc = conf.build_bfc().map_err(err)?;
            registry.register("bfc", CONFIGURED_PRIORITY, Arc::new(bfc)).map_err(err)?;
            if conf.bfc_memory_limit.is_none() {
                sayln!(
                    "bfc: no bfc.memory_limit in TENSORMEM_ALLOC_CONF; limited to the machine's memory, {}",
                    ByteSize(conf.bfc_limit())
                );
            }
        }
        registry.select(Some(name)).map_err(|e| format!("--allocator: {e}"))?;
    }
    let allocator = registry.try_get().map_err(err)?;
    let server = match &args.serve {
        Some(addr) => Some(MetricsServer::start(addr.as_str()).map_err(|e| format!("--serve: {e}"))?),
        None => None,
    };
    std::fs::create_dir(&args.out)
        .or_else(|e| if args.out.is_dir() { Ok(()) } else { Err(e) })
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    if let Some(s) = &server {
        sayln!("serving /metrics on http://{}/metrics", s.local_addr());
    }
    sayln!(
        "demo: {LAYERS} layers, d_model {D_MODEL}, prompt {PROMPT} tokens, {} steps, allocator '{}'",
        args.steps,
        allocator.name()
    );
    history::start(HistoryOptions { capacity: 200_000, backtraces: false }).map_err(err)?;
    let result = inference(&args);
    history::stop();
    result?;
    let h = history::recorded();
    let history_path = args.out.join("history.json");
    h.save(&history_path).map_err(err)?;
    let page = args.out.join("timeline.html");
    std::fs::write(&page, tensormem::timeline::render_html(&h)).map_err(|e| format!("{}: {e}", page.display()))?;
    let snapshot = args.out.join("snapshot.json");
    std::fs::write(&snapshot, snapshot_json()).map_err(|e| format!("{}: {e}", snapshot.display()))?;
    sayln!("\n{}", memory_summary(registry));
    sayln!("history: {h}");
    sayln!("wrote {}, {} and {}", history_path.display(), page.display(), snapshot.display());
    drop(server);
    Ok(())
}

fn inference(args: &DemoArgs) -> Outcome {
    let opts = |seed| TensorOptions::new().dtype(DType::F32).seed(seed);
    let (embedding, mut layers) = {
        let _w = scope("weights");
        let embedding = Tensor::randn(&[VOCAB, D_MODEL], opts(1)).map_err(err)?;
        let mut layers = Vec::new();
        for l in 0..LAYERS {
            let s = 10 + l as u64 * 10;
            let w = |r, c, k| Tensor::randn(&[r, c], opts(s + k)).and_then(|t| t.mul_scalar(0.05));
            layers.push(Layer {
                wq: w(D_MODEL, D_MODEL, 1).map_err(err)?,
                wk: w(D_MODEL, D_MODEL, 2).map_err(err)?,
                wv: w(D_MODEL, D_MODEL, 3).map_err(err)?,
                wo: w(D_MODEL, D_MODEL, 4).map_err(err)?,
                w1: w(D_MODEL, D_FF, 5).map_err(err)?,
                w2: w(D_FF, D_MODEL, 6).map_err(err)?,
                k_cache: None,
                v_cache: None,
            });
        }
        (embedding, layers)
    };
    // On standard error, drawn when that is a terminal, whatever standard output is.
    let bar = crate::output::progress_bar(args.steps, "{spinner} step {pos}/{len} [{bar:30}] {msg}")?;
    let mut tokens: Vec<i64> = (0..PROMPT as i64).map(|i| (i * 37) % VOCAB as i64).collect();
    for step in 0..args.steps {
        let _s = scope(if step == 0 { "prefill" } else { "decode" });
        let new = if step == 0 { &tokens[..] } else { &tokens[tokens.len() - 1..] };
        let ids = Tensor::from_slice(new, &[new.len()], DType::I64).map_err(err)?;
        let mut x = embedding.embedding(&ids).map_err(err)?;
        for (i, layer) in layers.iter_mut().enumerate() {
            x = block(i, layer, &x).map_err(err)?;
        }
        let logits = {
            let _h = scope("head");
            let last = x.narrow(0, -1, 1).map_err(err)?;
            last.matmul(&embedding.t().map_err(err)?).map_err(err)?
        };
        let next = argmax(&logits).map_err(err)?;
        tokens.push(next);
        let live = AllocatorRegistry::global().try_get().ok().and_then(|a| a.stats()).map_or(0, |s| s.bytes_in_use);
        bar.set_message(format!("token {next:>4}, {} in use", tensormem::ByteSize(live)));
        bar.inc(1);
    }
    bar.finish_with_message("done");
    Ok(())
}

fn block(i: usize, l: &mut Layer, x: &Tensor) -> tensormem_tensor::Result<Tensor> {
    let _layer = scope(&format!("layer{i}"));
    let h = x.layer_norm(&[D_MODEL], None, None, 1e-5)?;
    let attn = {
        let _a = scope("attn");
        let q = h.matmul(&l.wq)?;
        let k = h.matmul(&l.wk)?;
        let v = h.matmul(&l.wv)?;
        let k_all = match &l.k_cache {
            Some(c) => Tensor::cat(&[c, &k], 0)?,
            None => k,
        };
        let v_all = match &l.v_cache {
            Some(c) => Tensor::cat(&[c, &v], 0)?,
            None => v,
        };
        let scores = q.matmul(&k_all.t()?)?.mul_scalar(1.0 / (D_MODEL as f64).sqrt())?;
        let out = scores.softmax(-1)?.matmul(&v_all)?.matmul(&l.wo)?;
        l.k_cache = Some(k_all);
        l.v_cache = Some(v_all);
        out
    };
    let x = x.add(&attn)?;
    let mlp = {
        let _m = scope("mlp");
        let h = x.layer_norm(&[D_MODEL], None, None, 1e-5)?;
        h.matmul(&l.w1)?.relu()?.matmul(&l.w2)?
    };
    x.add(&mlp)
}

fn argmax(logits: &Tensor) -> tensormem_tensor::Result<i64> {
    let v: Vec<f32> = logits.to_vec::<f32>()?;
    Ok(v.iter().enumerate().fold((0usize, f32::MIN), |best, (i, &x)| if x > best.1 { (i, x) } else { best }).0 as i64)
}
