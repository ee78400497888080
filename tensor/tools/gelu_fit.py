"""The polynomial of `vmath::gelu`, refitted: prints its f32 coefficients and errors.

`erfc(z) = t e^(-z^2 + s P(s))` with `t = 1 / (1 + c z)` and `s = 1 - t`. `P` (degree 8) is the
minimax (Remez exchange) fit of `(ln(erfc(z) e^(z^2) / t)) / s`, weighted by `s`, so that the
absolute error of `s P(s)` (the relative error of `erfc`) is the smallest possible on `z` in
`[0, ZMAX]`. `c` was chosen by scanning: the error moves unevenly with it, and 0.455 gave the
least at degree 8 (1.1e-8; degree 7 gave 1e-7 at best).

    /tmp/tv/bin/pip install numpy mpmath
    /tmp/tv/bin/python tensor/tools/gelu_fit.py [--c 0.455] [--degree 8]
"""
import argparse

import mpmath as mp
import numpy as np
from numpy.polynomial import chebyshev as cheb
from numpy.polynomial import polynomial as poly

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--c", type=float, default=0.455)
ap.add_argument("--degree", type=int, default=8)
# |x| <= 14.6 in `gelu`: z = 14.6 / √2 = 10.32.
ap.add_argument("--zmax", type=float, default=10.4)
ARGS = ap.parse_args()
mp.mp.dps = 40
# `gelu` multiplies |x| by the f32 nearest c / √2; fit for the c that it stands for.
C = float(np.float32(ARGS.c / np.sqrt(2))) * np.sqrt(2)
N = ARGS.degree + 1  # coefficients of P


def target(s):
    """ln(erfc(z) e^(z^2) / t) at s = c z / (1 + c z)."""
    z = mp.mpf(s) / (C * (1 - mp.mpf(s)))
    return float(mp.log(mp.erfc(z) * mp.exp(z * z) * (1 + C * z)))


smax = C * ARGS.zmax / (1 + C * ARGS.zmax)
grid = np.unique(np.concatenate([np.linspace(0, smax, 20000), smax * (1 - np.cos(np.linspace(0, np.pi, 20000))) / 2]))
grid = grid[grid > 0]
want = np.array([target(s) for s in grid])
# s times Chebyshev polynomials on [0, smax]: s P(s) is 0 at s = 0 by construction.
basis = np.stack([grid * cheb.chebval(2 * grid / smax - 1, np.eye(N)[k]) for k in range(N)], 1)

# Remez exchange: N + 1 points where the error alternates in sign at equal size.
ref = np.searchsorted(grid, smax * (1 - np.cos(np.pi * np.arange(N + 1) / N)) / 2).clip(0, len(grid) - 1)
best = (None, np.inf)
for _ in range(40):
    a = np.concatenate([basis[ref], ((-1.0) ** np.arange(N + 1))[:, None]], 1)
    coef = np.linalg.solve(a, want[ref])[:N]
    err = basis @ coef - want
    if np.abs(err).max() < best[1]:
        best = (coef, np.abs(err).max())
    runs = np.split(np.arange(len(grid)), np.where(np.diff(np.sign(err)) != 0)[0] + 1)
    peaks = [r[np.argmax(np.abs(err[r]))] for r in runs]
    while len(peaks) > N + 1:
        peaks = peaks[1:] if abs(err[peaks[0]]) < abs(err[peaks[-1]]) else peaks[:-1]
    if len(peaks) < N + 1:
        break
    ref = np.array(peaks)

# Chebyshev in u = 2 s / smax - 1, to powers of s.
p = np.zeros(1)
for k, ck in enumerate(cheb.cheb2poly(best[0])):
    p = poly.polyadd(p, ck * poly.polypow([-1.0, 2 / smax], k))
f32 = [np.float32(v) for v in p[::-1]]  # highest power first, as `horner` takes them


def fma(a, b, c):
    # The product of two f32 is exact in f64; the sum then rounds twice (to f64, to f32), which
    # differs from one rounding only in rare ties: close enough for an error estimate.
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


worst = 0.0
for s in np.linspace(0, smax, 4001)[1:]:
    s = np.float32(s)
    acc = f32[0]
    for k in f32[1:]:
        acc = fma(acc, s, k)
    worst = max(worst, abs(float(np.float64(acc) * np.float64(s)) - target(float(s))))
print(f"c = {ARGS.c}: c / sqrt(2) = {str(np.float32(ARGS.c / np.sqrt(2)))}")
print(f"minimax error of s P(s) (relative error of erfc): {best[1]:.3e}")
print(f"evaluated in f32 by Horner with fused multiply-adds, at most {worst:.3e}")
print("P, highest power first:", ", ".join(str(v) for v in f32))
