#!/usr/bin/env python3
"""Numpy forward of a tiny LLaDA2 fixture with BF16 rounding emulated at chosen points.

What it emulates (one forward over the golden 96-token sequence of golden.safetensors):

* ``f32``: the F32 reference (BF16 weights upcast, everything in F32, softmax attention). It must
  reproduce the golden ``logits`` to ~1e-4; this checks the model code against
  /work/shared/docs/llada2-model.md.
* ``torch``: the official modeling code run in BF16 by PyTorch eager on the CPU (the golden
  ``logits_bf16``): every op's output rounded to BF16 (linear outputs, residual adds, RMSNorm
  before and after the weight, QK-norm, RoPE's cos/sin and its three products/sums, SiLU and the
  SwiGLU product), RoPE's ``inv_freq`` buffer rounded to BF16 (``model.to(torch.bfloat16)`` casts
  that non-persistent buffer too; with it this emulation reproduces the BF16 run's expert choices
  on v20 and v22), SDPA's CPU flash kernel (F32 scores, one softmax max over all keys,
  exp(s - max) rounded to BF16 for P.V, the normaliser summed from the unrounded F32
  exponentials), the router in F32 with ``expert_bias`` rounded to BF16, the expert mix in F32
  then cast, the shared expert added in BF16, BF16 logits. ``torch-eager`` is the same with the
  eager attention (BF16 scores, F32 softmax, normalised P rounded to BF16).
* ``minnow``: minnow's CUDA forward (crates/minnow-model/src/cuda/forward.rs, kernels/*.cu) in
  its batch-invariant mode: the same rounding points as ``torch`` except the attention kernel
  (kernels/attention.cu: keys in tiles of 64 with an online max, P rounded to BF16 relative to
  the running max, the normaliser summed from the rounded P), ``expert_bias`` kept in F32,
  ``inv_freq`` in F32, and the residual stream in F32 (layers' outputs join it unrounded).

A variant is a preset with some rounding points moved: ``preset:point=value,point=value``
(``--list`` shows the points and each preset's values). GEMMs multiply BF16 values (exact
products) and accumulate in the order ``--accum`` names; BF16 rounding is round-to-nearest-even
on the F32 bits (integer arithmetic). With ``--gpu-dir`` the real GPU logits (raw little-endian
F32, ``<fixture>_full.f32``, 96 x vocab) join the comparison. ``--seeds N --dither EPS`` runs each
variant N times with a relative noise of EPS added before every BF16 rounding: the spread of its
top-1 agreement shows how much of a single run's count is chance (which near-boundary values
happen to round which way) rather than the variant's rounding points.

Example:
    python3 scripts/fidelity/emulate.py /work/shared/fixtures/llada2-tiny-v2{0,1,2} \\
        --variants f32 torch minnow minnow:bias_bf16=1 --gpu-dir /work/notes/gpu_logits
    python3 scripts/fidelity/emulate.py tests/fixtures/llada2-tiny-v20 --seeds 300 --dither 1.5e-5 \
        --variants torch minnow minnow:attn_l=f32
"""

import argparse
import json
import os
import struct
import sys
from collections import Counter

import numpy as np

# ---------------------------------------------------------------------------------------------
# BF16 and safetensors


def bf16(x):
    """Round F32 values to BF16 (round to nearest, ties to even), returned as F32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    b = x.view(np.uint32)
    lsb = (b >> np.uint32(16)) & np.uint32(1)
    r = (b + np.uint32(0x7FFF) + lsb) & np.uint32(0xFFFF0000)
    r = np.where(np.isnan(x), b | np.uint32(0x00400000), r)  # keep NaN a (quiet) NaN
    return r.astype(np.uint32).view(np.float32)


def load_safetensors(path):
    """All tensors of a safetensors file as numpy arrays (BF16 widened to F32), plus metadata."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    kinds = {"F32": np.float32, "I64": np.int64, "U8": np.uint8, "F16": np.float16}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        s, e = info["data_offsets"]
        raw = data[base + s : base + e]
        if info["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << np.uint32(16)
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=kinds[info["dtype"]])
        out[name] = arr.reshape(info["shape"]).copy()
    return out, header.get("__metadata__", {})


# ---------------------------------------------------------------------------------------------
# Rounding points and presets

# name: (meaning, f32, torch, minnow)
POINTS = {
    "norm_inner": ("RMSNorm: F32(h) * rsqrt(..) rounded to BF16 before the weight", 0, 1, 1),
    "norm_out": ("RMSNorm: weight * normed rounded to BF16", 0, 1, 1),
    "linear_out": ("QKV and gate/up GEMM outputs rounded to BF16", 0, 1, 1),
    "o_out": ("attention output projection (O) rounded to BF16", 0, 1, 1),
    "down_out": ("down projections (dense MLP, experts, shared expert) rounded to BF16", 0, 1, 1),
    "qk_inner": ("QK-norm: F32(x) * rsqrt(..) rounded to BF16 before the weight", 0, 1, 1),
    "qk_out": ("QK-norm: weight * normed rounded to BF16 (RoPE's input)", 0, 1, 1),
    "rope_cs": ("RoPE cos/sin rounded to BF16", 0, 1, 1),
    "rope_prod": ("RoPE x*cos and rot(x)*sin each rounded to BF16", 0, 1, 1),
    "rope_out": ("RoPE's result (every Q/K element: the attention's input) rounded to BF16", 0, 1, 1),
    "rope_inv_freq_bf16": ("inv_freq buffer rounded to BF16 (a model.to(bfloat16) cast)", 0, 1, 0),
    "attn": ("attention kernel: f32 | flash (SDPA CPU) | eager | tiled (minnow)", "f32", "flash", "tiled"),
    "attn_p": ("P rounded to BF16 before P.V", 0, 1, 1),
    "attn_l": ("softmax normaliser from: f32 exps | rounded P (flash/tiled only)", "f32", "f32", "rounded"),
    "attn_tile": ("keys per online-softmax tile (tiled only)", 64, 64, 64),
    "attn_out": ("attention output rounded to BF16", 0, 1, 1),
    "residual": ("residual adds rounded to BF16", 0, 1, 0),
    "silu_act": ("SiLU output rounded to BF16 before the product with up", 0, 1, 1),
    "swiglu_out": ("SwiGLU product rounded to BF16 (the down projection's input)", 0, 1, 1),
    "bias_bf16": ("expert_bias rounded to BF16", 0, 1, 0),
    "mix_out": ("routed mix (F32) rounded to BF16 before the shared expert is added", 0, 1, 1),
    "moe_out": ("routed + shared rounded to BF16", 0, 1, 1),
    "logits_out": ("lm_head output rounded to BF16", 0, 1, 1),
}
PRESETS = {"f32": 1, "torch": 2, "minnow": 3}
DERIVED = {
    "torch-eager": ("torch", {"attn": "eager"}),
    "torch-f32rope": ("torch", {"rope_inv_freq_bf16": 0}),
    # What keeping every rounding point inside a kernel in F32 would give (norms before their
    # weight, QK-norm and RoPE up to the attention's BF16 input, SiLU before its product, the MoE
    # mix): measured in session 43 at 280.7 of 288 F32 top-1 tokens against minnow's 282.3
    # (200 dithered runs of v20-v22), so the GPU kernels keep those roundings.
    "minnow-f32-inner": ("minnow", {p: 0 for p in ("norm_inner", "qk_inner", "qk_out", "rope_cs", "rope_prod",
                                                   "silu_act", "mix_out", "moe_out")}),
}


def preset(name):
    if name in DERIVED:
        base, over = DERIVED[name]
        cfg = preset(base)
        cfg.update(over)
        return cfg
    col = PRESETS[name]
    return {k: v[col] for k, v in POINTS.items()}


def parse_value(name, text):
    default = POINTS[name][1]
    if isinstance(default, str):
        return text
    return int(text)


def variant(spec):
    """'preset' or 'preset:name=value,name=value'."""
    base, _, rest = spec.partition(":")
    cfg = preset(base)
    for item in filter(None, rest.split(",")):
        k, _, v = item.partition("=")
        if k not in POINTS:
            raise SystemExit(f"unknown rounding point {k!r} (see --list)")
        cfg[k] = parse_value(k, v)
    return cfg


# ---------------------------------------------------------------------------------------------
# Arithmetic helpers


class Arith:
    """The rounding of one variant plus the GEMM accumulation order."""

    def __init__(self, cfg, accum, seed=0, dither=0.0):
        self.cfg = cfg
        self.accum = accum
        self.rng = np.random.default_rng(seed)
        self.dither = dither

    def r(self, point, x):
        if not self.cfg.get(point):
            return np.asarray(x, dtype=np.float32)
        x = np.asarray(x, dtype=np.float32)
        if self.dither:
            # Noise model: every value about to be rounded moves by a relative |u| < dither, so
            # values near a BF16 rounding boundary may round the other way, as they do between
            # two implementations with the same rounding points but other F32 arithmetic.
            x = (x * (1 + self.dither * self.rng.uniform(-1, 1, x.shape))).astype(np.float32)
        return bf16(x)

    def mm(self, x, w):
        """x[m, k] . w[n, k]^T with F32 accumulation in the chosen order (F32 result)."""
        x = np.asarray(x, np.float32)
        w = np.asarray(w, np.float32)
        if self.accum == "f64":
            return (x.astype(np.float64) @ w.astype(np.float64).T).astype(np.float32)
        if self.accum == "blas":
            return x @ w.T
        if self.accum == "perm":
            # Another valid F32 order: the K terms in a random order, then BLAS.
            order = self.rng.permutation(x.shape[1])
            return np.ascontiguousarray(x[:, order]) @ np.ascontiguousarray(w[:, order]).T
        order = range(x.shape[1]) if self.accum == "seq" else range(x.shape[1] - 1, -1, -1)
        acc = np.zeros((x.shape[0], w.shape[0]), np.float32)
        for j in order:
            acc = acc + np.outer(x[:, j], w[:, j]).astype(np.float32)
        return acc

    def linear(self, x, w):
        return self.r("linear_out", self.mm(x, w))

    def rmsnorm(self, v, weight, eps, inner="norm_inner", out="norm_out"):
        u = np.asarray(v, np.float32)
        ms = np.mean(u.astype(np.float32) ** 2, axis=-1, keepdims=True, dtype=np.float32)
        u = u * (np.float32(1.0) / np.sqrt(ms + np.float32(eps))).astype(np.float32)
        return self.r(out, weight * self.r(inner, u))

    def silu_mul(self, g, u):
        s = (g / (np.float32(1.0) + np.exp(-g))).astype(np.float32)
        return self.r("swiglu_out", self.r("silu_act", s) * u)

    def swiglu(self, x, gate, up, down):
        return self.r("down_out", self.mm(self.silu_mul(self.linear(x, gate), self.linear(x, up)), down))


# ---------------------------------------------------------------------------------------------
# Model


def attention(ar, q, k, v, limits, scale):
    """q [T, H, d], k/v [T, G, d]; query t sees keys [0, limits[t]). Returns [T, H, d] (F32)."""
    cfg = ar.cfg
    T, H, d = q.shape
    G = k.shape[1]
    out = np.zeros((T, H, d), np.float32)
    keys = np.arange(T)
    allowed = keys[None, :] < limits[:, None]
    for h in range(H):
        g = h // (H // G)
        s = ar.mm(q[:, h, :], k[:, g, :])  # [T, T] F32
        mode = cfg["attn"]
        if mode == "eager":
            s = bf16(bf16(s) * np.float32(scale))
            s = np.where(allowed, s, -np.inf).astype(np.float32)
            m = s.max(axis=1, keepdims=True)
            e = np.exp(s - m).astype(np.float32)
            p = (e / e.sum(axis=1, keepdims=True, dtype=np.float32)).astype(np.float32)
            p = ar.r("attn_p", p)
            o = ar.mm(p, v[:, g, :].T)
        elif mode in ("f32", "flash"):
            s = (s * np.float32(scale)).astype(np.float32)
            s = np.where(allowed, s, -np.inf).astype(np.float32)
            m = s.max(axis=1, keepdims=True)
            e = np.exp(s - m).astype(np.float32)
            p = ar.r("attn_p", e)
            src = p if cfg["attn_l"] == "rounded" else e
            l_sum = src.sum(axis=1, keepdims=True, dtype=np.float32)
            o = (ar.mm(p, v[:, g, :].T) / l_sum).astype(np.float32)
        elif mode == "tiled":
            tile = int(cfg["attn_tile"])
            o = np.zeros((T, d), np.float32)
            m = np.full((T, 1), -np.inf, np.float32)
            l_sum = np.zeros((T, 1), np.float32)
            for kb in range(0, int(limits.max()), tile):
                cols = slice(kb, min(kb + tile, T))
                st = (s[:, cols] * np.float32(scale)).astype(np.float32)
                ok = allowed[:, cols]
                st = np.where(ok, st, -np.inf).astype(np.float32)
                m_new = np.maximum(m, st.max(axis=1, keepdims=True))
                live = np.isfinite(m_new)
                e = np.where(ok & live, np.exp(st - np.where(live, m_new, 0)), 0).astype(np.float32)
                p = ar.r("attn_p", e)
                src = p if cfg["attn_l"] == "rounded" else e
                alpha = np.where(live & np.isfinite(m), np.exp(m - np.where(live, m_new, 0)), 1).astype(
                    np.float32
                )
                alpha = np.where(np.isfinite(m), alpha, 1).astype(np.float32)
                l_sum = (l_sum * alpha + src.sum(axis=1, keepdims=True, dtype=np.float32)).astype(np.float32)
                o = (o * alpha + ar.mm(p, v[cols, g, :].T)).astype(np.float32)
                m = m_new
            o = (o / l_sum).astype(np.float32)
        else:
            raise SystemExit(f"unknown attn mode {mode!r}")
        out[:, h, :] = o
    return ar.r("attn_out", out)


def rope_tables(cfg_model, ar, positions):
    d = cfg_model["head_dim"]
    rot = int(d * cfg_model.get("partial_rotary_factor", 0.5))
    theta = np.float32(cfg_model["rope_theta"])
    exps = (np.arange(0, rot, 2, dtype=np.int64).astype(np.float32) / np.float32(rot)).astype(np.float32)
    inv_freq = (np.float32(1.0) / np.power(theta, exps, dtype=np.float32)).astype(np.float32)
    if ar.cfg["rope_inv_freq_bf16"]:
        inv_freq = bf16(inv_freq)
    ang = (positions.astype(np.float32)[:, None] * inv_freq[None, :]).astype(np.float32)
    emb = np.concatenate([ang, ang], axis=1)
    cos, sin = np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)
    return rot, ar.r("rope_cs", cos), ar.r("rope_cs", sin)


def apply_rope(ar, x, rot, cos, sin):
    """x [T, heads, d]; NeoX rotate-half on the first `rot` dims."""
    xr = x[..., :rot]
    half = rot // 2
    rh = np.concatenate([-xr[..., half:], xr[..., :half]], axis=-1)
    a = ar.r("rope_prod", xr * cos[:, None, :])
    b = ar.r("rope_prod", rh * sin[:, None, :])
    y = a + b
    return ar.r("rope_out", np.concatenate([y, x[..., rot:]], axis=-1))


def route(ar, c, logits, bias, block_rows):
    """Returns (ids [T, k] in rank order, weights [T, k] F32, margin-free)."""
    E = c["num_experts"]
    k = c["num_experts_per_tok"]
    s = (np.float32(1.0) / (np.float32(1.0) + np.exp(-logits))).astype(np.float32)
    b = (s + bias[None, :]).astype(np.float32)
    T = s.shape[0]
    ids = np.zeros((T, k), np.int64)
    cap = c.get("expert_capacity")

    def topk(vals, kk):
        # larger first, lower index on ties
        order = sorted(range(len(vals)), key=lambda j: (-float(vals[j]), j))
        return order[:kk]

    if cap is not None:
        for b0 in range(0, T, block_rows):
            rows = range(b0, min(T, b0 + block_rows))
            g = b[list(rows)].max(axis=0)
            pool = topk(g, cap)
            for t in rows:
                cand = np.full(E, -np.inf, np.float32)
                cand[pool] = b[t, pool]
                ids[t] = topk(cand, k)
    else:
        ng, tg = c["n_group"], c["topk_group"]
        gs = E // ng
        for t in range(T):
            grp = [float(np.sort(b[t, i * gs : (i + 1) * gs])[-2:].sum(dtype=np.float32)) for i in range(ng)]
            keep = topk(grp, tg)
            cand = np.full(E, -np.inf, np.float32)
            for gi in keep:
                cand[gi * gs : (gi + 1) * gs] = b[t, gi * gs : (gi + 1) * gs]
            ids[t] = topk(cand, k)
    chosen = np.take_along_axis(s, ids, axis=1)
    w = (chosen / (chosen.sum(axis=1, keepdims=True, dtype=np.float32) + np.float32(1e-20))).astype(np.float32)
    w = (w * np.float32(c["routed_scaling_factor"])).astype(np.float32)
    return ids, w


def forward(fx, ar, record=None):
    """One forward of fixture `fx` (dict with config, weights, golden). Returns F32 logits."""
    c = fx["config"]
    W = fx["weights"]
    gold = fx["golden"]
    ids = gold["input_ids"].astype(np.int64)
    pos = gold["position_ids"].astype(np.int64)
    T = len(ids)
    H, G, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    eps = c["rms_norm_eps"]
    block = 32
    limits = np.minimum((pos // block + 1) * block, T)
    rot, cos, sin = rope_tables(c, ar, pos)
    scale = float(d) ** -0.5
    h = W["model.word_embeddings.weight"][ids].astype(np.float32)
    for li in range(c["num_hidden_layers"]):
        p = f"model.layers.{li}."
        a = ar.rmsnorm(h, W[p + "input_layernorm.weight"], eps)
        qkv = ar.linear(a, W[p + "attention.query_key_value.weight"])
        q = qkv[:, : H * d].reshape(T, H, d)
        k = qkv[:, H * d : (H + G) * d].reshape(T, G, d)
        v = qkv[:, (H + G) * d :].reshape(T, G, d)
        q = ar.rmsnorm(q, W[p + "attention.query_layernorm.weight"], eps, "qk_inner", "qk_out")
        k = ar.rmsnorm(k, W[p + "attention.key_layernorm.weight"], eps, "qk_inner", "qk_out")
        q = apply_rope(ar, q, rot, cos, sin)
        k = apply_rope(ar, k, rot, cos, sin)
        o = attention(ar, q, k, v, limits, scale).reshape(T, H * d)
        o = ar.r("o_out", ar.mm(o, W[p + "attention.dense.weight"]))
        h = ar.r("residual", h + o)
        m = ar.rmsnorm(h, W[p + "post_attention_layernorm.weight"], eps)
        if li < c["first_k_dense_replace"]:
            y = ar.swiglu(m, W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"], W[p + "mlp.down_proj.weight"])
        else:
            logits = ar.mm(m, W[p + "mlp.gate.weight"])
            bias = W[p + "mlp.gate.expert_bias"].astype(np.float32)
            if ar.cfg["bias_bf16"]:
                bias = bf16(bias)
            sel, wts = route(ar, c, logits, bias, c.get("block_size", 32))
            if record is not None:
                record[f"router.layer{li}.logits"] = logits
                record[f"router.layer{li}.topk_ids"] = sel
                record[f"router.layer{li}.topk_weights"] = wts
            expert_rows = {}  # (token, expert) -> that expert's output row for the token
            for e in range(c["num_experts"]):
                rows = np.nonzero((sel == e).any(axis=1))[0]
                if len(rows) == 0:
                    continue
                ep = p + f"mlp.experts.{e}."
                ye = ar.swiglu(m[rows], W[ep + "gate_proj.weight"], W[ep + "up_proj.weight"], W[ep + "down_proj.weight"])
                for i, t in enumerate(rows):
                    expert_rows[(int(t), e)] = ye[i]
            # F32 mix in rank order (biased score descending), one rounding after.
            mix = np.zeros_like(m)
            for t in range(T):
                acc = np.zeros(m.shape[1], np.float32)
                for slot in range(sel.shape[1]):
                    acc = (acc + wts[t, slot] * expert_rows[(t, int(sel[t, slot]))]).astype(np.float32)
                mix[t] = acc
            y = ar.r("mix_out", mix)
            sp = p + "mlp.shared_experts."
            if sp + "gate_proj.weight" in W:
                ys = ar.swiglu(m, W[sp + "gate_proj.weight"], W[sp + "up_proj.weight"], W[sp + "down_proj.weight"])
                y = ar.r("moe_out", y + ys)
        h = ar.r("residual", h + y)
        if record is not None:
            record[f"hidden.layer{li}"] = h
    f = ar.rmsnorm(h, W["model.norm.weight"], eps)
    if record is not None:
        record["hidden.final_norm"] = f
    return ar.r("logits_out", ar.mm(f, W["lm_head.weight"]))


# ---------------------------------------------------------------------------------------------
# Driver


def load_fixture(path):
    with open(os.path.join(path, "config.json")) as fh:
        config = json.load(fh)
    weights, _ = load_safetensors(os.path.join(path, "model.safetensors"))
    golden, meta = load_safetensors(os.path.join(path, "golden.safetensors"))
    return {"name": os.path.basename(os.path.normpath(path)), "config": config, "weights": weights,
            "golden": golden, "meta": meta}


def argmax_rows(x):
    return np.argmax(x, axis=1)  # lowest index on ties, like PyTorch


def expert_sets(ids):
    return [frozenset(int(i) for i in row) for row in ids]


def evaluate(fx, cfg, accum, seed, dither=0.0):
    """One forward of a variant and its agreement with the goldens."""
    g = fx["golden"]
    rec = {}
    out = forward(fx, Arith(cfg, accum, seed, dither), rec)
    a = argmax_rows(out)
    sets = expert_sets(rec[[k for k in rec if k.endswith(".topk_ids")][0]])
    f32_sets = expert_sets(g[[k for k in g if k.endswith(".topk_ids")][0]])
    return {
        "logits": out,
        "argmax": a,
        "sets": sets,
        "record": rec,
        "top1_f32": int((a == argmax_rows(g["logits"])).sum()),
        "top1_bf16": int((a == argmax_rows(g["logits_bf16"])).sum()),
        "sets_f32": sum(x != y for x, y in zip(sets, f32_sets)),
        # Precision without the routing flips: RMS error against the F32 logits over the rows
        # whose expert sets equal the F32 run's.
        "rms_same": float(np.sqrt(np.mean((out - g["logits"])[[x == y for x, y in zip(sets, f32_sets)]] ** 2))),
        "rows_off": [int(i) for i in np.nonzero(a != argmax_rows(g["logits"]))[0]],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fixtures", nargs="*", help="fixture directories (with golden.safetensors)")
    ap.add_argument("--variants", nargs="+", default=["f32", "torch", "minnow"],
                    help="presets (f32, torch, torch-eager, minnow), optionally 'preset:point=value,...'")
    ap.add_argument("--accum", default="f64", choices=["f64", "blas", "seq", "rev", "perm"],
                    help="GEMM accumulation: exact-ish (f64 then F32), numpy BLAS F32, sequential F32 "
                         "over K, reversed sequential F32, or (perm) K in a random order per GEMM (see --seeds)")
    ap.add_argument("--seeds", type=int, default=0,
                    help="run each variant under this many seeds (random GEMM orders with --accum perm, "
                         "random dither with --dither) and print the spread of its top-1 agreement")
    ap.add_argument("--dither", type=float, default=0.0,
                    help="relative noise added before every BF16 rounding (e.g. 1.5e-5), a model of "
                         "implementation-level F32 differences; needs --seeds")
    ap.add_argument("--gpu-dir", help="directory of <fixture>_full.f32 GPU logits (raw LE F32, T x vocab)")
    ap.add_argument("--check-f32", action="store_true",
                    help="also compare the f32 variant's hidden states and router with the goldens")
    ap.add_argument("--rows", action="store_true", help="list the rows whose argmax differs from logits")
    ap.add_argument("--list", action="store_true", help="list the rounding points and the presets' values")
    args = ap.parse_args()
    if args.list:
        print(f"{'point':20} {'f32':>7} {'torch':>7} {'minnow':>7}  meaning")
        for k, (doc, a, b, c) in POINTS.items():
            print(f"{k:20} {a!s:>7} {b!s:>7} {c!s:>7}  {doc}")
        return
    if not args.fixtures:
        ap.error("no fixture directory given")
    print(f"accumulation: {args.accum}")
    for path in args.fixtures:
        fx = load_fixture(path)
        g = fx["golden"]
        ref, ref16 = g["logits"], g["logits_bf16"]
        am, am16 = argmax_rows(ref), argmax_rows(ref16)
        T = ref.shape[0]
        gpu = None
        if args.gpu_dir:
            gp = os.path.join(args.gpu_dir, f"{fx['name']}_full.f32")
            if os.path.exists(gp):
                gpu = np.fromfile(gp, dtype="<f4").reshape(T, -1)
        f32_sets = expert_sets(g[[k for k in g if k.endswith(".topk_ids")][0]])
        bf_sets = expert_sets(g[[k for k in g if k.endswith(".topk_ids_bf16")][0]])
        print(f"\n== {fx['name']} ({T} tokens); golden BF16 vs F32: max|d| "
              f"{np.abs(ref16 - ref).max():.3g}, argmax {int((am16 == am).sum())}/{T}"
              + ("" if gpu is None else f"; GPU vs F32 argmax {int((argmax_rows(gpu) == am).sum())}/{T}, "
                 f"GPU vs BF16 argmax {int((argmax_rows(gpu) == am16).sum())}/{T}"))
        head = (f"{'variant':40} {'max|d-f32|':>10} {'top1=f32':>8} {'max|d-bf16|':>11} {'same-set':>8}"
                f" {'exact':>5} {'top1=bf16':>9} {'sets!=f32':>9} {'sets!=bf16':>10} {'rms-same':>8}")
        if gpu is not None:
            head += f" {'max|d-gpu|':>10} {'exact-gpu':>9} {'top1=gpu':>8}"
        print(head)
        for spec in args.variants:
            if args.seeds:
                runs = [evaluate(fx, variant(spec), args.accum, seed, args.dither) for seed in range(args.seeds)]
                f32s = np.array([r["top1_f32"] for r in runs])
                b16s = np.array([r["top1_bf16"] for r in runs])
                sets = np.array([r["sets_f32"] for r in runs])
                rms = np.array([r["rms_same"] for r in runs])
                rows = Counter(i for r in runs for i in r["rows_off"])
                print(f"{spec:40} top1=f32 over {args.seeds} seeds: min {f32s.min()} mean {f32s.mean():.2f} "
                      f"max {f32s.max()} (hist {dict(sorted(Counter(f32s.tolist()).items()))}); "
                      f"top1=bf16 mean {b16s.mean():.2f}; sets!=f32 mean {sets.mean():.2f}; rms(same-set) {rms.mean():.4f}")
                print(f"{'':40} rows != f32 argmax (times): {dict(sorted(rows.items()))}")
                continue
            r = evaluate(fx, variant(spec), args.accum, 0, args.dither)
            out, a, sets, rec = r["logits"], r["argmax"], r["sets"], r["record"]
            same = np.array([x == y for x, y in zip(sets, bf_sets)])
            d16 = np.abs(out - ref16)
            line = (f"{spec:40} {np.abs(out - ref).max():10.3g} {int((a == am).sum()):5}/{T} "
                    f"{d16.max():11.3g} {d16[same].max() if same.any() else 0:8.3g} {(d16 == 0).mean():5.2f}"
                    f" {int((a == am16).sum()):6}/{T}"
                    f" {sum(x != y for x, y in zip(sets, f32_sets)):9} {int((~same).sum()):10} {r['rms_same']:8.4f}")
            if gpu is not None:
                dg = np.abs(out - gpu)
                line += f" {dg.max():10.3g} {(dg == 0).mean():9.4f} {int((a == argmax_rows(gpu)).sum()):5}/{T}"
            print(line)
            if args.rows:
                print(f"{'':40} rows != f32 argmax: {r['rows_off']}")
            if args.check_f32 and spec == "f32":
                for key in sorted(rec):
                    if key in g and not key.endswith("topk_ids"):
                        print(f"   {key:32} max|d| {np.abs(rec[key] - g[key]).max():.3g}")
                print(f"   expert sets equal to golden: {sum(x == y for x, y in zip(sets, f32_sets))}/{T}")


if __name__ == "__main__":
    sys.exit(main())
