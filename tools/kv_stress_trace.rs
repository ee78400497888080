//! Generates the shipped stress trace of a serving engine: `benches/traces/kv_cache_stress.json`.
//!
//! ```text
//! cargo run --release --example kv_stress_trace [-- <output path>]
//! ```
//!
//! The run modelled (deterministic: a fixed-seed PRNG and a simulated clock):
//! - 200 MB of f16 weights, allocated at load and kept;
//! - requests arrive with prompts of 32 to 1,536 tokens and generate 16 to 384 tokens; up to
//!   8 run at once (continuous batching), so the batch's token count varies every step;
//! - each request keeps a contiguous f16 KV cache per layer that grows by reallocation in steps
//!   of 64 tokens (allocate the larger cache, copy, free the old one: the `torch.cat` pattern of
//!   a dynamic cache), and is freed when the request finishes;
//! - every step allocates per-layer activations sized by the batch's tokens (hidden states, QKV,
//!   attention scores over the longest context, MLP), freed when the layer is done.
//!
//! Sizes change all the time, blocks of many sizes are freed in the middle of live ones, and the
//! total goes up and down: doubling regions strand memory, need-sized expandable growth does not.

use tensormem::{AllocationTrace, TRACE_VERSION, TraceEvent};

const LAYERS: usize = 12;
const HIDDEN: usize = 768;
const HEADS: usize = 12;
const MLP: usize = 3072;
const F16: usize = 2;
const F32: usize = 4;
const CACHE_STEP: usize = 64;
const MAX_RUNNING: usize = 8;
const STEPS: usize = 700;

struct Emitter {
    events: Vec<TraceEvent>,
    next_id: u64,
    t_us: u64,
    rng: u64,
}

impl Emitter {
    fn alloc(&mut self, size: usize) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.events.push(TraceEvent::Alloc(self.t_us, id, size, 256));
        self.t_us += 1 + (size as u64) / 10_000;
        id
    }

    fn free(&mut self, id: u64) {
        self.events.push(TraceEvent::Free(self.t_us, id));
        self.t_us += 1;
    }

    /// splitmix64: uniform in `lo..=hi`.
    fn uniform(&mut self, lo: usize, hi: usize) -> usize {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        lo + ((z ^ (z >> 31)) % (hi - lo + 1) as u64) as usize
    }
}

/// One request: its length so far, how many tokens it still generates, its KV caches (one id
/// per layer) and their capacity in tokens.
struct Request {
    len: usize,
    remaining: usize,
    caches: Vec<u64>,
    capacity: usize,
}

fn kv_bytes(tokens: usize) -> usize {
    2 * tokens * HIDDEN * F16
}

/// The trace, the same bytes every time.
pub fn trace() -> AllocationTrace {
    let mut e = Emitter { events: Vec::new(), next_id: 1, t_us: 0, rng: 0x5eed_cafe };
    let weights: Vec<u64> = (0..LAYERS).map(|_| e.alloc(12 * HIDDEN * HIDDEN * F16 + 8 * HIDDEN)).collect();
    let embedding = e.alloc(50_257 * HIDDEN * F16);
    let mut running: Vec<Request> = Vec::new();
    for step in 0..STEPS {
        // Admit requests while there is room (fewer near the end, so the total also falls).
        while running.len() < MAX_RUNNING && step < STEPS - 100 && e.uniform(0, 3) > 0 {
            let prompt = e.uniform(32, 1536);
            let capacity = prompt.next_multiple_of(CACHE_STEP);
            let caches = (0..LAYERS).map(|_| e.alloc(kv_bytes(capacity))).collect();
            running.push(Request { len: prompt, remaining: e.uniform(16, 384), caches, capacity });
        }
        if running.is_empty() {
            continue;
        }
        // One forward pass over the batch: prefill tokens of new requests count fully.
        let tokens: usize = running.iter().map(|r| if r.len == r.capacity { 1 } else { 1 + r.len % 7 }).sum();
        let context = running.iter().map(|r| r.len).max().unwrap_or(1);
        let hidden = e.alloc(tokens * HIDDEN * F16);
        for _ in 0..LAYERS {
            let norm = e.alloc(tokens * HIDDEN * F16);
            let qkv = e.alloc(tokens * 3 * HIDDEN * F16);
            let scores = e.alloc(tokens * HEADS * context * F32);
            e.free(norm);
            let attn = e.alloc(tokens * HIDDEN * F16);
            e.free(scores);
            e.free(qkv);
            let mlp = e.alloc(tokens * MLP * F16);
            let out = e.alloc(tokens * HIDDEN * F16);
            e.free(mlp);
            e.free(attn);
            e.free(out);
        }
        let logits = e.alloc(running.len() * 50_257 * F32);
        e.free(hidden);
        e.free(logits);
        // Every request gains a token; caches that are full grow by reallocation.
        for r in &mut running {
            r.len += 1;
            r.remaining -= 1;
            if r.len > r.capacity {
                let grown = r.capacity + CACHE_STEP;
                for id in &mut r.caches {
                    let new = e.alloc(kv_bytes(grown));
                    e.free(*id);
                    *id = new;
                }
                r.capacity = grown;
            }
        }
        // Finished requests free their caches.
        let mut i = 0;
        while i < running.len() {
            if running[i].remaining == 0 {
                let r = running.swap_remove(i);
                for id in r.caches {
                    e.free(id);
                }
            } else {
                i += 1;
            }
        }
    }
    for r in running {
        for id in r.caches {
            e.free(id);
        }
    }
    e.free(embedding);
    for id in weights {
        e.free(id);
    }
    AllocationTrace {
        version: TRACE_VERSION,
        description: "synthetic serving stress (tools/kv_stress_trace.rs): continuous batching of up to 8 \
                      requests, prompts 32-1536 tokens, KV caches growing by reallocation in 64-token steps, \
                      activations sized by the batch"
            .to_owned(),
        events: e.events,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| "benches/traces/kv_cache_stress.json".to_owned());
    let trace = trace();
    trace.validate()?;
    std::fs::write(&path, trace.to_json())?;
    println!("{path}: {} events", trace.events.len());
    Ok(())
}
