"""How far a float32 recurrent layer may be from the exact one: the bound the float recurrent ops are held to.

qrt's ``*_float`` ops and torch's float nn.RNN / nn.LSTM / nn.GRU (MKL, oneDNN: sums in orders of their own,
activations of their own) compute the same formulas in float32. Each is bounded here against the exact result
(float64 stands in for it: its own error, ~1e-16 relative, is far below these bounds), and the two differ by at
most twice that. Notation: u = 2^-24, gamma(n) = n u / (1 - n u). For one implementation, elementwise, with
|x~ - x| <= e_x and |h~ - h| <= e_h on entry to a step (the exact x, h, c below; 0 for the first step):

- a gate's pre-activation z = W_ih x + b_ih + W_hh h + b_hh (n = I + H + 2 terms, in any order and any
  grouping: a sum of n terms is within gamma(n - 1) times the sum of their magnitudes of its exact value) is
  within dz = gamma(n) (S + P) + P of the exact z, S = |W_ih| |x| + |b_ih| + |W_hh| |h| + |b_hh| and
  P = |W_ih| e_x + |W_hh| e_h (the inputs' own errors carried through); GRU's i_n = W_in x + b_in and
  h_n = W_hn h + b_hn alike, with I + 1 and H + 1 terms;
- an activation a = act(z) is within L dz + EPS_ACT, L the largest |act'| on [z - dz, z + dz] (sigmoid's
  and tanh's derivatives peak at 0, so L is taken at the point of that interval nearest 0) and EPS_ACT
  the activation's own error: qrt's sigmoid is within 2.5 ulp and tanh 1.35 ulp (docs/NUMERICS.md section 8),
  ATen's within 2 ulp (section 2), oneDNN's (torch's LSTM) taken to be as good; 3 ulp of a result in [0.5, 1)
  covers them, absolutely, on [-1, 1];
- products and sums round once each (u |value|), and a product of two inexact factors a~ b~ is within
  |a| e_b + |b| e_a + e_a e_b of a b: so LSTM's c' = f c + i g, h' = o tanh(c') and GRU's
  n = tanh(i_n + r h_n), h' = (h - n) z + n carry their factors' bounds exactly, not to first order.

Each step's bound feeds the next step's e_h (and e_c), each layer's outputs the next layer's e_x. It is a
guarantee, not an estimate, and loose: gamma(n) S is the worst case of any summation order (400 to 1000 times
what one step measures), and over T steps it is worst-case in every sign, growing by up to the row sums of
|W_hh| times L a step. The tests run few steps and print what they measure.
"""

from __future__ import annotations

import numpy as np

U = 2.0**-24
EPS_ACT = 3 * 2.0**-24  # 3 ulp of a value in [0.5, 1): qrt's (2.5 ulp) and torch's (2 ulp) sigmoid and tanh
GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-z))


def _nearest_zero(z: np.ndarray, dz: np.ndarray) -> np.ndarray:
    """The point of [z - dz, z + dz] nearest 0."""
    return np.sign(z) * np.maximum(np.abs(z) - dz, 0)


def _act(name: str, z: np.ndarray, dz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(exact act(z), bound on an implementation's act(z~) for |z~ - z| <= dz)."""
    if name == "relu":
        return np.maximum(z, 0), dz  # exact on its argument, Lipschitz 1
    w = _nearest_zero(z, dz)
    if name == "sigmoid":
        s = _sigmoid(w)
        return _sigmoid(z), s * (1 - s) * dz + EPS_ACT
    return np.tanh(z), (1 - np.tanh(w) ** 2) * dz + EPS_ACT


def _product(a: np.ndarray, ea: np.ndarray, b: np.ndarray, eb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a b and the bound on a~ b~ rounded: |a| e_b + |b| e_a + e_a e_b + u (|a b| + that)."""
    e = np.abs(a) * eb + np.abs(b) * ea + ea * eb
    return a * b, e + U * (np.abs(a * b) + e)


def _sum(a: np.ndarray, ea: np.ndarray, b: np.ndarray, eb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    e = ea + eb
    return a + b, e + U * (np.abs(a + b) + e)


def _linear(w: np.ndarray, b: np.ndarray, x: np.ndarray, ex: np.ndarray):
    """(exact W x + b, its magnitude |W| |x| + |b|, the propagated part |W| e_x)."""
    return x @ w.T + b, np.abs(x) @ np.abs(w).T + np.abs(b), ex @ np.abs(w).T


def step(kind: str, w: dict, x, ex, h, eh, c=None, ec=None):
    """One exact step of kind (rnn_tanh, rnn_relu, lstm, gru) from x, h (, c) and an implementation's bounds:
    returns (h', e_h', c', e_c'). w: float64 weight_ih, weight_hh [G*H, *], bias_ih, bias_hh [G*H]."""
    hidden, inputs = w["weight_hh"].shape[1], w["weight_ih"].shape[1]
    n = inputs + hidden + 2
    zi, si, pi = _linear(w["weight_ih"], w["bias_ih"], x, ex)
    zh, sh, ph = _linear(w["weight_hh"], w["bias_hh"], h, eh)
    if kind != "gru":
        z, dz = zi + zh, gamma(n) * (si + sh + pi + ph) + pi + ph
        if kind.startswith("rnn"):
            h2, e2 = _act(kind[4:], z, dz)
            return h2, e2, None, None
        parts = [slice(g * hidden, (g + 1) * hidden) for g in range(4)]
        (i, ei), (f, ef), (g, eg), (o, eo) = (
            _act("tanh" if k == 2 else "sigmoid", z[..., p], dz[..., p]) for k, p in enumerate(parts)
        )
        c2, ec2 = _sum(*_product(f, ef, c, ec), *_product(i, ei, g, eg))
        tc, etc = _act("tanh", c2, ec2)
        h2, eh2 = _product(o, eo, tc, etc)
        return h2, eh2, c2, ec2
    rz = slice(0, 2 * hidden)
    p = pi[..., rz] + ph[..., rz]
    z, dz = zi[..., rz] + zh[..., rz], gamma(n) * (si[..., rz] + sh[..., rz] + p) + p
    (r, er), (u, eu) = (_act("sigmoid", z[..., k], dz[..., k]) for k in (slice(0, hidden), slice(hidden, None)))
    new_gate = slice(2 * hidden, None)
    pi, ph = pi[..., new_gate], ph[..., new_gate]
    i_n, ei_n = zi[..., new_gate], gamma(inputs + 1) * (si[..., new_gate] + pi) + pi
    h_n, eh_n = zh[..., new_gate], gamma(hidden + 1) * (sh[..., new_gate] + ph) + ph
    pre, epre = _sum(i_n, ei_n, *_product(r, er, h_n, eh_n))
    new, enew = _act("tanh", pre, epre)
    diff, ediff = _sum(h, eh, -new, enew)
    h2, eh2 = _sum(*_product(diff, ediff, u, eu), new, enew)
    return h2, eh2, None, None


def layer_bound(kind: str, module, x: np.ndarray, h0=None, c0=None) -> tuple:
    """Exact (y, h_n, c_n) of a torch nn.RNN / LSTM / GRU on x (batch_first as the module) and one
    implementation's bounds (e_y, e_h, e_c) against them; twice these bound qrt against torch."""
    layers, dirs, hidden = module.num_layers, 2 if module.bidirectional else 1, module.hidden_size
    x = np.asarray(x, np.float64)
    if module.batch_first:
        x = x.transpose(1, 0, 2)
    seq, batch = x.shape[:2]
    shape = (layers * dirs, batch, hidden)
    h0 = np.zeros(shape) if h0 is None else np.asarray(h0, np.float64)
    c0 = np.zeros(shape) if c0 is None else np.asarray(c0, np.float64)
    ex = np.zeros_like(x)
    hn, ehn, cn, ecn = (np.zeros(shape) for _ in range(4))
    for n in range(layers):
        y, ey = np.zeros((seq, batch, dirs * hidden)), np.zeros((seq, batch, dirs * hidden))
        for d in range(dirs):
            sfx = f"_l{n}" + ("_reverse" if d else "")
            w = {}
            for side in ("ih", "hh"):
                w[f"weight_{side}"] = getattr(module, f"weight_{side}{sfx}").detach().double().numpy()
                bias = getattr(module, f"bias_{side}{sfx}") if module.bias else None
                w[f"bias_{side}"] = np.zeros(w[f"weight_{side}"].shape[0]) if bias is None else \
                    bias.detach().double().numpy()
            k = n * dirs + d
            h, eh, c, ec = h0[k], np.zeros((batch, hidden)), c0[k], np.zeros((batch, hidden))
            for s in range(seq):
                t = seq - 1 - s if d else s
                h, eh, c2, ec2 = step(kind, w, x[t], ex[t], h, eh, c, ec)
                if kind == "lstm":
                    c, ec = c2, ec2
                y[t, :, d * hidden : (d + 1) * hidden], ey[t, :, d * hidden : (d + 1) * hidden] = h, eh
            hn[k], ehn[k] = h, eh
            if kind == "lstm":
                cn[k], ecn[k] = c, ec
        x, ex = y, ey
    if module.batch_first:
        x, ex = x.transpose(1, 0, 2), ex.transpose(1, 0, 2)
    return (x, hn, cn), (ex, ehn, ecn)
