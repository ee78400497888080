//! GPT-2 on tensormem's tensors, written as an inference engine would write it: weights mapped
//! from a safetensors file by their Hugging Face names (`transformer.h.0.attn.c_attn.weight`,
//! ...), a KV cache per layer grown with `cat`, the causal mask from `arange` and a comparison,
//! fused `layer_norm`, `softmax` and GELU's tanh form (`gelu_new`).
//!
//! Shared by `examples/gpt2.rs`, `examples/peers.rs` and `tests/gpt2.rs` (included by `#[path]`).

#![allow(dead_code)]

use std::error::Error;

use tensormem_tensor::{DType, Result, SafeTensors, Tensor};

/// A linear layer as GPT-2's `Conv1D` stores it: `x @ weight + bias`, `weight` is `[in, out]`.
pub struct Linear {
    pub weight: Tensor,
    pub bias: Tensor,
}

impl Linear {
    /// `x @ weight + bias`, the bias added in place into the product.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.matmul(&self.weight)?;
        y.add_(&self.bias)?;
        Ok(y)
    }
}

/// A layer norm's scale and shift.
pub struct Norm {
    pub weight: Tensor,
    pub bias: Tensor,
}

/// One transformer block (`transformer.h.N`).
pub struct Block {
    pub ln_1: Norm,
    pub c_attn: Linear,
    pub attn_proj: Linear,
    pub ln_2: Norm,
    pub c_fc: Linear,
    pub mlp_proj: Linear,
}

/// GPT-2's language model: token and position embeddings, the blocks, the final norm; the
/// output projection is the token embedding's transpose (tied weights).
pub struct Gpt2 {
    pub wte: Tensor,
    pub wpe: Tensor,
    pub blocks: Vec<Block>,
    pub ln_f: Norm,
    pub n_head: usize,
    pub eps: f64,
}

/// The keys and values of the tokens seen so far, per block: `[heads, tokens, head_dim]` each.
#[derive(Default)]
pub struct KvCache {
    pub layers: Vec<(Tensor, Tensor)>,
}

impl KvCache {
    /// How many tokens the cache holds.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, |(k, _)| k.sizes()[1])
    }
}

impl Gpt2 {
    /// The model in `file`, by Hugging Face's names (with or without the `transformer.` prefix
    /// that `GPT2LMHeadModel` gives them): its blocks, counted by name, of `n_head` heads. Every
    /// weight is checked against the shapes the embedding's width implies.
    pub fn load(file: &SafeTensors, n_head: usize, eps: f64) -> Result<Gpt2, Box<dyn Error>> {
        let prefix = if file.info("transformer.wte.weight").is_some() { "transformer." } else { "" };
        let n_layer = (0..).take_while(|i| file.info(&format!("{prefix}h.{i}.ln_1.weight")).is_some()).count();
        Self::load_blocks(file, prefix, n_layer, n_head, eps)
    }

    /// [`load`](Self::load) of the first `n_layer` blocks, names starting with `prefix`.
    pub fn load_blocks(
        file: &SafeTensors,
        prefix: &str,
        n_layer: usize,
        n_head: usize,
        eps: f64,
    ) -> Result<Gpt2, Box<dyn Error>> {
        let wte = file.tensor(&format!("{prefix}wte.weight"))?;
        if n_head == 0 || wte.sizes().get(1).is_none_or(|d| d % n_head != 0) {
            return Err(format!("{n_head} heads do not divide wte's {:?}", wte.sizes()).into());
        }
        let d = match *wte.sizes() {
            [_, d] => d,
            _ => return Err(format!("wte is {:?}, not [vocab, dim]", wte.sizes()).into()),
        };
        let dt = wte.dtype();
        let get = |name: String, shape: &[usize]| file.tensor_checked(&name, dt, shape);
        let linear = |name: String, i: usize, o: usize| -> Result<Linear> {
            Ok(Linear { weight: get(format!("{name}.weight"), &[i, o])?, bias: get(format!("{name}.bias"), &[o])? })
        };
        let norm = |name: String| -> Result<Norm> {
            Ok(Norm { weight: get(format!("{name}.weight"), &[d])?, bias: get(format!("{name}.bias"), &[d])? })
        };
        let wpe = file.tensor(&format!("{prefix}wpe.weight"))?;
        if wpe.dim() != 2 || wpe.sizes()[1] != d || wpe.dtype() != dt {
            return Err(format!("wpe is {:?} {}, not [positions, {d}] {dt}", wpe.sizes(), wpe.dtype()).into());
        }
        let blocks = (0..n_layer)
            .map(|i| {
                let p = format!("{prefix}h.{i}");
                Ok(Block {
                    ln_1: norm(format!("{p}.ln_1"))?,
                    c_attn: linear(format!("{p}.attn.c_attn"), d, 3 * d)?,
                    attn_proj: linear(format!("{p}.attn.c_proj"), d, d)?,
                    ln_2: norm(format!("{p}.ln_2"))?,
                    c_fc: linear(format!("{p}.mlp.c_fc"), d, 4 * d)?,
                    mlp_proj: linear(format!("{p}.mlp.c_proj"), 4 * d, d)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let ln_f = norm(format!("{prefix}ln_f"))?;
        Ok(Gpt2 { wte, wpe, blocks, ln_f, n_head, eps })
    }

    /// The model with every weight converted to `dtype` (bf16 or f16 for half-precision
    /// inference).
    pub fn to_dtype(&self, dtype: DType) -> Result<Gpt2> {
        let linear = |l: &Linear| -> Result<Linear> {
            Ok(Linear { weight: l.weight.to_dtype(dtype)?, bias: l.bias.to_dtype(dtype)? })
        };
        let norm = |n: &Norm| -> Result<Norm> {
            Ok(Norm { weight: n.weight.to_dtype(dtype)?, bias: n.bias.to_dtype(dtype)? })
        };
        let blocks = self
            .blocks
            .iter()
            .map(|b| {
                Ok(Block {
                    ln_1: norm(&b.ln_1)?,
                    c_attn: linear(&b.c_attn)?,
                    attn_proj: linear(&b.attn_proj)?,
                    ln_2: norm(&b.ln_2)?,
                    c_fc: linear(&b.c_fc)?,
                    mlp_proj: linear(&b.mlp_proj)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Gpt2 {
            wte: self.wte.to_dtype(dtype)?,
            wpe: self.wpe.to_dtype(dtype)?,
            blocks,
            ln_f: norm(&self.ln_f)?,
            n_head: self.n_head,
            eps: self.eps,
        })
    }

    /// The width of the embeddings.
    pub fn dim(&self) -> usize {
        self.wte.sizes()[1]
    }

    fn norm(&self, x: &Tensor, n: &Norm) -> Result<Tensor> {
        x.layer_norm(&[self.dim()], Some(&n.weight), Some(&n.bias), self.eps)
    }

    /// The logits (`[tokens, vocab]`) of `tokens` (`[tokens]`, integers), which follow the
    /// tokens in `cache`; their keys and values are appended to it.
    pub fn forward(&self, tokens: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        let past = cache.len();
        let t = tokens.numel();
        let positions = Tensor::arange(past as f64, (past + t) as f64, 1.0, DType::I64)?;
        let mut h = self.wte.embedding(tokens)?;
        h.add_(&self.wpe.embedding(&positions)?)?;
        let mask = causal_mask(past, t)?;
        for i in 0..self.blocks.len() {
            let kv = cache.layers.get(i).cloned();
            let (out, kv) = self.block(i, &h, kv.as_ref(), &mask)?;
            h = out;
            if i < cache.layers.len() {
                cache.layers[i] = kv;
            } else {
                cache.layers.push(kv);
            }
        }
        self.norm(&h, &self.ln_f)?.matmul(&self.wte.t()?)
    }

    /// Block `i` on `x` (`[tokens, dim]`), after the keys and values `past` of earlier tokens;
    /// `mask` from [`causal_mask`]. Returns its output and the grown keys and values.
    ///
    /// # Panics
    /// When the model has no block `i`.
    pub fn block(
        &self,
        i: usize,
        x: &Tensor,
        past: Option<&(Tensor, Tensor)>,
        mask: &Tensor,
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        let block = &self.blocks[i];
        let (a, kv) = self.attention(&self.norm(x, &block.ln_1)?, block, past, mask)?;
        let h = x.add(&a)?;
        let m = block.c_fc.forward(&self.norm(&h, &block.ln_2)?)?;
        m.gelu_tanh_()?;
        h.add_(&block.mlp_proj.forward(&m)?)?;
        Ok((h, kv))
    }

    /// Causal self-attention of `x` (`[tokens, dim]`) after the cached keys and values; returns
    /// its output and the grown cache entry.
    fn attention(
        &self,
        x: &Tensor,
        block: &Block,
        past: Option<&(Tensor, Tensor)>,
        mask: &Tensor,
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        let (t, d, heads) = (x.sizes()[0], self.dim(), self.n_head);
        let hd = d / heads;
        let qkv = block.c_attn.forward(x)?;
        // [tokens, 3 * dim] -> three [heads, tokens, head_dim] views.
        let split = |j: usize| -> Result<Tensor> {
            qkv.narrow(1, (j * d) as isize, d)?.view(&[t as isize, heads as isize, hd as isize])?.transpose(0, 1)
        };
        let (q, k, v) = (split(0)?, split(1)?, split(2)?);
        let (k, v) = match past {
            Some((pk, pv)) => (Tensor::cat(&[pk, &k], 1)?, Tensor::cat(&[pv, &v], 1)?),
            None => (k.contiguous()?, v.contiguous()?),
        };
        let scores = q.matmul(&k.transpose(1, 2)?)?;
        scores.mul_scalar_(1.0 / (hd as f64).sqrt())?.masked_fill_(mask, f64::NEG_INFINITY)?;
        let y = scores.softmax(-1)?.matmul(&v)?;
        let y = y.transpose(0, 1)?.reshape(&[t as isize, d as isize])?;
        Ok((block.attn_proj.forward(&y)?, (k, v)))
    }
}

/// `[tokens, past + tokens]`, true where key j is hidden from query i (at position `past + i`):
/// where j > past + i.
pub fn causal_mask(past: usize, tokens: usize) -> Result<Tensor> {
    let keys = Tensor::arange(0.0, (past + tokens) as f64, 1.0, DType::I64)?;
    let queries = Tensor::arange(past as f64, (past + tokens) as f64, 1.0, DType::I64)?;
    keys.unsqueeze(0)?.gt(&queries.unsqueeze(1)?)
}
