#!/usr/bin/env python3
"""Fits the polynomial coefficients of src/backends/cpu/cpu_vmath_impl.h's float32 erf.

erf(x) = x + x * Q(x^2) below |x| = 1.125 (Q of degree 7), and 1 - exp(R(|x|)) above, with R
of degree 8 in |x| - 2.5234375 approximating log(erfc(|x|)) up to 3.921875 (where erf rounds
to 1 in float). Least squares on Chebyshev nodes, then Lawson's reweighting towards the
minimax fit; the coefficients are rounded to float and printed as C hex-float literals, with
the worst ulp of a float32 simulation of the kernel (fma emulated in double) over a sample.
Needs numpy (e.g. /work/venv-torch/bin/python scripts/fit_vmath.py)."""
import math

import numpy as np

A, TOP = 1.125, 3.921875
C = (A + TOP) / 2
erf = np.vectorize(math.erf)
erfc = np.vectorize(math.erfc)


def fit(f, lo, hi, deg, c, n=4000):
    k = np.arange(n)
    x = (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (k + 0.5) / n)
    y, V = f(x), np.vander(x - c, deg + 1, increasing=True)
    wt = np.ones_like(x)
    for _ in range(60):
        coef, *_ = np.linalg.lstsq(V * np.sqrt(wt)[:, None], y * np.sqrt(wt), rcond=None)
        wt = wt * np.abs(V @ coef - y)
        wt /= wt.sum()
    return coef


def q_of_s(s):  # erf(x) / x - 1 as a function of s = x^2
    r = np.sqrt(np.maximum(s, 1e-300))
    return np.where(s == 0, 2 / np.sqrt(np.pi) - 1, erf(r) / r - 1)


cs = fit(q_of_s, 0, A * A, 7, 0.0).astype(np.float32)
cl = fit(lambda a: np.log(erfc(a)), A, TOP, 8, C).astype(np.float32)
print("Q (x^2), highest first:", ", ".join(float(v).hex() for v in cs[::-1]))
print("R (|x| - %r), highest first:" % C, ", ".join(float(v).hex() for v in cl[::-1]))

f32 = np.float32


def fma(a, b, c):
    return (a.astype(np.float64) * b + c).astype(f32)


def vexp(y):
    n = np.round(y * f32(1.4426950408889634)).astype(f32)
    r = fma(n, f32(-0.693145751953125), y)
    r = fma(n, f32(-1.428606765330187e-06), r)
    p = f32(1 / 5040.)
    for c in (1 / 720., 1 / 120., 1 / 24., 1 / 6., 0.5, 1., 1.):
        p = fma(p, r, f32(c))
    return (p.astype(np.float64) * np.exp2(n.astype(np.float64))).astype(f32)


def verf(x):
    a, s = np.abs(x), (x * x).astype(f32)
    p = cs[-1]
    for c in cs[-2::-1]:
        p = fma(p, s, c)
    q = cl[-1]
    u = (np.minimum(a, f32(TOP)) - f32(C)).astype(f32)
    for c in cl[-2::-1]:
        q = fma(q, u, c)
    return np.where(a < f32(A), fma(x, p, x), np.copysign((f32(1) - vexp(q)).astype(f32), x))


rng = np.random.default_rng(0)
x = np.concatenate([rng.uniform(-4.5, 4.5, 2000000), np.linspace(A - 0.03, A + 0.03, 200000)]).astype(f32)
ref = erf(x.astype(np.float64))
ulp = np.spacing(np.abs(ref).astype(f32)).astype(np.float64)
print("worst ulp of the float32 simulation: %.3f" % (np.abs(verf(x) - ref) / ulp).max())
