#!/usr/bin/env python3
"""A memory snapshot that PyTorch itself writes on a GPU, against the trace that
`tensormem import-torch` makes of it (run by tools/gpu_checks.sh on a GPU machine).

    python3 tools/torch_snapshot_check.py record SNAPSHOT.pickle
    tensormem import-torch SNAPSHOT.pickle -o TRACE.json
    python3 tools/torch_snapshot_check.py compare SNAPSHOT.pickle TRACE.json

`record` runs a small workload with `torch.cuda.memory._record_memory_history` on: tensors of
many sizes, temporaries of other sizes, blocks used on a second stream, and some kept to the
end, then writes `_dump_snapshot`. `compare` reads PyTorch's own events from the pickle and
checks that the trace holds exactly its requests, in order: every `alloc` with its size, and
every `free_requested` of a block allocated while recording (`free_completed` where the
snapshot has no `free_requested`), each free naming the allocation it frees. It exits 1 at the
first difference, saying where.
"""
import json
import pickle
import sys


def record(path):
    import torch

    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    kept = []
    for i in range(1, 400):
        x = torch.empty(i * 1000 + (i % 7) * 13, dtype=torch.uint8, device="cuda")
        if i % 3 == 0:
            kept.append(x)
        y = (x.float() * 2).sum()  # temporaries of other sizes
        del x, y
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        on_side = [torch.ones(1 << 20, device="cuda") for _ in range(8)]
    side.synchronize()
    del on_side, kept[::2]
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(path)
    print(f"{path}: written by torch {torch.__version__} on {torch.cuda.get_device_name()}")


def expected(snapshot, device=0):
    """PyTorch's requests: ("alloc", size) and ("free", ordinal of the allocation freed)."""
    events = snapshot["device_traces"][device]
    free = "free_requested" if any(e["action"] == "free_requested" for e in events) else "free_completed"
    live, out, allocs, earlier = {}, [], 0, 0
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = allocs
            out.append(("alloc", e["size"]))
            allocs += 1
        elif e["action"] == free:
            if e["addr"] in live:
                out.append(("free", live.pop(e["addr"])))
            else:
                earlier += 1
    return out, earlier


def converted(trace):
    """The trace's events in the same terms (allocation ids become ordinals)."""
    ordinal, out = {}, []
    for e in trace["events"]:
        if len(e) == 4:
            ordinal[e[1]] = len(ordinal)
            out.append(("alloc", e[2]))
        else:
            out.append(("free", ordinal[e[1]]))
    return out


def compare(snapshot_path, trace_path):
    with open(snapshot_path, "rb") as f:
        snapshot = pickle.load(f)
    with open(trace_path) as f:
        trace = json.load(f)
    want, earlier = expected(snapshot)
    got = converted(trace)
    allocs = sum(1 for kind, _ in want if kind == "alloc")
    for i, (w, g) in enumerate(zip(want, got)):
        if w != g:
            sys.exit(f"{trace_path}: request {i} is {g}, PyTorch's snapshot has {w}")
    if len(want) != len(got):
        sys.exit(f"{trace_path}: {len(got)} requests, PyTorch's snapshot has {len(want)}")
    if allocs == 0:
        sys.exit(f"{snapshot_path}: PyTorch recorded no allocation")
    print(f"{trace_path}: the {allocs} allocations and {len(want) - allocs} frees of PyTorch's snapshot, "
          f"in order ({earlier} frees of blocks allocated before recording left out)")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "record":
        record(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
