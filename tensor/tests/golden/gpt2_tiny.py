# Writes gpt2_tiny.safetensors beside this file: a 2-block GPT-2 (Hugging Face transformers'
# GPT2LMHeadModel, random weights, eager attention), 9 tokens and the logits it gives them, for
# tests/gpt2.rs; and the logits of the model in bf16. Run with torch and transformers installed:
#   python3 tests/golden/gpt2_tiny.py
import pathlib
import torch, transformers
from safetensors.torch import save_file
torch.manual_seed(0)
cfg = transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4,
    activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    initializer_range=0.2, layer_norm_epsilon=1e-5, bos_token_id=None, eos_token_id=None)
cfg._attn_implementation = "eager"
m = transformers.GPT2LMHeadModel(cfg).eval()
with torch.no_grad():
    for n, p in m.named_parameters():
        # Norms and biases start at 1 and 0: move them, so that the test sees them used.
        if "ln" in n:
            p.add_(0.1 * torch.randn_like(p))
        elif n.endswith("bias"):
            p.copy_(0.1 * torch.randn_like(p))
tokens = torch.randint(0, 96, (9,))
with torch.no_grad():
    logits = m(tokens[None]).logits[0]
# lm_head.weight is wte's (tied); older transformers also keep the causal mask as attn.bias.
sd = {
    k: v.clone().contiguous()
    for k, v in m.state_dict().items()
    if k.startswith("transformer.") and not k.endswith((".attn.bias", ".attn.masked_bias"))
}
with torch.no_grad():
    # The same model in bf16: every op rounds its result to bf16, as tensormem's do.
    logits_bf16 = m.to(torch.bfloat16)(tokens[None]).logits[0]
sd["tokens"] = tokens
sd["logits"] = logits.contiguous()
sd["logits_bf16"] = logits_bf16.contiguous()
out = pathlib.Path(__file__).with_suffix(".safetensors")
save_file(sd, str(out), metadata={"n_head": "4", "layer_norm_epsilon": "1e-05"})
