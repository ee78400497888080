//! Greedy decoding with a GPT-2 checkpoint in safetensors format (Hugging Face's names), on
//! tensormem's tensors: the weights are mapped from the file, not copied; each step runs one
//! token through the blocks after the cached keys and values (`examples/gpt2/model.rs`).
//!
//! ```text
//! cargo run --release --example gpt2 -- MODEL.safetensors [N_HEAD] [STEPS] [TOKEN...]
//! cargo run --release --example gpt2 -- tests/golden/gpt2_tiny.safetensors 4 8 1 2 3
//! ```
//! `N_HEAD` defaults to the file's `n_head` metadata, else 12 (GPT-2 small); the prompt to the
//! file's `tokens` tensor, else token 50256. Prints the tokens chosen, the time per step and
//! what the default allocator holds.

#[path = "gpt2/model.rs"]
mod model;

use std::error::Error;
use std::time::Instant;

use model::{Gpt2, KvCache};
use tensormem::AllocatorRegistry;
use tensormem_tensor::{DType, SafeTensors, Tensor};

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        return Err("usage: gpt2 MODEL.safetensors [N_HEAD] [STEPS] [TOKEN...]".into());
    };
    // SAFETY: nothing writes the checkpoint while it is mapped.
    let file = unsafe { SafeTensors::open(path) }?;
    let meta_heads = file.metadata().and_then(|m| m.get("n_head")).and_then(|h| h.parse().ok());
    let n_head = match args.get(1) {
        Some(h) => h.parse().map_err(|e| format!("N_HEAD {h:?}: {e}"))?,
        None => meta_heads.unwrap_or(12),
    };
    let steps: usize = match args.get(2) {
        Some(s) => s.parse().map_err(|e| format!("STEPS {s:?}: {e}"))?,
        None => 8,
    };
    let prompt: Vec<i64> = if args.len() > 3 {
        args[3..].iter().map(|t| t.parse().map_err(|e| format!("TOKEN {t:?}: {e}"))).collect::<Result<_, _>>()?
    } else if file.info("tokens").is_some() {
        file.tensor("tokens")?.to_dtype(DType::I64)?.to_vec()?
    } else {
        vec![50256]
    };
    let model = Gpt2::load(&file, n_head, 1e-5)?;
    println!(
        "{path}: {} blocks, width {}, {} heads, vocabulary {}; {} bytes mapped",
        model.blocks.len(),
        model.dim(),
        n_head,
        model.wte.sizes()[0],
        file.mapped_bytes()
    );

    let mut cache = KvCache::default();
    let start = Instant::now();
    let logits = model.forward(&Tensor::from_slice(&prompt, &[prompt.len()], DType::I64)?, &mut cache)?;
    let prefill = start.elapsed();
    let mut next = logits.select(0, -1)?.argmax()?.item::<i64>()?;
    let mut chosen = vec![next];
    let start = Instant::now();
    for _ in 1..steps {
        let logits = model.forward(&Tensor::from_slice(&[next], &[1], DType::I64)?, &mut cache)?;
        next = logits.select(0, 0)?.argmax()?.item::<i64>()?;
        chosen.push(next);
    }
    let decode = start.elapsed();
    println!("prompt {prompt:?} -> {chosen:?}");
    println!(
        "prefill of {} tokens {:.2} ms; {} decode steps {:.3} ms each",
        prompt.len(),
        prefill.as_secs_f64() * 1e3,
        steps.saturating_sub(1),
        decode.as_secs_f64() * 1e3 / steps.saturating_sub(1).max(1) as f64
    );
    let allocator = AllocatorRegistry::global().try_get()?;
    if let Some(stats) = allocator.stats() {
        println!(
            "allocator {:?}: {} bytes in use with {} tokens' keys and values cached, peak {}",
            allocator.name(),
            stats.bytes_in_use,
            cache.len(),
            stats.peak_bytes_in_use
        );
    }
    Ok(())
}
