# Coefficients of the polynomials in src/kernels/philox.h's Box-Muller transform (em__normal_f32/f64),
# near-minimax fits by mpmath.chebyfit, rounded to float / double:
#   LOG: P(f) = (log1p(f) - f + f^2/2) / f^3 on [sqrt(1/2) - 1, sqrt(2) - 1] (ascending powers of f)
#   SIN: (sin(pi/2 t) / t - pi/2) / z, z = t^2 on [0, 1/4]      COS: (cos(pi/2 t) - 1 + pi^2/8 z) / z^2
#   S0C1: pi/2, its rest, pi^2/8, its rest; the code adds pi/2 - 1.5 after the SIN polynomial.
# Usage: python3 tests/normal_coeffs.py (needs mpmath). Not run by the build.
import mpmath as mp, struct
mp.mp.dps = 80
def rf(x): return struct.unpack('f', struct.pack('f', float(x)))[0]
def rd(x): return float(x)
def fit(fn, a, b, n):
    poly, err = mp.chebyfit(fn, [a, b], n, error=True)
    return poly[::-1], err
def Plog(f):
    if abs(f) < mp.mpf('1e-30'): return mp.mpf(1)/3
    return (mp.log1p(f) - f + f*f/2) / f**3
a, b = mp.mpf(11863284)/2**24 - 1, mp.mpf(11863283)/2**23 - 1
pio2 = mp.pi/2
def sinc(z):
    t = mp.sqrt(z); return mp.sin(pio2*t)/t if z > 0 else pio2
for name, rnd, nl, ns, nc in (("F", rf, 10, 4, 3), ("D", rd, 21, 6, 6)):
    lp, le = fit(Plog, a, b, nl)
    s0 = rnd(pio2); c1 = rnd(pio2**2/2)
    T = lambda z: (sinc(z) - pio2)/z if z > 0 else -pio2**3/6
    Q = lambda z: (mp.cos(pio2*mp.sqrt(z)) - 1 + pio2**2/2*z)/z**2 if z > 0 else pio2**4/24
    sp, se = fit(T, 0, mp.mpf(1)/4, ns)
    cp, ce = fit(Q, 0, mp.mpf(1)/4, nc)
    print("/* %s: log fit err 2^%s, sin 2^%s, cos 2^%s */" % (name, mp.nstr(mp.log(le,2),4), mp.nstr(mp.log(se/4/1.5,2),4), mp.nstr(mp.log(ce/16/0.7,2),4)))
    fmt = (lambda x: "%.9ef" % rnd(x)) if name == "F" else (lambda x: "%.17e" % rnd(x))
    print("LOG", name, ", ".join(fmt(c) for c in lp))
    print("S0C1", name, fmt(s0), fmt(pio2 - s0), fmt(c1), fmt(pio2**2/2 - c1), "pi/2 - 1.5:", fmt(pio2 - mp.mpf(1.5)))
    print("SIN", name, ", ".join(fmt(c) for c in sp))
    print("COS", name, ", ".join(fmt(c) for c in cp))
