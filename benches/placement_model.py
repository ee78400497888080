#!/usr/bin/env python3
"""What placement alone can do for peak reserved / peak requested on the shipped traces.

A model of an expandable BFC with no decommit: one address range committed up to its highest
live block end (rounded up to the 2 MiB growth granule), requests rounded to 256 bytes, a block
placed in a free chunk at the chunk's low end, growth extending the free tail. Peak reserved is
the highest committed end; the ratio is that over the peak of live requested bytes. Its first-fit
column matches the replay example's default BFC on the training stream (1.068); on inference it
gives 1.038 where the BFC gives 1.027, since the BFC uses best fit below 64 KiB.

    python3 benches/placement_model.py [trace.json ...]   # default: every trace in benches/traces

Columns:
- `first fit`, `best fit`: one range, lowest address / smallest chunk that fits.
- `oracle 2 ranges`: blocks of at least 64 MiB that the trace frees within 16 events go to a
  second range: it knows each block's lifetime, which no allocator does. What lifetime hints
  could buy.
- `learned 2 ranges`: the same split, each block's lifetime predicted from the last block freed
  with the same size class (1/8 octave) and the same two preceding large sizes (the online
  stand-in for a call site).
"""
import bisect
import json
import pathlib
import sys

GRANULE = 2 << 20
LARGE = 64 << 20
SHORT = 16  # events


class Range:
    """One expandable range: sorted free chunks (start, end) and the committed end."""

    def __init__(self, best_fit=False):
        self.free, self.top, self.best_fit = [], 0, best_fit

    def alloc(self, size):
        fits = [k for k, (s, e) in enumerate(self.free) if e - s >= size]
        if fits:
            k = min(fits, key=lambda k: self.free[k][1] - self.free[k][0]) if self.best_fit else fits[0]
            s, e = self.free[k]
            if e - s > size:
                self.free[k] = (s + size, e)
            else:
                self.free.pop(k)
            return s
        start = self.free.pop()[0] if self.free and self.free[-1][1] == self.top else self.top
        self.top = start + size
        return start

    def dealloc(self, addr, size):
        k = bisect.bisect_left(self.free, (addr, addr + size))
        s, e = addr, addr + size
        if k < len(self.free) and self.free[k][0] == e:
            e = self.free.pop(k)[1]
        if k > 0 and self.free[k - 1][1] == s:
            s = self.free.pop(k - 1)[0]
            k -= 1
        self.free.insert(k, (s, e))

    def committed(self):
        return -(-self.top // GRANULE) * GRANULE


def replay(events, ranges, choose):
    """Peak committed (summed over ranges) / peak requested; choose(i, event) picks a range."""
    live, in_use, peak_req, peak = {}, 0, 0, 0
    for i, ev in enumerate(events):
        if len(ev) == 4:
            _, ident, size, _ = ev
            r = choose(i, ev)
            rounded = -(-size // 256) * 256
            live[ident] = (r, ranges[r].alloc(rounded), rounded, size)
            in_use += size
            peak_req = max(peak_req, in_use)
            peak = max(peak, sum(x.committed() for x in ranges))
        else:
            choose(i, ev)
            r, addr, rounded, size = live.pop(ev[1])
            ranges[r].dealloc(addr, rounded)
            in_use -= size
    return peak / peak_req


def lifetimes(events):
    born, life = {}, {}
    for i, ev in enumerate(events):
        if len(ev) == 4:
            born[ev[1]] = i
        else:
            life[ev[1]] = i - born.pop(ev[1])
    return life


def size_class(size):
    b = size.bit_length() - 1
    return (b, (size >> max(b - 3, 0)) & 7)


def learned():
    """Predicts short-lived large blocks from the last freed block of the same context."""
    last, born, key, recent = {}, {}, {}, []

    def choose(i, ev):
        if len(ev) == 2:
            k = key.pop(ev[1], None)
            if k is not None:
                last[k] = i - born.pop(ev[1])
            return 0
        size = ev[2]
        if size < LARGE:
            return 0
        k = (size_class(size),) + tuple(size_class(s) for s in recent[-2:])
        recent.append(size)
        born[ev[1]], key[ev[1]] = i, k
        return 1 if last.get(k, SHORT) < SHORT else 0

    return choose


def main():
    root = pathlib.Path(__file__).resolve().parent / "traces"
    paths = sys.argv[1:] or sorted(str(p) for p in root.glob("*.json"))
    print("| trace | first fit | best fit | oracle 2 ranges | learned 2 ranges |")
    print("|---|---:|---:|---:|---:|")
    for path in paths:
        events = json.loads(pathlib.Path(path).read_text())["events"]
        life = lifetimes(events)

        def oracle(i, ev):
            return 1 if len(ev) == 4 and ev[2] >= LARGE and life.get(ev[1], SHORT) < SHORT else 0

        cells = [
            replay(events, [Range()], lambda i, ev: 0),
            replay(events, [Range(best_fit=True)], lambda i, ev: 0),
            replay(events, [Range(), Range()], oracle),
            replay(events, [Range(), Range()], learned()),
        ]
        print(f"| {pathlib.Path(path).stem} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
