#!/usr/bin/env bash
# The device checks of the CUDA code, prepared here and run in one call on a lent GPU machine
# (../shared/gpu/README.md: that machine has the driver, PyTorch and nvcc, but no Rust).
#
#   tools/gpu_checks.sh build    # here: the cuda binaries into .gpu/ (git ignores it)
#   tools/gpu_checks.sh run      # there, from the repository root, with carry [".gpu"]
#
# `run` writes one log per check into $OUT (or .gpu/out) and a summary line per check, and
# exits non-zero when any check failed; it goes on after a failure so that one call shows all:
# - the CUDA tests of the root crate (`tests/all`: cuda::*, streams::*; `tests/env_override.rs`)
#   and the allocators' unit tests, built with the feature, under TENSORMEM_REQUIRE_CUDA=1, one
#   test at a time (the two-stream test needs the device to itself);
# - `tensormem replay --allocator cuda:0` on the shipped gpt2 streams;
# - the cudarc example (a kernel on blocks of `cuda:0`);
# - a memory snapshot written by PyTorch itself, through `tensormem import-torch`, checked
#   against PyTorch's own events (tools/torch_snapshot_check.py) and replayed on `cuda:0`;
# - the gpu_replay bench, then PyTorch's caching allocator on the same streams
#   (benches/torch_replay.py, default and expandable segments) in the same call.
set -uo pipefail
cd "$(dirname "$0")/.."

build() {
  set -e
  export CARGO_INCREMENTAL=0
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude
  rm -rf .gpu && mkdir -p .gpu/bin
  # Builds, and names the test and bench executables cargo made (a test binary is named
  # <target>-<hash>); compiler messages go to stderr as usual.
  executables() {
    cargo "$@" --message-format=json-render-diagnostics | python3 -c '
import json, sys
for m in map(json.loads, sys.stdin):
    if m.get("executable"):
        print(m["target"]["name"], m["executable"])'
  }
  {
    executables test --release --features cuda --no-run --test all --test env_override
    executables test --release -p tensormem-allocators --features cuda --no-run --lib
    executables bench --features cuda --no-run --bench gpu_replay
  } | while read -r name exe; do cp "$exe" ".gpu/bin/$name"; done
  cargo build --release --features cuda --example cudarc_kernel
  cargo build --release -p tensormem-cli --features cuda
  local target
  target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
  cp "$target/release/examples/cudarc_kernel" "$target/release/tensormem" .gpu/bin/
  strip .gpu/bin/*
  ls -l .gpu/bin
  du -sh .gpu
}

run() {
  local out=${OUT:-.gpu/out} bin=.gpu/bin failed=0
  mkdir -p "$out"
  : > "$out/summary.txt"
  export TENSORMEM_REQUIRE_CUDA=1
  check() {
    local name=$1 start=$SECONDS rc
    shift
    "$@" > "$out/$name.log" 2>&1
    rc=$?
    printf '%-28s %s (%d s)\n' "$name" "$([ "$rc" = 0 ] && echo ok || echo "FAILED rc=$rc")" \
      "$((SECONDS - start))" | tee -a "$out/summary.txt"
    [ "$rc" = 0 ] || failed=1
  }
  nvidia-smi > "$out/nvidia-smi.txt" 2>&1
  check tests-cuda "$bin/all" --test-threads=1 cuda:: streams::
  check tests-env-override "$bin/env_override" --test-threads=1
  check tests-allocators "$bin/tensormem_allocators" --test-threads=1
  for t in torch_gpt2_inference torch_gpt2_train_varlen; do
    check "replay-$t" "$bin/tensormem" replay "benches/traces/$t.json" --allocator cuda:0 --allocator bfc
  done
  check cudarc-kernel "$bin/cudarc_kernel"
  # A snapshot PyTorch itself writes, imported, checked against PyTorch's events, and replayed.
  check snapshot-record python3 tools/torch_snapshot_check.py record "$out/snapshot.pickle"
  check snapshot-import "$bin/tensormem" import-torch "$out/snapshot.pickle" -o "$out/snapshot.json" --force
  check snapshot-compare python3 tools/torch_snapshot_check.py compare "$out/snapshot.pickle" "$out/snapshot.json"
  check snapshot-replay "$bin/tensormem" replay "$out/snapshot.json" --allocator cuda:0 --allocator bfc
  check gpu-replay-bench "$bin/gpu_replay" --bench
  check torch-build python3 benches/torch_replay.py --build
  for t in torch_gpt2_inference torch_gpt2_train_varlen; do
    check "torch-$t" python3 benches/torch_replay.py "benches/traces/$t.json"
    check "torch-expandable-$t" env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
      python3 benches/torch_replay.py "benches/traces/$t.json"
  done
  # The figures, then the summary last (the run tool returns only the output's tail).
  grep -h -E '^gpu_replay|time:|^torch |snapshot' "$out"/gpu-replay-bench.log "$out"/torch-*.log \
    "$out"/snapshot-*.log
  cat "$out/summary.txt"
  return "$failed"
}

case "${1:-}" in
  build) build ;;
  run) run ;;
  *) echo "usage: tools/gpu_checks.sh build|run" >&2; exit 2 ;;
esac
