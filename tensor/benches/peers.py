"""tensormem against PyTorch and numpy on a transformer's kernel workloads, measured in turn.

Each round times every workload in every library (median of CALLS calls, after 3 warm-up
calls), the libraries in rotating order, so that all of them see the same minutes of a noisy
machine; the table gives the median over the rounds, in ms, and tensormem / the best peer.
numpy runs its element-wise kernels on one thread, so it is timed at 1 thread only (its BLAS
held to one thread too).

    cargo build --release --example peers
    python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch numpy
    /tmp/tv/bin/python benches/peers.py [--rounds 5] [--calls 30] [--workloads add_f16,sum_f16]
"""
import argparse, os, statistics, subprocess, time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
import numpy as np
import torch

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--calls", type=int, default=30)
ap.add_argument("--threads", default="1,2")
ap.add_argument("--workloads", default="", help="only these workloads (comma-separated names, e.g. add_f16,sum_f16)")
ap.add_argument("--bin", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "examples", "peers"))
ARGS = ap.parse_args()

WORKLOADS = [
    ("add", "a + b, 4M, fresh output"),
    ("add_", "a += b (in place)"),
    ("add_out", "a + b into an existing tensor (out=)"),
    ("bcast", "2048x2048 + row vector"),
    ("tadd", "a.T + b, 2048x2048"),
    ("sum", "sum 4M"),
    ("matmul", "matmul 512^3"),
    ("matmul_f16", "matmul 512^3, f16"),
    ("matmul_bf16", "matmul 512^3, bf16"),
    ("add_f16", "a + b, 4M, f16"),
    ("add_bf16", "a + b, 4M, bf16"),
    ("add_mixed", "a + b, 4M, f16 + f32"),
    ("sum_f16", "sum 4M, f16"),
    ("max", "max 4M"),
    ("max_f16", "max 4M, f16"),
    ("max_bf16", "max 4M, bf16"),
    ("linear_bf16", "128x768 by a 3072x768 weight, transposed, bf16"),
    ("linear16_bf16", "16x768 by the same weight, bf16"),
    ("linear1_bf16", "1x768 by the same weight, bf16 (a decode step)"),
    ("linear16_f16", "16x768 by a 3072x768 weight, transposed, f16"),
    ("linear1_f16", "1x768 by the same weight, f16"),
    ("layer_norm", "layer_norm 1024x768, weight and bias"),
    ("rms_norm", "rms_norm 1024x768, weight"),
    ("gelu", "gelu 1024x3072"),
    ("gelu_l2", "gelu 16x3072 (input and output in L2)"),
    ("gelu_tanh", "gelu, tanh approximation, 1024x3072"),
    ("silu", "silu 1024x3072"),
    ("tanh", "tanh 1024x3072"),
    ("log", "log 1024x3072 (values in [0, 1))"),
    ("softmax", "softmax 12x256x256, last dim"),
    ("scale", "scores * 0.125, 12x256x256"),
    ("masked_fill", "masked_fill, causal 256x256 mask over 12x256x256"),
    ("where", "where(mask, scores, zeros), 12x256x256"),
    ("embedding", "embedding, 1024 ids into 50257x768"),
    ("cat_kv", "cat 12x1023x64 + 12x1x64 on dim 1 (KV cache)"),
    ("layer_norm_bf16", "layer_norm 1024x768, bf16"),
    ("rms_norm_bf16", "rms_norm 1024x768, bf16"),
    ("layer_norm_f16", "layer_norm 1024x768, f16"),
    ("softmax_f16", "softmax 12x256x256, f16"),
    ("gelu_bf16", "gelu 1024x3072, bf16"),
    ("silu_bf16", "silu 1024x3072, bf16"),
    ("softmax_bf16", "softmax 12x256x256, bf16"),
    ("to_bf16", "1024x3072 f32 to bf16"),
    ("from_bf16", "1024x3072 bf16 to f32"),
    ("log_softmax", "log_softmax 16x50257 logits, last dim"),
    ("softmax_vocab", "softmax 16x50257 logits, last dim"),
    ("sum_dim0", "sum over dim 0 of 1024x3072 (a bias gradient)"),
    ("sum_dim0_bf16", "sum over dim 0 of 1024x3072, bf16"),
    ("mean_dim1_heads", "mean over dim 1 of 12x256x256"),
    ("max_dim0", "max over dim 0 of 1024x3072"),
    ("max_dim0_bf16", "max over dim 0 of 1024x3072, bf16"),
    ("max_dim0_f16", "max over dim 0 of 1024x3072, f16"),
    ("argmax_dim0", "argmax over dim 0 of 1024x3072"),
    ("argmax_vocab", "argmax 16x50257 logits, last dim (greedy decoding)"),
    ("argmax_vocab_f16", "argmax 16x50257 logits, f16"),
    ("sum_dim0_f16", "sum over dim 0 of 1024x3072, f16"),
    ("sum_dim1_narrow", "sum over dim 1 of 1024x3072 viewed as 49152x4x16"),
    ("gpt2_prefill", "a GPT-2 block (768 wide, 12 heads) over 256 tokens"),
    ("gpt2_decode", "the same block, 1 token after 255 cached"),
    ("gpt2_prefill_bf16", "the GPT-2 block over 256 tokens, bf16"),
    ("gpt2_decode_bf16", "the GPT-2 block, 1 token after 255 cached, bf16"),
]
if ARGS.workloads:
    WORKLOADS = [w for w in WORKLOADS if w[0] in ARGS.workloads.split(",")]

N = 1 << 22
g = torch.Generator().manual_seed(0)
T = {k: torch.rand(s, generator=g) for k, s in
     {"a": [N], "b": [N], "out": [N], "m": [2048, 2048], "m2": [2048, 2048], "row": [2048], "x": [512, 512], "y": [512, 512]}.items()}
T.update({k: torch.rand(s, generator=g) for k, s in
          {"h": [1024, 768], "w768": [768], "b768": [768], "mlp": [1024, 3072], "scores": [12, 256, 256],
           "table": [50257, 768], "cache": [12, 1023, 64], "new_kv": [12, 1, 64], "logits": [16, 50257]}.items()})
T["mlp_l2"] = T["mlp"][:16]
T["zeros"] = torch.zeros(12, 256, 256)
T["causal"] = torch.arange(256).unsqueeze(0) > torch.arange(256).unsqueeze(1)
T["ids"] = torch.arange(1024) * 49 % 50257
NP = {k: v.numpy().copy() for k, v in T.items()}
# One GPT-2 block, as examples/gpt2/model.rs writes it (torch only).
T["gpt2"] = {k: torch.randn(s, generator=g) * 0.02 for k, s in
             {"c_attn": [768, 2304], "attn_proj": [768, 768], "c_fc": [768, 3072], "mlp_proj": [3072, 768]}.items()}
T["gpt2"].update({k + "_b": torch.zeros(s[1]) for k, s in
                  {"c_attn": [768, 2304], "attn_proj": [768, 768], "c_fc": [768, 3072], "mlp_proj": [3072, 768]}.items()})
T["gpt2"].update({"ln_w": torch.ones(768), "ln_b": torch.zeros(768)})
T["prompt"] = (torch.randn(256, 768, generator=g), torch.arange(256).unsqueeze(0) > torch.arange(256).unsqueeze(1))
T["step"] = (torch.randn(1, 768, generator=g), (torch.randn(12, 255, 64, generator=g), torch.randn(12, 255, 64, generator=g)),
             torch.arange(256).unsqueeze(0) > torch.arange(255, 256).unsqueeze(1))
# bf16 only in torch (numpy has no bf16); the f16 weights too.
T.update({k: torch.rand(s, generator=g).to(torch.bfloat16) for k, s in
          {"weight": [3072, 768], "tok128": [128, 768], "tok16": [16, 768], "tok1": [1, 768]}.items()})
T.update({k: torch.rand(s, generator=g).to(torch.float16) for k, s in
          {"weight16": [3072, 768], "tok16_16": [16, 768], "tok1_16": [1, 768]}.items()})
for k in ("x", "y"):
    T[k + "16"] = T[k].to(torch.float16)
    T[k + "b"] = T[k].to(torch.bfloat16)
    NP[k + "16"] = NP[k].astype(np.float16)
for k in ("a", "b"):
    T[k + "16"], T[k + "b"] = T[k].to(torch.float16), T[k].to(torch.bfloat16)
    NP[k + "16"] = NP[k].astype(np.float16)
for k in ("h", "w768", "b768", "mlp", "scores", "logits"):
    T[k + "b"] = T[k].to(torch.bfloat16)
    T[k + "16"] = T[k].to(torch.float16)
    NP[k + "16"] = NP[k].astype(np.float16)

TORCH = {
    "add": lambda t: t["a"] + t["b"],
    "add_": lambda t: t["out"].add_(t["b"]),
    "add_out": lambda t: torch.add(t["a"], t["b"], out=t["out"]),
    "bcast": lambda t: t["m"] + t["row"],
    "tadd": lambda t: t["m"].T + t["m2"],
    "sum": lambda t: t["a"].sum(),
    "max": lambda t: t["a"].max(),
    "max_f16": lambda t: t["a16"].max(),
    "max_bf16": lambda t: t["ab"].max(),
    "matmul": lambda t: t["x"] @ t["y"],
    "matmul_f16": lambda t: t["x16"] @ t["y16"],
    "matmul_bf16": lambda t: t["xb"] @ t["yb"],
    "add_f16": lambda t: t["a16"] + t["b16"],
    "add_mixed": lambda t: t["a16"] + t["b"],
    "add_bf16": lambda t: t["ab"] + t["bb"],
    "sum_f16": lambda t: t["a16"].sum(),
    "linear_bf16": lambda t: t["tok128"] @ t["weight"].T,
    "linear16_bf16": lambda t: t["tok16"] @ t["weight"].T,
    "linear1_bf16": lambda t: t["tok1"] @ t["weight"].T,
    "linear16_f16": lambda t: t["tok16_16"] @ t["weight16"].T,
    "linear1_f16": lambda t: t["tok1_16"] @ t["weight16"].T,
    "layer_norm": lambda t: torch.nn.functional.layer_norm(t["h"], [768], t["w768"], t["b768"], 1e-5),
    "rms_norm": lambda t: torch.nn.functional.rms_norm(t["h"], [768], t["w768"]),
    "gelu": lambda t: torch.nn.functional.gelu(t["mlp"]),
    "gelu_l2": lambda t: torch.nn.functional.gelu(t["mlp_l2"]),
    "gelu_tanh": lambda t: torch.nn.functional.gelu(t["mlp"], approximate="tanh"),
    "silu": lambda t: torch.nn.functional.silu(t["mlp"]),
    "tanh": lambda t: torch.tanh(t["mlp"]),
    "log": lambda t: torch.log(t["mlp"]),
    "softmax": lambda t: t["scores"].softmax(-1),
    "scale": lambda t: t["scores"] * 0.125,
    "masked_fill": lambda t: t["scores"].masked_fill(t["causal"], float("-inf")),
    "where": lambda t: torch.where(t["causal"], t["scores"], t["zeros"]),
    "embedding": lambda t: torch.nn.functional.embedding(t["ids"], t["table"]),
    "cat_kv": lambda t: torch.cat([t["cache"], t["new_kv"]], 1),
    "layer_norm_bf16": lambda t: torch.nn.functional.layer_norm(t["hb"], [768], t["w768b"], t["b768b"], 1e-5),
    "rms_norm_bf16": lambda t: torch.nn.functional.rms_norm(t["hb"], [768], t["w768b"]),
    "layer_norm_f16": lambda t: torch.nn.functional.layer_norm(t["h16"], [768], t["w76816"], t["b76816"], 1e-5),
    "softmax_f16": lambda t: t["scores16"].softmax(-1),
    "gelu_bf16": lambda t: torch.nn.functional.gelu(t["mlpb"]),
    "silu_bf16": lambda t: torch.nn.functional.silu(t["mlpb"]),
    "softmax_bf16": lambda t: t["scoresb"].softmax(-1),
    "to_bf16": lambda t: t["mlp"].to(torch.bfloat16),
    "from_bf16": lambda t: t["mlpb"].float(),
    "log_softmax": lambda t: t["logits"].log_softmax(-1),
    "softmax_vocab": lambda t: t["logits"].softmax(-1),
    "sum_dim0": lambda t: t["mlp"].sum(0),
    "sum_dim0_bf16": lambda t: t["mlpb"].sum(0),
    "mean_dim1_heads": lambda t: t["scores"].mean(1),
    "max_dim0": lambda t: t["mlp"].amax(0),
    "max_dim0_bf16": lambda t: t["mlpb"].amax(0),
    "max_dim0_f16": lambda t: t["mlp16"].amax(0),
    "argmax_dim0": lambda t: t["mlp"].argmax(0),
    "argmax_vocab": lambda t: t["logits"].argmax(-1),
    "argmax_vocab_f16": lambda t: t["logits16"].argmax(-1),
    "sum_dim0_f16": lambda t: t["mlp16"].sum(0),
    "sum_dim1_narrow": lambda t: t["mlp"].view(49152, 4, 16).sum(1),
}
NUMPY = {
    "add": lambda t: t["a"] + t["b"],
    "add_": lambda t: np.add(t["out"], t["b"], out=t["out"]),
    "add_out": lambda t: np.add(t["a"], t["b"], out=t["out"]),
    "bcast": lambda t: t["m"] + t["row"],
    "tadd": lambda t: t["m"].T + t["m2"],
    "sum": lambda t: t["a"].sum(),
    "max": lambda t: t["a"].max(),
    "max_f16": lambda t: t["a16"].max(),
    "matmul": lambda t: t["x"] @ t["y"],
    "matmul_f16": lambda t: t["x16"] @ t["y16"],
    "add_f16": lambda t: t["a16"] + t["b16"],
    "add_mixed": lambda t: t["a16"] + t["b"],
    "sum_f16": lambda t: t["a16"].sum(),
    "scale": lambda t: t["scores"] * np.float32(0.125),
    "masked_fill": lambda t: np.where(t["causal"], np.float32(-np.inf), t["scores"]),
    "where": lambda t: np.where(t["causal"], t["scores"], t["zeros"]),
    "embedding": lambda t: t["table"][t["ids"]],
    "cat_kv": lambda t: np.concatenate([t["cache"], t["new_kv"]], 1),
    "sum_dim0": lambda t: t["mlp"].sum(0),
    "mean_dim1_heads": lambda t: t["scores"].mean(1),
    "max_dim0": lambda t: t["mlp"].max(0),
    "max_dim0_f16": lambda t: t["mlp16"].max(0),
    "argmax_dim0": lambda t: t["mlp"].argmax(0),
    "argmax_vocab": lambda t: t["logits"].argmax(-1),
    "argmax_vocab_f16": lambda t: t["logits16"].argmax(-1),
    "sum_dim0_f16": lambda t: t["mlp16"].sum(0),
    "sum_dim1_narrow": lambda t: t["mlp"].reshape(49152, 4, 16).sum(1),
}


def gpt2_block(w, x, past, mask):
    """examples/gpt2/model.rs's `Gpt2::block` in PyTorch, op for op."""
    F = torch.nn.functional
    t = x.shape[0]
    qkv = F.layer_norm(x, [768], w["ln_w"], w["ln_b"], 1e-5) @ w["c_attn"]
    qkv.add_(w["c_attn_b"])
    q, k, v = (qkv.narrow(1, j * 768, 768).view(t, 12, 64).transpose(0, 1) for j in range(3))
    if past is None:
        k, v = k.contiguous(), v.contiguous()
    else:
        k, v = torch.cat([past[0], k], 1), torch.cat([past[1], v], 1)
    scores = q @ k.transpose(1, 2)
    scores.mul_(0.125).masked_fill_(mask, float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(0, 1).reshape(t, 768)
    a = y @ w["attn_proj"]
    a.add_(w["attn_proj_b"])
    h = x + a
    m = F.layer_norm(h, [768], w["ln_w"], w["ln_b"], 1e-5) @ w["c_fc"]
    m.add_(w["c_fc_b"])
    m = F.gelu(m, approximate="tanh")
    o = m @ w["mlp_proj"]
    o.add_(w["mlp_proj_b"])
    h.add_(o)
    return h, (k, v)


TORCH["gpt2_prefill"] = lambda t: gpt2_block(t["gpt2"], t["prompt"][0], None, t["prompt"][1])
TORCH["gpt2_decode"] = lambda t: gpt2_block(t["gpt2"], t["step"][0], t["step"][1], t["step"][2])
T["gpt2_bf16"] = {k: v.to(torch.bfloat16) for k, v in T["gpt2"].items()}
T["prompt_bf16"] = T["prompt"][0].to(torch.bfloat16)
T["step_bf16"] = (T["step"][0].to(torch.bfloat16), tuple(c.to(torch.bfloat16) for c in T["step"][1]))
TORCH["gpt2_prefill_bf16"] = lambda t: gpt2_block(t["gpt2_bf16"], t["prompt_bf16"], None, t["prompt"][1])
TORCH["gpt2_decode_bf16"] = lambda t: gpt2_block(t["gpt2_bf16"], t["step_bf16"][0], t["step_bf16"][1], t["step"][2])


def median_ms(f, data):
    for _ in range(3):
        f(data)
    times = []
    for _ in range(ARGS.calls):
        start = time.perf_counter()
        f(data)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    ours = subprocess.Popen([ARGS.bin], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def tensormem(w, threads):
        ours.stdin.write(f"{w} {threads} {ARGS.calls}\n")
        ours.stdin.flush()
        return float(ours.stdout.readline())

    threads = [int(t) for t in ARGS.threads.split(",")]
    res = {}  # (workload, threads, library) -> [ms per round]
    for r in range(ARGS.rounds):
        for t in threads:
            torch.set_num_threads(t)
            libs = [("tensormem", lambda w: tensormem(w, t)), ("torch", lambda w: median_ms(TORCH[w], T))]
            if t == 1:
                libs.append(("numpy", lambda w: median_ms(NUMPY[w], NP)))
            libs = libs[r % len(libs):] + libs[:r % len(libs)]
            for w, _ in WORKLOADS:
                for name, f in libs:
                    if name != "numpy" or w in NUMPY:  # numpy has no bf16
                        res.setdefault((w, t, name), []).append(f(w))
    ours.stdin.close()
    ours.wait()
    print(f"median over {ARGS.rounds} rounds of the median of {ARGS.calls} calls, ms; torch {torch.__version__}, numpy {np.__version__}")
    print()
    print("| workload | threads | tensormem | torch | numpy | tensormem / best peer |")
    print("|---|---:|---:|---:|---:|---:|")
    for w, label in WORKLOADS:
        for t in threads:
            m = {lib: statistics.median(v) for (ww, tt, lib), v in res.items() if ww == w and tt == t}
            peers = {k: v for k, v in m.items() if k != "tensormem"}
            best = min(peers, key=peers.get)
            fmt = lambda k: f"{m[k]:.3f}" if k in m else "-"
            print(f"| {label} | {t} | {fmt('tensormem')} | {fmt('torch')} | {fmt('numpy')} | {m['tensormem'] / peers[best]:.2f} ({best}) |")


main()
