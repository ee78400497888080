//! Generates the shipped allocation trace of a transformer inference run:
//! `benches/traces/transformer_inference.json`.
//!
//! ```text
//! cargo run --release --example transformer_trace [-- <output path>]
//! ```
//!
//! The run modelled (deterministic: a fixed-seed PRNG and a simulated clock, so the file is the
//! same every time):
//! - a GPT-2-small-shaped decoder in f16: 12 layers, hidden 768, 12 heads, MLP 3072, vocabulary
//!   32000; its weights (~250 MB) are allocated once at load and kept to the end;
//! - prefill of a 256-token prompt: per layer the layer-norm output, QKV projection, f32
//!   attention scores (heads x T x T), attention output, MLP activations, and matmul workspaces,
//!   freed as the layer finishes; the residual stream is double-buffered;
//! - a paged KV cache (16-token pages per layer, vLLM-style) that gains a page every 16 tokens,
//!   with a block table reallocated as it grows;
//! - 192 decode steps, each doing the same per layer with one token (and scores over the whole
//!   context), plus logits (vocab x f32) and sampling buffers;
//! - temporaries of many sizes (64 B to 256 KiB) around every op, as real kernels' scratch.
//!
//! The trace format is documented in `tensormem::AllocationTrace`.

use std::collections::VecDeque;

use tensormem::{AllocationTrace, TRACE_VERSION, TraceEvent};

const LAYERS: usize = 12;
const HIDDEN: usize = 768;
const HEADS: usize = 12;
const MLP: usize = 3072;
const VOCAB: usize = 32_000;
const MAX_POSITIONS: usize = 1024;
const PROMPT: usize = 256;
const GENERATED: usize = 192;
const PAGE_TOKENS: usize = 16;
const F16: usize = 2;
const F32: usize = 4;

/// Emits events with a simulated clock: each allocation advances time as if its bytes were
/// written at 10 GB/s.
struct Emitter {
    events: Vec<TraceEvent>,
    next_id: u64,
    t_us: u64,
    rng: u64,
}

impl Emitter {
    fn alloc(&mut self, size: usize, align: usize) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.events.push(TraceEvent::Alloc(self.t_us, id, size, align));
        self.t_us += 1 + (size as u64) / 10_000;
        id
    }

    fn free(&mut self, id: u64) {
        self.events.push(TraceEvent::Free(self.t_us, id));
        self.t_us += 1;
    }

    fn rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// A temporary between 64 B and 256 KiB, log-uniform, freed right away or a little later.
    fn temporaries(&mut self, count: usize, pending: &mut VecDeque<u64>) {
        for _ in 0..count {
            let shift = 6 + self.rand() % 13;
            let size = (1usize << shift) + (self.rand() % (1 << shift)) as usize;
            let id = self.alloc(size, 64);
            pending.push_back(id);
            // Most temporaries die at once; some outlive the next op.
            while pending.len() > (self.rand() % 4) as usize {
                let old = pending.pop_front().unwrap_or(id);
                self.free(old);
            }
        }
    }
}

/// One transformer layer over `tokens` new tokens with `context` tokens of attention.
fn layer(e: &mut Emitter, tokens: usize, context: usize, pending: &mut VecDeque<u64>) {
    let ln = e.alloc(tokens * HIDDEN * F16, 64);
    e.temporaries(1, pending);
    let qkv = e.alloc(tokens * 3 * HIDDEN * F16, 64);
    let workspace = e.alloc((tokens * 3 * HIDDEN * F16).min(4 << 20), 256);
    e.free(workspace);
    e.free(ln);
    let scores = e.alloc(HEADS * tokens * context * F32, 64);
    e.temporaries(2, pending);
    let attn = e.alloc(tokens * HIDDEN * F16, 64);
    e.free(scores);
    e.free(qkv);
    let proj = e.alloc(tokens * HIDDEN * F16, 64);
    e.free(attn);
    let ln2 = e.alloc(tokens * HIDDEN * F16, 64);
    let fc1 = e.alloc(tokens * MLP * F16, 64);
    e.temporaries(2, pending);
    e.free(ln2);
    let fc2 = e.alloc(tokens * HIDDEN * F16, 64);
    e.free(fc1);
    e.free(proj);
    e.free(fc2);
}

/// The trace, the same bytes every time.
pub fn trace() -> AllocationTrace {
    let mut e = Emitter { events: Vec::new(), next_id: 1, t_us: 0, rng: 0x2545_f491_4f6c_dd1d };

    // Weights: embeddings, then per layer two norms and four projections with biases.
    let mut weights = vec![e.alloc(VOCAB * HIDDEN * F16, 256), e.alloc(MAX_POSITIONS * HIDDEN * F16, 256)];
    for _ in 0..LAYERS {
        for size in [HIDDEN, HIDDEN, HIDDEN * 3 * HIDDEN, 3 * HIDDEN, HIDDEN * HIDDEN, HIDDEN, HIDDEN, HIDDEN] {
            weights.push(e.alloc(size * F16, 256));
        }
        for size in [HIDDEN * MLP, MLP, MLP * HIDDEN, HIDDEN] {
            weights.push(e.alloc(size * F16, 256));
        }
    }
    weights.push(e.alloc(2 * HIDDEN * F16, 256)); // final norm

    let mut pending = VecDeque::new();
    let mut pages: Vec<u64> = Vec::new();
    let mut block_table = e.alloc(64 * 4, 64);
    let mut block_table_capacity = 64;
    let mut context = 0;
    let page_bytes = PAGE_TOKENS * HIDDEN * F16 * 2; // K and V of 16 tokens, one layer

    for step in 0..=GENERATED {
        let tokens = if step == 0 { PROMPT } else { 1 };
        // Grow the paged KV cache to hold the new tokens, for every layer.
        let needed_pages = (context + tokens).div_ceil(PAGE_TOKENS) * LAYERS;
        while pages.len() < needed_pages {
            pages.push(e.alloc(page_bytes, 256));
            if pages.len() > block_table_capacity {
                block_table_capacity *= 2;
                let bigger = e.alloc(block_table_capacity * 4, 64);
                e.free(block_table);
                block_table = bigger;
            }
        }
        context += tokens;
        let mut hidden = e.alloc(tokens * HIDDEN * F16, 64);
        for _ in 0..LAYERS {
            layer(&mut e, tokens, context, &mut pending);
            let next = e.alloc(tokens * HIDDEN * F16, 64); // residual stream, double-buffered
            e.free(hidden);
            hidden = next;
        }
        // Logits of the last position, then sampling.
        let logits = e.alloc(VOCAB * F32, 64);
        e.free(hidden);
        let probs = e.alloc(VOCAB * F32, 64);
        let order = e.alloc(VOCAB * 4, 64);
        e.temporaries(2, &mut pending);
        e.free(order);
        e.free(probs);
        e.free(logits);
    }
    while let Some(id) = pending.pop_front() {
        e.free(id);
    }
    for id in pages.into_iter().chain([block_table]).chain(weights) {
        e.free(id);
    }

    AllocationTrace {
        version: TRACE_VERSION,
        description: format!(
            "transformer inference: GPT-2-small-shaped f16 decoder ({LAYERS} layers, hidden {HIDDEN}), \
             {PROMPT}-token prompt, {GENERATED} generated tokens, paged KV cache ({PAGE_TOKENS}-token pages); \
             generated by tools/transformer_trace.rs"
        ),
        events: e.events,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args().nth(1).unwrap_or_else(|| "benches/traces/transformer_inference.json".to_owned());
    let trace = trace();
    trace.validate()?;
    let json = trace.to_json();
    if let Some(dir) = std::path::Path::new(&out).parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, &json)?;
    println!("wrote {out}: {} events ({} allocations), {} bytes", trace.events.len(), trace.allocations(), json.len());
    Ok(())
}
