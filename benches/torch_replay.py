#!/usr/bin/env python3
"""PyTorch's caching allocator on a recorded request stream: the baseline of `gpu_replay`.

Every event of the stream (allocate or free) goes through c10's
`CUDACachingAllocator::raw_alloc` / `raw_delete` from C++ (compiled at first use with
`torch.utils.cpp_extension`), timed over the whole stream as `benches/gpu_replay.rs` times its
subjects: ns per event. Prints the median of the warm passes (one cold pass first, from a fresh
allocator) and PyTorch's peak reserved over the stream's peak requested.

Run it on the GPU machine, beside the gpu_replay bench, in the same call:

    python3 benches/torch_replay.py benches/traces/torch_gpt2_train_varlen.json [passes]
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 benches/torch_replay.py ...
    python3 benches/torch_replay.py --build   # compile only (touches no GPU memory)
"""
import json, os, sys
import torch
from torch.utils.cpp_extension import load_inline

SRC = r'''
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <chrono>
#include <vector>
std::vector<double> replay(torch::Tensor ops, int64_t slots, int64_t passes) {
  auto a = ops.accessor<int64_t, 2>();
  const int64_t n = ops.size(0);
  std::vector<void*> live(slots, nullptr);
  std::vector<double> ns;
  for (int64_t p = 0; p < passes; ++p) {
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < n; ++i) {
      int64_t slot = a[i][0], size = a[i][1];
      if (size >= 0) {
        live[slot] = c10::cuda::CUDACachingAllocator::raw_alloc(size);
      } else if (live[slot]) {
        c10::cuda::CUDACachingAllocator::raw_delete(live[slot]);
        live[slot] = nullptr;
      }
    }
    auto t1 = std::chrono::steady_clock::now();
    for (auto& q : live) if (q) { c10::cuda::CUDACachingAllocator::raw_delete(q); q = nullptr; }
    ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / n);
  }
  return ns;
}
'''
mod = load_inline("tm_torch_replay", cpp_sources=SRC, functions=["replay"], with_cuda=True,
                  extra_cflags=["-O2"], verbose=False)
if sys.argv[1] == "--build":  # compile and load only: touches no GPU memory
    sys.exit(0)
path = sys.argv[1]
passes = int(sys.argv[2]) if len(sys.argv) > 2 else 7
events = json.load(open(path))["events"]
slot_of, free_slots, ops, live, peak, cur, slots = {}, [], [], {}, 0, 0, 0
for e in events:
    if len(e) > 2:
        if free_slots:
            s = free_slots.pop()
        else:
            s, slots = slots, slots + 1
        slot_of[e[1]] = s
        ops.append((s, e[2])); live[e[1]] = e[2]; cur += e[2]; peak = max(peak, cur)
    else:
        s = slot_of.pop(e[1]); free_slots.append(s)
        ops.append((s, -1)); cur -= live.pop(e[1])
t = torch.tensor(ops, dtype=torch.int64)
torch.cuda.init(); torch.cuda.reset_peak_memory_stats()
cold = mod.replay(t, slots, 1)
reserved = torch.cuda.max_memory_reserved()
warm = sorted(mod.replay(t, slots, passes))
conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default")
print(f"torch {os.path.basename(path)} [{conf}] {len(ops)} events: ns/op median {warm[len(warm)//2]:.1f} "
      f"(min {warm[0]:.1f}, max {warm[-1]:.1f}, cold {cold[0]:.1f}); peak reserved / peak requested "
      f"{reserved / peak:.3f} ({reserved} / {peak})")
