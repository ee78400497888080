#!/usr/bin/env python3
"""Print the allocator benchmark's figures and target ratios from criterion's estimates.

Run after `cargo bench --bench allocators`. Reads target/criterion/pair_*/<subject>/new/estimates.json.
Each figure is the mean time of one iteration: one alloc+free pair per thread (at 2 threads, both
threads' pairs run at once, so wall time per iteration covers 2 pairs).
"""
import json
import os
import pathlib
import sys

# Where criterion writes (and tensor_kernels.rs beside it): CRITERION_HOME, else the target
# directory's criterion folder.
if os.environ.get("CRITERION_HOME"):
    root = pathlib.Path(os.environ["CRITERION_HOME"])
elif os.environ.get("CARGO_TARGET_DIR"):
    root = pathlib.Path(os.environ["CARGO_TARGET_DIR"]) / "criterion"
else:
    root = pathlib.Path(__file__).resolve().parent.parent / "target" / "criterion"
if not root.is_dir():
    sys.exit(f"no criterion results under {root}: run `cargo bench --bench allocators` first")

def mean_ns(group, subject):
    p = root / group / subject / "new" / "estimates.json"
    if not p.exists():
        return None
    return json.loads(p.read_text())["mean"]["point_estimate"]

subjects = ["raw_std_alloc", "system_allocator", "raw_jemalloc", "jemalloc_allocator",
            "tracking_over_jemalloc", "mutex_hashmap_tracker_over_jemalloc"]
print("| group | " + " | ".join(subjects) + " |")
print("|---|" + "---:|" * len(subjects))
for threads in (1, 2):
    for size in ("64B", "4KiB", "1MiB"):
        g = f"pair_{size}_{threads}t"
        cells = [mean_ns(g, s) for s in subjects]
        print(f"| {g} | " + " | ".join("-" if c is None else f"{c:.1f} ns" for c in cells) + " |")

def ratio(g, a, b):
    x, y = mean_ns(g, a), mean_ns(g, b)
    return None if x is None or y is None else x / y

print()
print("| target | 64B | 4KiB | 1MiB |")
print("|---|---:|---:|---:|")
rows = [
    ("SystemAllocator / raw std::alloc, 1 thread (target <= 1.30)", 1, "system_allocator", "raw_std_alloc"),
    ("JemallocAllocator / raw jemalloc, 1 thread (no target)", 1, "jemalloc_allocator", "raw_jemalloc"),
    ("TrackingAllocator / its inner JemallocAllocator, 1 thread (target <= 2.5)", 1, "tracking_over_jemalloc", "jemalloc_allocator"),
    ("Mutex<HashMap> tracker time / TrackingAllocator time, 2 threads (target >= 2.0)", 2, "mutex_hashmap_tracker_over_jemalloc", "tracking_over_jemalloc"),
    ("SystemAllocator / raw std::alloc, 2 threads (no target)", 2, "system_allocator", "raw_std_alloc"),
]
for label, t, a, b in rows:
    vals = [ratio(f"pair_{s}_{t}t", a, b) for s in ("64B", "4KiB", "1MiB")]
    print(f"| {label} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in vals) + " |")

# --- benches/bfc.rs ------------------------------------------------------------------------
def mean(group, subject):
    return mean_ns(group, subject)

TRACES = ["torch_gpt2_inference", "torch_gpt2_train_varlen", "transformer_inference", "kv_cache_stress"]
OPS = {}
for t in TRACES:
    path = root.parent.parent / "benches" / "traces" / f"{t}.json"
    if path.exists():
        OPS[t] = len(json.loads(path.read_text())["events"])
if any((root / f"replay_{t}").is_dir() for t in TRACES):
    subjects = ["jemalloc", "bfc", "bfc_tensorflow", "pool"]
    print()
    print("| replay: ns per operation | " + " | ".join(subjects) + " | bfc / bfc_tensorflow |")
    print("|---|" + "---:|" * (len(subjects) + 1))
    for t in TRACES:
        cells = [mean(f"replay_{t}", s) for s in subjects]
        ops = OPS.get(t)
        if ops is None or all(c is None for c in cells):
            continue
        r = ratio(f"replay_{t}", "bfc", "bfc_tensorflow")
        print(f"| {t} | " + " | ".join("-" if c is None else f"{c / ops:.1f}" for c in cells)
              + f" | {'-' if r is None else f'{r:.2f}'} |")
    rows = [
        ("pool hit / JemallocAllocator pair, 64 B (target <= 1.0)", "pool_hit_pair_64B", "pool_hit", "pool_hit_pair_64B", "jemalloc_allocator"),
        ("pool hit / JemallocAllocator pair, 4 KiB (target <= 1.0)", "pool_hit_pair_4KiB", "pool_hit", "pool_hit_pair_4KiB", "jemalloc_allocator"),
        ("16 MiB allocate-write-free: system / BFC time", "fresh_pages_16MiB", "system", "fresh_pages_16MiB", "bfc"),
    ]
    print()
    print("| ratio | value | figures |")
    print("|---|---:|---|")
    for label, ga, a, gb, b in rows:
        x, y = mean(ga, a), mean(gb, b)
        if x is not None and y is not None:
            print(f"| {label} | {x / y:.2f} | {x:.1f} ns vs {y:.1f} ns |")

# --- benches/global_allocator.rs -----------------------------------------------------------
groups = sorted(p.name for p in root.glob("global_*_*t") if p.is_dir())
if groups:
    print()
    print("| global allocator: 256 allocs + frees per step | bare | global | global / bare (target <= 1.05) |")
    print("|---|---:|---:|---:|")
    for g in groups:
        x, y = mean(g, "global"), mean(g, "bare")
        if x and y:
            print(f"| {g} | {y:.0f} ns | {x:.0f} ns | {x / y:.3f} |")
    for g in groups:
        x, y = mean(g, "global_leak_check"), mean(g, "global")
        if x and y:
            print(f"| {g}: inside a leak check, cost per allocation (alloc + free) | | {x:.0f} ns | {(x - y) / 256:.0f} ns |")

# --- benches/telemetry.rs ------------------------------------------------------------------
if (root / "render_16_allocators").is_dir():
    print()
    print("| telemetry | value | figures |")
    print("|---|---:|---|")
    p = root / "render_16_allocators" / "new" / "estimates.json"
    if p.exists():
        r = json.loads(p.read_text())["mean"]["point_estimate"]
        print(f"| render() of 16 allocators (target <= 100 us) | {r / 1000:.1f} us | |")
    x, y = mean("alloc_path_64B", "with_collector"), mean("alloc_path_64B", "without_collector")
    if x and y:
        print(f"| allocation path with / without a collector registered (target <= 1.02) | {x / y:.3f} | {x:.2f} ns vs {y:.2f} ns |")

# --- benches/tensor_kernels.rs -------------------------------------------------------------
if (root / "add_4M_1t").is_dir():
    faults_path = root / "tensor_faults.json"
    faults = json.loads(faults_path.read_text()) if faults_path.exists() else {}
    side_path = root / "tensor_side_by_side.json"
    side = json.loads(side_path.read_text()) if side_path.exists() else {}
    groups = ["add_4M", "add_256K", "broadcast_2048", "transposed_2048", "contiguous_of_transposed_2048", "sum_4M", "matmul_512"]
    subjects = ["copy", "read", "gemm_direct", "contiguous_add", "default", "pool", "inplace", "out"]
    print()
    # The pool row's time is that of pool calls made between default calls (its data evicted by
    # theirs): compare it through the side-by-side ratios below, not with the default column.
    heads = [s_ if s_ != "pool" else "pool (beside default calls)" for s_ in subjects]
    print("| tensor kernels (f32), ms (page faults per call) | " + " | ".join(heads) + " |")
    print("|---|" + "---:|" * len(subjects))
    for g in groups:
        for t in (1, 2):
            name = f"{g}_{t}t"
            cells = []
            for s_ in subjects:
                m = mean(name, s_)
                f = faults.get(f"{name}/{s_}")
                cells.append("" if m is None else f"{m / 1e6:.3f}" + ("" if f is None else f" ({f:.0f})"))
            print(f"| {name} | " + " | ".join(cells) + " |")
    def r(g, a, b, t):
        x, y = mean(f"{g}_{t}t", a), mean(f"{g}_{t}t", b)
        return None if x is None or y is None else x / y
    def fmt(v):
        return "-" if v is None else f"{v:.2f}"
    print()
    print("| target | 1 thread | 2 threads | target |")
    print("|---|---:|---:|---|")
    for g in groups:
        base = {"sum_4M": "read", "matmul_512": "gemm_direct"}.get(g, "copy")
        pair = [side.get(f"{g}_{t}t/pool", [None, None]) for t in (1, 2)]
        print(f"| {g}: default / pool, calls side by side | {fmt(pair[0][0])} | {fmt(pair[1][0])} | <= 1.05 |")
        print(f"| {g}: control, default / the same op on a second default allocation | {fmt(pair[0][1])} "
              f"| {fmt(pair[1][1])} | 1 but for page placement |")
        print(f"| {g}: default / {base} | {fmt(r(g, 'default', base, 1))} | {fmt(r(g, 'default', base, 2))} | "
              + {"add_4M": "<= 1.4 (1 thread)", "matmul_512": "<= 1.1 (rows seconds apart)"}.get(g, "report") + " |")
        beside = [side.get(f"{g}_{t}t/beside_gemm", [None])[0] for t in (1, 2)]
        if any(v is not None for v in beside):
            print(f"| {g}: default / gemm_direct, calls side by side | {fmt(beside[0])} | {fmt(beside[1])} | <= 1.1 |")
        for form in ("inplace", "out"):
            if mean(f"{g}_1t", form) is not None:
                print(f"| {g}: {form} / default | {fmt(r(g, form, 'default', 1))} | {fmt(r(g, form, 'default', 2))} | <= 1.0 |")
        beside = [side.get(f"{g}_{t}t/out_beside", [None])[0] for t in (1, 2)]
        if any(v is not None for v in beside):
            print(f"| {g}: out / default, calls side by side | {fmt(beside[0])} | {fmt(beside[1])} | <= 1.0 |")
        one, two = mean(f"{g}_1t", "default"), mean(f"{g}_2t", "default")
        cone, ctwo = mean(f"{g}_1t", base), mean(f"{g}_2t", base)
        if one and two:
            extra = "" if not (cone and ctwo) else f" (the {base} baseline: {cone / ctwo:.2f}x)"
            print(f"| {g}: 2-thread scaling of default, 1t time / 2t time{extra} | {one / two:.2f} | | >= 1.7 |")
        scaling = side.get(f"{g}_2t/scaling")
        if scaling:
            print(f"| {g}: 2-thread scaling, blocks of calls side by side (the {base} baseline: {scaling[1]:.2f}x) "
                  f"| {scaling[0]:.2f} | | >= 1.7 |")
    print(f"| transposed_2048: a.t() + b / a + b | {fmt(r('transposed_2048', 'default', 'contiguous_add', 1))} "
          f"| {fmt(r('transposed_2048', 'default', 'contiguous_add', 2))} | report |")
    worst = max(faults.values(), default=None)
    if worst is not None:
        d = {k: v for k, v in faults.items() if k.endswith("/default") or k.endswith("/inplace") or k.endswith("/out")}
        print(f"| page faults per call, most of any default / inplace / out row | {max(d.values(), default=0):.1f} | | 0 |")

# --- benches/tensor_kernels.rs, groups half_256K_1t, matmul_half_512_1t, transformer_ops_1t ---
def one_thread_table(group, title, unit, scale, base, subs, besides):
    """Each row's mean (in `unit`, ns / `scale`) and its ratio to row `base`, then for each
    `(key, label)` of `besides` the ratio of the calls side by side recorded under `group/key`."""
    if not (root / group).is_dir():
        return
    side_path = root / "tensor_side_by_side.json"
    side = json.loads(side_path.read_text()) if side_path.exists() else {}
    b = mean(group, base)
    print()
    print(f"| {title} | {unit} | / {base} |")
    print("|---|---:|---:|")
    for s_ in subs:
        m = mean(group, s_)
        if m is not None:
            print(f"| {s_} | {m / scale:.3f} | {'-' if not b else f'{m / b:.2f}'} |")
    for beside_key, beside_label in besides:
        beside = side.get(f"{group}/{beside_key}")
        if beside:
            print(f"| {beside_label}, calls side by side | | {beside[0]:.2f} |")
    print()

one_thread_table("half_256K_1t", "half precision, 256K elements, 1 thread", "µs", 1e3, "f32_add",
                 ["copy", "f32_add", "f16_add", "bf16_add", "f16_add_f32", "f16_strided_add", "f16_to_f32",
                  "f32_to_f16", "bf16_to_f32", "f32_to_bf16", "f16_transposed_contiguous", "f16_transposed_to_f32",
                  "f16_sum", "bf16_sum"],
                 [("f16_beside_f32", "f16 add / f32 add")])
one_thread_table("matmul_half_512_1t", "matmul, 1 thread", "ms", 1e6, "f32",
                 ["f32", "f16", "bf16", "bf16_gpt2_mlp", "f16_gpt2_mlp", "bf16_default_beside_f32_route",
                  "f16_default_beside_f32_route"],
                 [("bf16_default_beside_f32_route", "bf16 on its default route / bf16 through f32"),
                  ("f16_default_beside_f32_route", "f16 on its default route / f16 through f32")])
one_thread_table("transformer_ops_1t", "GPT-2 block ops, 1 thread (copy: 12 MB)", "ms", 1e6, "copy",
                 ["copy", "gelu", "gelu_bf16", "gelu_f16", "gelu_of_1e-20_x", "gelu_tanh", "silu", "exp", "sigmoid", "tanh", "log",
                  "softmax_12x256x256", "log_softmax_16x50257",
                  "layer_norm_1024x768", "rms_norm_1024x768", "layer_norm_bf16_1024x768",
                  "sum_over_tokens_1024x3072", "sum_over_features_1024x3072", "max_over_tokens_1024x3072",
                  "argmax_over_tokens_1024x3072", "argmax_logits_16x50257", "argmax_logits_16x50257_f16",
                  "max_1024x3072", "max_1024x3072_bf16"],
                 [(f"{op}_blocks_beside_one_vector", f"{op}: blocks (AVX-512, or AVX2 at avx2) / one-vector loop")
                  for op in ("gelu", "gelu_tanh", "silu", "tanh", "log", "gelu_bf16")]
                 + [(f"{op}_tables_beside_computed", f"{op}: lookup tables / computed")
                    for op in ("gelu_bf16", "gelu_f16", "silu_bf16", "tanh_bf16", "exp_f16")])

# --- benches/observe.rs --------------------------------------------------------------------
if (root / "observe_pair_64B").is_dir():
    print()
    subs = ["unobserved", "hooked", "scoped", "leak_check", "history"]
    print("| observe: 64 B alloc+free pair on SystemAllocator | " + " | ".join(subs) + " |")
    print("|---|" + "---:|" * len(subs))
    cells = [mean("observe_pair_64B", s) for s in subs]
    print("| ns per pair | " + " | ".join("-" if c is None else f"{c:.1f}" for c in cells) + " |")
    h, u = mean("observe_pair_64B", "hooked"), mean("observe_pair_64B", "unobserved")
    if h and u:
        print(f"| hooked / unobserved (nothing watching; target <= 1.02) | {h / u:.3f} |")
    for s in ("scoped", "leak_check", "history"):
        w = mean("observe_pair_64B", s)
        if w and h:
            print(f"| {s}: cost per event (pair - hooked pair) / 2 | {(w - h) / 2:.0f} ns |")
