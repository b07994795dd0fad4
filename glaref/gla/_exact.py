"""An independent evaluation of the recurrence at high precision: the closed form in mpmath.

Used by the trust tests (tests/test_reference_trust.py) and by the golden vectors' manifest
(glaref/gla/_golden.py) to measure the float64 oracle against exact values. It shares no code
with the oracle: it sums the closed form below term by term, each exponent from cumulative sums
of log_alpha taken at ``MP_DPS`` digits. mpmath is imported by the caller and passed in as ``mp``
(it is a test dependency, never needed by ``import glaref``).

Per (b, h), with c_0 = 0 and c_t = log_alpha_1 + ... + log_alpha_t (1-based t):
  S_t = e^{c_t} h0 + sum_{s<=t} e^{c_t - c_s} k_s^T v_s
  o_t = scale (e^{c_t} q_t h0 + sum_{s<=t} e^{c_t - c_s} (q_t.k_s) v_s),   h_T = S_T
and for L = sum_t o_t.do_t + <h_T, dh_T>:
  dv_s = scale sum_{t>=s} e^{c_t-c_s} (q_t.k_s) do_t + e^{c_T-c_s} k_s dh_T
  dk_s = scale sum_{t>=s} e^{c_t-c_s} (v_s.do_t) q_t + e^{c_T-c_s} dh_T v_s      (per head)
  dq_t = scale (e^{c_t} h0 do_t + sum_{s<=t} e^{c_t-c_s} (v_s.do_t) k_s)           (per head)
  dh0  = scale sum_t e^{c_t} q_t^T do_t + e^{c_T} dh_T
  dlog_alpha_r: log_alpha_r sits in e^{c_t} for t >= r and in e^{c_t - c_s} for s < r <= t:
       = scale sum_{t>=r} [e^{c_t} q_t h0 do_t + sum_{s<r} e^{c_t-c_s} (q_t.k_s)(v_s.do_t)]
         + e^{c_T} <h0, dh_T> + sum_{s<r} e^{c_T-c_s} k_s dh_T v_s
dq and dk are then summed over the heads of each group (g = h // (H // G)).
"""

from __future__ import annotations

import math

import numpy as np

from .._inputs import ARRAYS, Problem

MP_DPS = 50


def closed_form(p: Problem, scale: float, mp) -> dict[str, np.ndarray]:
    """Exact (to ~MP_DPS digits) o, h_T and the five gradients as object arrays of mpf."""
    B, G, H, T, dk, dv = (p.dims.B, p.dims.G, p.dims.H, p.dims.T, p.dims.dk, p.dims.dv)
    F = mp.mpf
    sc = F(scale)

    def cv(x):
        return np.vectorize(F, otypes=[object])(x) if x.size else np.empty(x.shape, object)

    q, k, v, la, h0, do, dh = (cv(getattr(p, n)) for n in ARRAYS)

    def dot(a, b):
        return mp.fsum(x * y for x, y in zip(a, b))

    zeros = lambda *s: np.full(s, F(0), dtype=object)  # noqa: E731
    o, hT, dq, dk_, dvv, dla, dh0 = (zeros(B, H, T, dv), zeros(B, H, dk, dv), zeros(B, G, T, dk),
                                     zeros(B, G, T, dk), zeros(B, H, T, dv), zeros(B, H, T),
                                     zeros(B, H, dk, dv))
    n = H // G
    for b in range(B):
        for h in range(H):
            g = h // n
            Q, K, V, DO, H0, DH = q[b, g], k[b, g], v[b, h], do[b, h], h0[b, h], dh[b, h]
            c = [F(0)]
            for t in range(T):
                c.append(c[-1] + la[b, h, t])
            e = lambda t, s: mp.exp(c[t] - c[s])  # noqa: E731, B023  (1-based t, s; s = 0 -> e^{c_t})
            # 0-based index i stands for step i + 1 below
            qk = [[dot(Q[i], K[j]) for j in range(T)] for i in range(T)]
            vdo = [[dot(V[j], DO[i]) for j in range(T)] for i in range(T)]   # vdo[t][s] = v_s.do_t
            qh0do = [dot(Q[i], [dot(H0[a], DO[i]) for a in range(dk)]) for i in range(T)]
            kdhv = [dot(K[j], [dot(DH[a], V[j]) for a in range(dk)]) for j in range(T)]
            h0dh = mp.fsum(H0[a, m] * DH[a, m] for a in range(dk) for m in range(dv))
            for i in range(T):
                for m in range(dv):
                    o[b, h, i, m] = sc * (e(i + 1, 0) * dot(Q[i], H0[:, m])
                                          + mp.fsum(e(i + 1, j + 1) * qk[i][j] * V[j, m]
                                                    for j in range(i + 1)))
            for a in range(dk):
                for m in range(dv):
                    hT[b, h, a, m] = e(T, 0) * H0[a, m] + mp.fsum(e(T, j + 1) * K[j, a] * V[j, m]
                                                                  for j in range(T))
                    dh0[b, h, a, m] = (sc * mp.fsum(e(i + 1, 0) * Q[i, a] * DO[i, m] for i in range(T))
                                       + e(T, 0) * DH[a, m])
            for j in range(T):
                for m in range(dv):
                    dvv[b, h, j, m] = (sc * mp.fsum(e(i + 1, j + 1) * qk[i][j] * DO[i, m]
                                                    for i in range(j, T))
                                       + e(T, j + 1) * dot(K[j], DH[:, m]))
                for a in range(dk):
                    dk_[b, g, j, a] += (sc * mp.fsum(e(i + 1, j + 1) * vdo[i][j] * Q[i, a]
                                                     for i in range(j, T))
                                        + e(T, j + 1) * dot(DH[a], V[j]))
            for i in range(T):
                for a in range(dk):
                    dq[b, g, i, a] += sc * (e(i + 1, 0) * dot(H0[a], DO[i])
                                            + mp.fsum(e(i + 1, j + 1) * vdo[i][j] * K[j, a]
                                                      for j in range(i + 1)))
            for r in range(1, T + 1):
                acc = [e(T, 0) * h0dh]
                acc += [e(T, s) * kdhv[s - 1] for s in range(1, r)]
                for t in range(r, T + 1):
                    acc.append(sc * e(t, 0) * qh0do[t - 1])
                    acc += [sc * e(t, s) * qk[t - 1][s - 1] * vdo[t - 1][s - 1] for s in range(1, r)]
                dla[b, h, r - 1] = mp.fsum(acc)
    return {"o": o, "h_T": hT, "q": dq, "k": dk_, "v": dvv, "log_alpha": dla, "h0": dh0}


def scaled_error(actual: np.ndarray, exact: np.ndarray, scale: np.ndarray, mp) -> tuple[float, float]:
    """(max |actual - exact| / scale, normwise relative error), differences taken in mpmath."""
    if exact.size == 0:
        return 0.0, 0.0
    diff = np.array([abs(mp.mpf(float(a)) - x) for a, x in zip(actual.ravel(), exact.ravel())], dtype=object)
    sc = scale.ravel()
    ratios = [float(d / s) if s != 0 else (0.0 if d == 0 else math.inf) for d, s in zip(diff, sc)]
    num = mp.sqrt(mp.fsum(d * d for d in diff))
    den = mp.sqrt(mp.fsum(x * x for x in exact.ravel()))
    return max(ratios), float(num / den) if den != 0 else (0.0 if num == 0 else math.inf)
