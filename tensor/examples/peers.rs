//! The tensormem side of `benches/peers.py`, which times the issue-11 workloads here and in
//! PyTorch and numpy in turn, so that every library is measured in the same minutes of the
//! machine.
//!
//! Reads commands on stdin, one per line: `WORKLOAD THREADS CALLS`; answers each with the
//! median time of one call in milliseconds, after 3 warm-up calls. Tensors are made on the path
//! a user gets by default (no allocator chosen), f32, random values:
//! `add` (a + b, 4M, fresh output), `add_` (a += b), `add_out` (a + b into an existing tensor),
//! `bcast` (2048x2048 + a 2048 row), `tadd` (a.t() + b, 2048x2048), `sum` (4M),
//! `matmul` (512x512 by 512x512), `matmul_f16` and `matmul_bf16` (the same in half precision),
//! `add_f16`, `add_bf16` and `sum_f16` (the 4M add and sum in half precision), `add_mixed` (f16
//! a + f32 b, an f32 result); `linear_bf16`,
//! `linear16_bf16` and `linear1_bf16` (128, 16 and 1 tokens of width 768 by a 3072x768 bf16
//! weight, transposed, as `Linear` stores it: GPT-2's MLP up-projection at prefill and at decode
//! steps), and `linear16_f16` / `linear1_f16` the same in f16; and the ops of a
//! GPT-2 block (1024 tokens, width 768, 12 heads of 64, 256 positions): `layer_norm` and
//! `rms_norm` (1024x768, with weight), `gelu`, `gelu_tanh`, `silu`, `tanh` and `log`
//! (1024x3072; `gelu_l2` of its first 16 rows, whose input and output stay in L2),
//! `softmax` and `scale` (`* 0.125`) of the 12x256x256 attention scores, `masked_fill` of them
//! by a causal 256x256 mask, `where` of the mask between them and a zero tensor, `embedding`
//! (1024 token ids into a 50257x768 table) and `cat_kv` (a 12x1023x64 key cache grown by one
//! position); `layer_norm_bf16`, `rms_norm_bf16`, `gelu_bf16`, `silu_bf16` and `softmax_bf16`,
//! those ops on bf16 operands; `layer_norm_f16` and `softmax_f16` on f16 ones; `to_bf16` and
//! `from_bf16`, the 1024x3072 activation converted to bf16 and back; `log_softmax` and
//! `softmax_vocab`, the log-probabilities and probabilities of 16 rows of next-token logits
//! over GPT-2's 50257-token vocabulary (a beam search's or a sampler's step); `sum_dim0`,
//! `sum_dim0_bf16` and `sum_dim0_f16`, the 1024x3072 activation summed over its tokens (a
//! bias's gradient), `max_dim0` and `argmax_dim0` of it (`max_dim0_bf16` and `max_dim0_f16` in
//! half precision), `mean_dim1_heads`, the scores' mean
//! over a middle dimension, and `sum_dim1_narrow`, the activation viewed as 49152x4x16 and
//! summed over dimension 1 (reductions along a dimension that is not innermost; the last
//! in many narrow columns); `argmax_vocab`, the
//! logits' argmax over the vocabulary (greedy decoding's step), and `argmax_vocab_f16` of f16
//! logits; `max`, `max_f16` and
//! `max_bf16`, the largest of the 4M values of `sum`, `add_f16` and `add_bf16`; and a whole
//! GPT-2 block (`examples/gpt2/model.rs`: width 768, 12 heads, weights drawn from N(0, 0.02)):
//! `gpt2_prefill` over 256 tokens, `gpt2_decode` of one token after 255 cached ones (the keys and
//! values grown by `cat`); `gpt2_prefill_bf16` and `gpt2_decode_bf16` the same in bf16.
//!
//! ```text
//! cargo build --release --example peers
//! python3 benches/peers.py          # with torch and numpy installed
//! ```
use std::hint::black_box;
use std::io::{BufRead, Write};
use std::time::Instant;

use tensormem_tensor::{DType, Result, Tensor, set_num_threads};

#[path = "gpt2/model.rs"]
mod gpt2;

/// The operands, made once.
struct Data {
    a: Tensor,
    b: Tensor,
    out: Tensor,
    m: Tensor,
    m2: Tensor,
    row: Tensor,
    x: Tensor,
    y: Tensor,
    x16: Tensor,
    y16: Tensor,
    xb: Tensor,
    yb: Tensor,
    a16: Tensor,
    b16: Tensor,
    ab: Tensor,
    bb: Tensor,
    h: Tensor,
    w768: Tensor,
    b768: Tensor,
    mlp: Tensor,
    /// The first 16 rows of `mlp` (192 KiB: the input and the output fit in L2).
    mlp_l2: Tensor,
    scores: Tensor,
    logits: Tensor,
    logits16: Tensor,
    mlp16: Tensor,
    causal: Tensor,
    zeros: Tensor,
    table: Tensor,
    ids: Tensor,
    cache: Tensor,
    new_kv: Tensor,
    weight: Tensor,
    tokens: [Tensor; 3],
    weight16: Tensor,
    tokens16: [Tensor; 2],
    /// `h`, `w768`, `b768`, `mlp` and `scores` in bf16.
    block_bf16: [Tensor; 5],
    /// `h`, `w768`, `b768` and `scores` in f16.
    block_f16: [Tensor; 4],
    /// One GPT-2 block, with `table` for its token embedding.
    gpt2: gpt2::Gpt2,
    /// 256 tokens' hidden states, and their causal mask.
    prompt: (Tensor, Tensor),
    /// One token's hidden state, 255 earlier tokens' keys and values, and the step's mask.
    step: (Tensor, (Tensor, Tensor), Tensor),
    /// `gpt2`, `prompt` and `step` in bf16.
    gpt2_bf16: (gpt2::Gpt2, Tensor, Tensor, (Tensor, Tensor)),
}

fn run(d: &Data, workload: &str) -> Result<()> {
    match workload {
        "add" => drop(black_box(d.a.add(&d.b)?)),
        "add_" => drop(black_box(d.out.add_(&d.b)?)),
        "add_out" => drop(black_box(d.a.add_out(&d.b, &d.out)?)),
        "bcast" => drop(black_box(d.m.add(&d.row)?)),
        "tadd" => drop(black_box(d.m.t()?.add(&d.m2)?)),
        "sum" => drop(black_box(d.a.sum()?)),
        "max" => drop(black_box(d.a.max()?)),
        "max_f16" => drop(black_box(d.a16.max()?)),
        "max_bf16" => drop(black_box(d.ab.max()?)),
        "matmul" => drop(black_box(d.x.matmul(&d.y)?)),
        "matmul_f16" => drop(black_box(d.x16.matmul(&d.y16)?)),
        "matmul_bf16" => drop(black_box(d.xb.matmul(&d.yb)?)),
        "add_f16" => drop(black_box(d.a16.add(&d.b16)?)),
        "add_mixed" => drop(black_box(d.a16.add(&d.b)?)),
        "add_bf16" => drop(black_box(d.ab.add(&d.bb)?)),
        "sum_f16" => drop(black_box(d.a16.sum()?)),
        "gpt2_prefill" => drop(black_box(d.gpt2.block(0, &d.prompt.0, None, &d.prompt.1)?)),
        "gpt2_decode" => drop(black_box(d.gpt2.block(0, &d.step.0, Some(&d.step.1), &d.step.2)?)),
        "gpt2_prefill_bf16" => {
            let (model, prompt, _, _) = &d.gpt2_bf16;
            drop(black_box(model.block(0, prompt, None, &d.prompt.1)?))
        }
        "gpt2_decode_bf16" => {
            let (model, _, step, kv) = &d.gpt2_bf16;
            drop(black_box(model.block(0, step, Some(kv), &d.step.2)?))
        }
        "linear_bf16" => drop(black_box(d.tokens[0].matmul(&d.weight.t()?)?)),
        "linear16_bf16" => drop(black_box(d.tokens[1].matmul(&d.weight.t()?)?)),
        "linear1_bf16" => drop(black_box(d.tokens[2].matmul(&d.weight.t()?)?)),
        "linear16_f16" => drop(black_box(d.tokens16[0].matmul(&d.weight16.t()?)?)),
        "linear1_f16" => drop(black_box(d.tokens16[1].matmul(&d.weight16.t()?)?)),
        "layer_norm" => drop(black_box(d.h.layer_norm(&[768], Some(&d.w768), Some(&d.b768), 1e-5)?)),
        "rms_norm" => drop(black_box(d.h.rms_norm(&[768], Some(&d.w768), None)?)),
        "gelu" => drop(black_box(d.mlp.gelu()?)),
        "gelu_l2" => drop(black_box(d.mlp_l2.gelu()?)),
        "gelu_tanh" => drop(black_box(d.mlp.gelu_tanh()?)),
        "silu" => drop(black_box(d.mlp.silu()?)),
        "tanh" => drop(black_box(d.mlp.tanh()?)),
        "log" => drop(black_box(d.mlp.log()?)),
        "softmax" => drop(black_box(d.scores.softmax(-1)?)),
        "scale" => drop(black_box(&d.scores * 0.125)),
        "masked_fill" => drop(black_box(d.scores.masked_fill(&d.causal, f64::NEG_INFINITY)?)),
        "where" => drop(black_box(d.scores.where_cond(&d.causal, &d.zeros)?)),
        "embedding" => drop(black_box(d.table.embedding(&d.ids)?)),
        "cat_kv" => drop(black_box(Tensor::cat(&[&d.cache, &d.new_kv], 1)?)),
        "layer_norm_bf16" => {
            let [h, w, b, ..] = &d.block_bf16;
            drop(black_box(h.layer_norm(&[768], Some(w), Some(b), 1e-5)?))
        }
        "rms_norm_bf16" => drop(black_box(d.block_bf16[0].rms_norm(&[768], Some(&d.block_bf16[1]), None)?)),
        "layer_norm_f16" => {
            let [h, w, b, _] = &d.block_f16;
            drop(black_box(h.layer_norm(&[768], Some(w), Some(b), 1e-5)?))
        }
        "softmax_f16" => drop(black_box(d.block_f16[3].softmax(-1)?)),
        "gelu_bf16" => drop(black_box(d.block_bf16[3].gelu()?)),
        "silu_bf16" => drop(black_box(d.block_bf16[3].silu()?)),
        "softmax_bf16" => drop(black_box(d.block_bf16[4].softmax(-1)?)),
        "to_bf16" => drop(black_box(d.mlp.to_dtype(DType::BF16)?)),
        "from_bf16" => drop(black_box(d.block_bf16[3].to_dtype(DType::F32)?)),
        "log_softmax" => drop(black_box(d.logits.log_softmax(-1)?)),
        "softmax_vocab" => drop(black_box(d.logits.softmax(-1)?)),
        "sum_dim0" => drop(black_box(d.mlp.sum_dim(0, false)?)),
        "sum_dim0_bf16" => drop(black_box(d.block_bf16[3].sum_dim(0, false)?)),
        "mean_dim1_heads" => drop(black_box(d.scores.mean_dim(1, false)?)),
        "max_dim0" => drop(black_box(d.mlp.max_dim(0, false)?)),
        "max_dim0_bf16" => drop(black_box(d.block_bf16[3].max_dim(0, false)?)),
        "max_dim0_f16" => drop(black_box(d.mlp16.max_dim(0, false)?)),
        "argmax_dim0" => drop(black_box(d.mlp.argmax_dim(0, false)?)),
        "argmax_vocab" => drop(black_box(d.logits.argmax_dim(-1, false)?)),
        "sum_dim0_f16" => drop(black_box(d.mlp16.sum_dim(0, false)?)),
        "sum_dim1_narrow" => drop(black_box(d.mlp.view(&[49152, 4, 16])?.sum_dim(1, false)?)),
        "argmax_vocab_f16" => drop(black_box(d.logits16.argmax_dim(-1, false)?)),
        _ => panic!("unknown workload {workload:?}"),
    }
    Ok(())
}

fn main() -> Result<()> {
    let n = 1 << 22;
    let rand = |sizes: &[usize]| Tensor::rand(sizes, DType::F32);
    let mlp = rand(&[1024, 3072])?;
    let table = rand(&[50257, 768])?;
    let model = gpt2_block(&table)?;
    let prompt = Tensor::randn(&[256, 768], DType::F32)?;
    let step = (
        Tensor::randn(&[1, 768], DType::F32)?,
        (Tensor::randn(&[12, 255, 64], DType::F32)?, Tensor::randn(&[12, 255, 64], DType::F32)?),
    );
    let bf16 = |t: &Tensor| t.to_dtype(DType::BF16);
    let gpt2_bf16 =
        (model.to_dtype(DType::BF16)?, bf16(&prompt)?, bf16(&step.0)?, (bf16(&step.1.0)?, bf16(&step.1.1)?));
    let d = Data {
        a: rand(&[n])?,
        b: rand(&[n])?,
        out: rand(&[n])?,
        m: rand(&[2048, 2048])?,
        m2: rand(&[2048, 2048])?,
        row: rand(&[2048])?,
        x: rand(&[512, 512])?,
        y: rand(&[512, 512])?,
        x16: rand(&[512, 512])?.to_dtype(DType::F16)?,
        y16: rand(&[512, 512])?.to_dtype(DType::F16)?,
        xb: rand(&[512, 512])?.to_dtype(DType::BF16)?,
        yb: rand(&[512, 512])?.to_dtype(DType::BF16)?,
        a16: rand(&[n])?.to_dtype(DType::F16)?,
        b16: rand(&[n])?.to_dtype(DType::F16)?,
        ab: rand(&[n])?.to_dtype(DType::BF16)?,
        bb: rand(&[n])?.to_dtype(DType::BF16)?,
        h: rand(&[1024, 768])?,
        w768: rand(&[768])?,
        b768: rand(&[768])?,
        mlp_l2: mlp.narrow(0, 0, 16)?,
        mlp,
        scores: rand(&[12, 256, 256])?,
        logits: rand(&[16, 50257])?,
        logits16: rand(&[16, 50257])?.to_dtype(DType::F16)?,
        mlp16: rand(&[1024, 3072])?.to_dtype(DType::F16)?,
        // True above the diagonal: the future positions a causal mask hides.
        causal: {
            let pos = Tensor::arange(0.0, 256.0, 1.0, DType::I64)?;
            pos.unsqueeze(0)?.gt(&pos.unsqueeze(1)?)?
        },
        zeros: Tensor::zeros(&[12, 256, 256], DType::F32)?,
        gpt2: model,
        prompt: (prompt, gpt2::causal_mask(0, 256)?),
        step: (step.0, step.1, gpt2::causal_mask(255, 1)?),
        gpt2_bf16,
        table,
        ids: Tensor::from_vec((0..1024i64).map(|i| i * 49 % 50257).collect(), &[1024], DType::I64)?,
        cache: rand(&[12, 1023, 64])?,
        new_kv: rand(&[12, 1, 64])?,
        weight: rand(&[3072, 768])?.to_dtype(DType::BF16)?,
        tokens: [
            rand(&[128, 768])?.to_dtype(DType::BF16)?,
            rand(&[16, 768])?.to_dtype(DType::BF16)?,
            rand(&[1, 768])?.to_dtype(DType::BF16)?,
        ],
        weight16: rand(&[3072, 768])?.to_dtype(DType::F16)?,
        tokens16: [rand(&[16, 768])?.to_dtype(DType::F16)?, rand(&[1, 768])?.to_dtype(DType::F16)?],
        block_bf16: [
            rand(&[1024, 768])?.to_dtype(DType::BF16)?,
            rand(&[768])?.to_dtype(DType::BF16)?,
            rand(&[768])?.to_dtype(DType::BF16)?,
            rand(&[1024, 3072])?.to_dtype(DType::BF16)?,
            rand(&[12, 256, 256])?.to_dtype(DType::BF16)?,
        ],
        block_f16: [
            rand(&[1024, 768])?.to_dtype(DType::F16)?,
            rand(&[768])?.to_dtype(DType::F16)?,
            rand(&[768])?.to_dtype(DType::F16)?,
            rand(&[12, 256, 256])?.to_dtype(DType::F16)?,
        ],
    };
    let mut stdout = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("stdin");
        let mut words = line.split_whitespace();
        let (Some(w), Some(t), Some(calls)) = (words.next(), words.next(), words.next()) else {
            panic!("expected `WORKLOAD THREADS CALLS`, got {line:?}");
        };
        set_num_threads(t.parse().expect("THREADS"));
        for _ in 0..3 {
            run(&d, w)?;
        }
        let mut times: Vec<f64> = (0..calls.parse::<usize>().expect("CALLS"))
            .map(|_| {
                let start = Instant::now();
                run(&d, w).map(|()| start.elapsed().as_secs_f64() * 1e3)
            })
            .collect::<Result<_>>()?;
        times.sort_by(f64::total_cmp);
        writeln!(stdout, "{}", times[times.len() / 2]).expect("stdout");
        stdout.flush().expect("stdout");
    }
    Ok(())
}

/// A GPT-2 model of one block, width 768, 12 heads: weights drawn from N(0, 0.02) (GPT-2's
/// initialisation), norms' scales 1 and shifts 0; `wte` is `table`.
fn gpt2_block(table: &Tensor) -> Result<gpt2::Gpt2> {
    let weight = |sizes: &[usize]| Tensor::randn(sizes, DType::F32)?.mul_scalar(0.02);
    let linear = |i: usize, o: usize| -> Result<gpt2::Linear> {
        Ok(gpt2::Linear { weight: weight(&[i, o])?, bias: Tensor::zeros(&[o], DType::F32)? })
    };
    let norm = || -> Result<gpt2::Norm> {
        Ok(gpt2::Norm { weight: Tensor::ones(&[768], DType::F32)?, bias: Tensor::zeros(&[768], DType::F32)? })
    };
    let block = gpt2::Block {
        ln_1: norm()?,
        c_attn: linear(768, 3 * 768)?,
        attn_proj: linear(768, 768)?,
        ln_2: norm()?,
        c_fc: linear(768, 4 * 768)?,
        mlp_proj: linear(4 * 768, 768)?,
    };
    let wpe = weight(&[1024, 768])?;
    Ok(gpt2::Gpt2 { wte: table.clone(), wpe, blocks: vec![block], ln_f: norm()?, n_head: 12, eps: 1e-5 })
}
