//! A GPT-2 written on tensormem's tensors (`examples/gpt2/model.rs`) against Hugging Face's
//! `GPT2LMHeadModel`: a 2-block model with random weights, its logits for 9 tokens computed by
//! PyTorch and stored beside the weights (`tests/golden/gpt2_tiny.py` writes the file).

#[path = "../../examples/gpt2/model.rs"]
mod model;

use std::path::PathBuf;

use model::{Gpt2, KvCache};
use tensormem_tensor::{DType, SafeTensors, Tensor};

const N_LAYER: usize = 2;
const N_HEAD: usize = 4;
const EPS: f64 = 1e-5;

fn golden() -> SafeTensors {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/gpt2_tiny.safetensors");
    // SAFETY: nothing writes the checked-in file while the test maps it.
    unsafe { SafeTensors::open(&path) }.expect("tests/golden/gpt2_tiny.safetensors")
}

/// The largest absolute difference between `got` and PyTorch's `want` (infinite where either is
/// not finite: `f32::max` would skip a NaN).
fn worst(got: &Tensor, want: &[f32]) -> f32 {
    let got = got.to_vec::<f32>().unwrap();
    assert_eq!(got.len(), want.len());
    let diff = |(g, w): (&f32, &f32)| if g.is_finite() && w.is_finite() { (g - w).abs() } else { f32::INFINITY };
    got.iter().zip(want).map(diff).fold(0.0, f32::max)
}

#[test]
fn logits_match_pytorch_for_a_whole_sequence() {
    let file = golden();
    let model = Gpt2::load(&file, N_HEAD, EPS).unwrap();
    let tokens = file.tensor("tokens").unwrap();
    assert_eq!((tokens.dtype(), tokens.sizes()), (DType::I64, &[9][..]));
    let want = file.tensor_checked("logits", DType::F32, &[9, 96]).unwrap().to_vec::<f32>().unwrap();
    let mut cache = KvCache::default();
    let logits = model.forward(&tokens, &mut cache).unwrap();
    assert_eq!(logits.sizes(), [9, 96]);
    // The logits are of order 1-10; f32 sums in another order differ by a few ulps of them (1.2e-6
    // here); GELU's exact form in place of the tanh form moves them by 7e-4.
    let err = worst(&logits, &want);
    assert!(err < 2e-5, "largest difference from PyTorch: {err}");
    assert_eq!(cache.len(), 9);
    assert_eq!(cache.layers[0].0.sizes(), [N_HEAD, 9, 32 / N_HEAD]);
}

#[test]
fn decoding_token_by_token_from_the_cache_gives_the_same_logits() {
    let file = golden();
    let model = Gpt2::load(&file, N_HEAD, EPS).unwrap();
    let tokens = file.tensor("tokens").unwrap();
    let want = file.tensor_checked("logits", DType::F32, &[9, 96]).unwrap().to_vec::<f32>().unwrap();
    let mut cache = KvCache::default();
    // A prompt of 5 tokens, then 4 decode steps of one token each, the cache grown by `cat`.
    let prompt = model.forward(&tokens.narrow(0, 0, 5).unwrap(), &mut cache).unwrap();
    let err = worst(&prompt, &want[..5 * 96]);
    assert!(err < 2e-5, "prompt: largest difference from PyTorch: {err}");
    for i in 5..9 {
        let step = model.forward(&tokens.narrow(0, i as isize, 1).unwrap(), &mut cache).unwrap();
        assert_eq!(step.sizes(), [1, 96]);
        let err = worst(&step, &want[i * 96..(i + 1) * 96]);
        assert!(err < 2e-5, "token {i}: largest difference from PyTorch: {err}");
        assert_eq!(cache.len(), i + 1);
    }
    // The argmax of the last step is PyTorch's next token.
    let last = &want[8 * 96..];
    let best = (0..96).max_by(|&a, &b| last[a].total_cmp(&last[b])).unwrap();
    let mut cache = KvCache::default();
    let logits = model.forward(&tokens, &mut cache).unwrap();
    let ours = logits.select(0, 8).unwrap().argmax().unwrap().item::<i64>().unwrap();
    assert_eq!(ours, best as i64);
}

#[test]
fn in_bf16_the_logits_follow_pytorch_in_bf16() {
    let file = golden();
    let model = Gpt2::load(&file, N_HEAD, EPS).unwrap().to_dtype(DType::BF16).unwrap();
    let tokens = file.tensor("tokens").unwrap();
    let f32_logits = file.tensor_checked("logits", DType::F32, &[9, 96]).unwrap().to_vec::<f32>().unwrap();
    let torch_bf16 = file.tensor_checked("logits_bf16", DType::BF16, &[9, 96]).unwrap();
    let torch_bf16 = torch_bf16.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    let mut cache = KvCache::default();
    let ours = model.forward(&tokens.narrow(0, 0, 5).unwrap(), &mut cache).unwrap();
    assert_eq!(ours.dtype(), DType::BF16);
    let mut rows = ours.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    for i in 5..9 {
        let step = model.forward(&tokens.narrow(0, i as isize, 1).unwrap(), &mut cache).unwrap();
        rows.extend(step.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap());
    }
    let ours = Tensor::from_vec(rows, &[9, 96], DType::F32).unwrap();
    // PyTorch's bf16 logits are 0.042 from its f32 ones at most (logits up to 3.9): ours are
    // as close to both (a few bf16 ulps of the larger logits; 0.016 per ulp at 2-4).
    let from_torch = worst(&ours, &torch_bf16);
    let from_f32 = worst(&ours, &f32_logits);
    assert!(from_torch < 0.07, "largest difference from PyTorch's bf16 logits: {from_torch}");
    assert!(from_f32 < 0.07, "largest difference from the f32 logits: {from_f32}");
    eprintln!("bf16: {from_torch} from torch's bf16, {from_f32} from f32");
}

#[test]
fn the_weights_are_mapped_not_copied() {
    let file = golden();
    let model = Gpt2::load(&file, N_HEAD, EPS).unwrap();
    let w = &model.blocks[1].c_fc.weight;
    assert_eq!(w.storage().allocator_name(), "mmap");
    assert_eq!(w.sizes(), [32, 128]);
    assert!(file.mapped_bytes() >= 124_000, "{}", file.mapped_bytes());
}

#[test]
fn a_missing_weight_or_token_is_an_error_naming_it() {
    let file = golden();
    assert_eq!(Gpt2::load(&file, N_HEAD, EPS).unwrap().blocks.len(), N_LAYER);
    let err = Gpt2::load_blocks(&file, "transformer.", 3, N_HEAD, EPS).err().expect("the file has 2 blocks");
    let err = err.to_string();
    assert!(err.contains("transformer.h.2.ln_1.weight"), "{err}");
    // Tokens out of the vocabulary are refused by `embedding`, not read past the table.
    let model = Gpt2::load(&file, N_HEAD, EPS).unwrap();
    let bad = Tensor::from_vec(vec![3i64, 96], &[2], DType::I64).unwrap();
    let err = model.forward(&bad, &mut KvCache::default()).expect_err("token 96 of 96").to_string();
    assert!(err.contains("96"), "{err}");
    // Heads that do not divide the width.
    let err = Gpt2::load(&file, 5, EPS).err().expect("5 heads of 32").to_string();
    assert!(err.contains("5 heads"), "{err}");
}
