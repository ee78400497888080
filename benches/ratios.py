#!/usr/bin/env python3
"""Print the allocator benchmark's figures and target ratios from criterion's estimates.

Run after `cargo bench --bench allocators`. Reads target/criterion/pair_*/<subject>/new/estimates.json.
Each figure is the mean time of one iteration: one alloc+free pair per thread (at 2 threads, both
threads' pairs run at once, so wall time per iteration covers 2 pairs).
"""
import json
import pathlib
import sys

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
