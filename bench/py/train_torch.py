"""The PyTorch side of bench/bench_train.sh: the same model trained the same way, for
throughput.

usage: /usr/bin/python3 bench/py/train_torch.py --shard FILE --metrics OUT.jsonl
           [--impl functional|module] [--precision bf16|fp32|mxfp8] [--threads N]
           [--steps N] [--batch B] [--seq T] [--hidden C] [--layers L] [--heads NH]
           [--kv-heads NKV] [--intermediate F] [--vocab V] [--lr X] [--seed S]
           [--model dense|moe] [--head-dim HD] [--experts E] [--top-k K]
           [--moe-intermediate FE] [--rope-theta X] [--aux-coef X] [--profile]
       /usr/bin/python3 bench/py/train_torch.py --check

The model is the one of tests/py/model_ref.py (HF semantics), in two implementations:
--impl module, an nn.Module, and --impl functional (the default), the parameters in one
dict and the forward pass as plain functions (f_forward). Both run the same ops: the
module was made as fast as the functional one (docs/benchmarks.md, "The PyTorch baseline:
module against functional"), and --impl stays so that the two can be timed against each
other. --model dense (the default) is Llama: token embedding, per layer RMSNorm, q/k/v/o
projections without bias, rotate-half RoPE (in fp32), causal attention (explicit scores:
torch 1.13 has no fused attention; the scale and the causal mask applied by the scores'
GEMM, baddbmm with an additive mask; softmax in fp32), residual, RMSNorm, SwiGLU MLP,
residual; final RMSNorm, untied lm_head, mean cross-entropy. --model moe is Qwen3-MoE:
the same with RMSNorm on q and k per head before RoPE, and every MLP a sparse MoE block: a
router (mlp.gate, no bias), softmax in fp32, the top-K experts per token (weights
renormalised to sum 1, norm_topk_prob), each expert a SwiGLU MLP on the tokens routed to it
(its gate and up projections as one fused GEMM, as mxtrain runs them), outputs summed with
the routing weights; plus router_aux_loss_coef times Hugging Face's load-balancing loss over
all layers' router logits (load_balancing_loss_func of tests/py/model_ref.py). Both
implementations start from the same weights (init_params: HF's normal(0, 0.02) matrices,
ones for norms, from --seed).
--check compares both implementations' loss and gradients with model_ref.forward, the
oracle the C tests use, on small dense and MoE models (fp32, relative error <= 1e-5), then
trains each for 3 steps in every precision and compares their losses (fp32 <= 1e-5, bf16
and mxfp8 <= 1e-3); it exits non-zero on a mismatch.
One step is what `mxtrain train` does in a step: read the next batch from the llm.c shard
(llm.c's order: B*T+1 consecutive tokens, advancing by B*T), zero the gradients, forward,
backward, clip the global gradient norm to 1.0 (clip_grad_norm: torch's, on multi-tensor
ops), AdamW (torch.optim.AdamW, foreach, weight decay 0.1 on matrices only).
--precision bf16 runs forward and backward under torch.autocast("cpu", dtype=bfloat16);
fp32 runs plain fp32; mxfp8 is what a researcher gets in PyTorch on a CPU today: fake
quantization (torch 1.13 has no fp8 dtype) of the blocks' linear layers to MXFP8 (E4M3
codes, one power-of-two scale per 32 elements, floor scales as in the OCP MX spec and
examples/qwen3_moe_mxfp8.yaml), emulated with fp32 tensor ops, GEMMs in fp32. Master
weights and AdamW state are fp32 in every mode.
Writes one JSON line per step: step, loss, tokens, step_s, tokens_per_s (as mxtrain does)
and cpu_s (the process's CPU seconds in the step), and on stdout the parameter count and
which BLAS library torch loaded. --profile runs one warm-up step and then profiles a step
instead: torch.profiler's op table (calls, self CPU time), every dtype-changing copy with
the bytes it moves, and what the ops called from Python and autograd read and write
(OpCounter); nothing is written to --metrics.
"""
import argparse
import collections
import json
import math
import os
import resource
import time
import types

import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "py"))
from model_ref import load_balancing_loss_func  # noqa: E402  (Hugging Face's, as the oracle uses it)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))   # (C)
        self.eps = eps

    def forward(self, x):
        # fp32 statistics, as HF's LlamaRMSNorm
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))


def mx_fake(x, dim):
    """x (2-D, fp32) with each run of 32 elements along dim replaced by its MXFP8 value:
    scale 2^(floor(log2 amax) - 8), codes rounded to E4M3 (3 mantissa bits, subnormals below
    2^-6, saturating at 448). Every step multiplies by powers of two, so fp32 is exact."""
    if dim == 0:
        return mx_fake(x.t(), 1).t()
    R, C = x.shape
    pad = (-C) % 32
    xb = F.pad(x, (0, pad)).view(R, -1, 32)
    _, e = torch.frexp(xb.abs().amax(-1, keepdim=True))
    se = e - 9                                                  # floor(log2 amax) - emax(E4M3)
    v = torch.ldexp(xb, -se)
    _, ev = torch.frexp(v)
    step = torch.ldexp(torch.ones_like(v), (ev - 4).clamp(min=-9))   # ulp of a 3-bit mantissa
    q = (torch.round(v / step) * step).clamp(-448.0, 448.0)
    return torch.ldexp(q, se).view(R, -1)[:, :C]


class MXFakeLinear(torch.autograd.Function):
    """y = x w^T on MXFP8 operands: forward x and w rowwise (blocks along K); dx from dy
    rowwise and w colwise; dw from dy and x colwise (blocks along the token axis)."""

    @staticmethod
    def forward(ctx, x, w):   # x (N, K), w (M, K)
        ctx.save_for_backward(x, w)
        return mx_fake(x, 1) @ mx_fake(w, 1).t()

    @staticmethod
    def backward(ctx, dy):   # dy (N, M)
        x, w = ctx.saved_tensors
        return mx_fake(dy, 1) @ mx_fake(w, 0), mx_fake(dy, 0).t() @ mx_fake(x, 0)


class MXLinear(nn.Linear):
    def forward(self, x):
        return MXFakeLinear.apply(x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class MoE(nn.Module):
    """Qwen3MoeSparseMoeBlock with the experts' weights fused as mxtrain keeps them: gate_up
    (E, 2FE, C), rows gate_proj then up_proj, and down (E, C, FE). Tokens are grouped by
    expert with one stable sort (ascending token order within a group, as SPEC §5 and
    model_ref.py), each group runs as dense GEMMs on a contiguous slice, and the weighted
    outputs are summed back with index_add_. With mx, the experts' GEMMs run on MXFP8
    operands (quantize.moe.mx): each group's blocks along the tokens start at the group's first
    row; the router stays as it is (the plan ignores '*gate')."""

    def __init__(self, C, E, K, FE, mx=False):
        super().__init__()
        self.E, self.K, self.FE, self.mx = E, K, FE, mx
        self.gate = nn.Linear(C, E, bias=False)                 # the router, weight (E, C)
        self.gate_up = nn.Parameter(torch.empty(E, 2 * FE, C))  # experts' gate_proj | up_proj
        self.down = nn.Parameter(torch.empty(E, C, FE))         # experts' down_proj

    def forward(self, h):   # h (B, T, C) -> (B, T, C), router logits (B*T, E)
        C = h.shape[-1]
        hs = h.reshape(-1, C)
        logits = self.gate(hs)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        w, sel = torch.topk(probs, self.K, dim=-1)   # (N, K)
        w = w / w.sum(dim=-1, keepdim=True)          # norm_topk_prob
        order = torch.sort(sel.reshape(-1), stable=True).indices   # routed rows grouped by expert
        counts = torch.bincount(sel.reshape(-1), minlength=self.E).tolist()
        tok = order // self.K                                      # token of each routed row
        outs = []
        for e, xs in enumerate(torch.split(hs[tok], counts)):
            if xs.shape[0] == 0:
                continue
            mm = (lambda a, w: MXFakeLinear.apply(a, w)) if self.mx else (lambda a, w: a @ w.t())
            gu = mm(xs, self.gate_up[e])
            outs.append(mm(F.silu(gu[:, : self.FE]) * gu[:, self.FE :], self.down[e]))
        ye = torch.cat(outs).float() * w.reshape(-1)[order, None]
        out = torch.zeros(hs.shape, dtype=torch.float, device=hs.device).index_add_(0, tok, ye)
        return out.view(h.shape), logits


class Block(nn.Module):
    def __init__(self, C, NH, NKV, HD, Fd, eps, mx, moe=None):
        super().__init__()
        Linear = MXLinear if mx else nn.Linear
        self.NH, self.NKV, self.HD = NH, NKV, HD
        self.input_layernorm = RMSNorm(C, eps)
        self.q_proj = Linear(C, NH * HD, bias=False)    # weight (QD, C)
        self.k_proj = Linear(C, NKV * HD, bias=False)   # weight (KVD, C)
        self.v_proj = Linear(C, NKV * HD, bias=False)   # weight (KVD, C)
        self.o_proj = Linear(NH * HD, C, bias=False)    # weight (C, QD)
        self.post_attention_layernorm = RMSNorm(C, eps)
        self.qk_norm = moe is not None   # Qwen3: RMSNorm over each head of q and k
        if self.qk_norm:
            self.q_norm, self.k_norm = RMSNorm(HD, eps), RMSNorm(HD, eps)
            self.mlp = MoE(C, *moe, mx=mx)
        else:
            self.gate_proj = Linear(C, Fd, bias=False)   # weight (F, C)
            self.up_proj = Linear(C, Fd, bias=False)     # weight (F, C)
            self.down_proj = Linear(Fd, C, bias=False)   # weight (C, F)

    def forward(self, x, cos, sin, mask):   # x (B, T, C); cos, sin (T, 1, HD) and mask (T, T) of f_tables
        B, T, _ = x.shape
        NH, NKV, HD = self.NH, self.NKV, self.HD
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, NH, HD)
        k = self.k_proj(h).view(B, T, NKV, HD)
        v = self.v_proj(h).view(B, T, NKV, HD)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = f_rope(q, cos, sin), f_rope(k, cos, sin)   # rotate-half RoPE, before the heads move
        if NKV != NH:
            k, v = k.repeat_interleave(NH // NKV, dim=2), v.repeat_interleave(NH // NKV, dim=2)
        q, k, v = (t.transpose(1, 2).reshape(B * NH, T, HD) for t in (q, k, v))
        # scores, scale and causal mask in one GEMM: mask + (q k^T) / sqrt(HD), (B*NH, T, T)
        s = torch.baddbmm(mask, q, k.transpose(1, 2), alpha=1.0 / math.sqrt(HD))
        a = torch.bmm(torch.softmax(s, dim=-1, dtype=torch.float).to(v.dtype), v)    # (B*NH, T, HD)
        x = x + self.o_proj(a.view(B, NH, T, HD).transpose(1, 2).reshape(B, T, NH * HD))
        h = self.post_attention_layernorm(x)
        if self.qk_norm:
            y, logits = self.mlp(h)
            return x + y, logits
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h)), None


class Llama(nn.Module):
    """Llama, or Qwen3-MoE with moe = (E, K, FE) and the load-balancing loss's coefficient
    aux_coef; with mx the blocks' linear layers (and experts) on MXFP8 fake-quantized operands."""

    def __init__(self, V, C, L, NH, NKV, Fd, T, eps=1e-6, theta=10000.0, HD=None, moe=None, aux_coef=0.0, mx=False):
        super().__init__()
        HD = HD or C // NH
        self.moe, self.aux_coef = moe, aux_coef
        self.embed_tokens = nn.Embedding(V, C)   # weight (V, C)
        self.layers = nn.ModuleList(Block(C, NH, NKV, HD, Fd, eps, mx, moe) for _ in range(L))
        self.norm = RMSNorm(C, eps)
        self.lm_head = nn.Linear(C, V, bias=False)   # weight (V, C), not tied
        cos, sin, mask = f_tables(HD, T, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.register_buffer("mask", mask, persistent=False)
        for name, p in self.named_parameters():   # HF's init: normal(0, 0.02) matrices, ones for norms
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):   # idx, targets (B, T)
        x = self.embed_tokens(idx)
        router_logits = []
        for layer in self.layers:
            x, r = layer(x, self.cos, self.sin, self.mask)
            router_logits.append(r)
        logits = self.lm_head(self.norm(x))   # (B, T, V)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))
        if self.moe and self.aux_coef:
            loss = loss + self.aux_coef * load_balancing_loss_func([r.float() for r in router_logits if r is not None],
                                                                   self.moe[0], self.moe[1])
        return loss


# The functional implementation (--impl functional): the same model and step with the
# parameters in one dict, under the module's names (so both start from the same init_params
# and map to Hugging Face's names alike), and the forward pass as plain functions.

def param_specs(V, C, L, NH, NKV, HD, Fd, moe):
    """(name, shape) of every parameter, named and ordered as Llama(...).named_parameters()."""
    QD, KVD = NH * HD, NKV * HD
    specs = [("embed_tokens.weight", (V, C))]
    for l in range(L):
        p = f"layers.{l}."
        specs += [(p + "input_layernorm.weight", (C,)), (p + "q_proj.weight", (QD, C)), (p + "k_proj.weight", (KVD, C)),
                  (p + "v_proj.weight", (KVD, C)), (p + "o_proj.weight", (C, QD)),
                  (p + "post_attention_layernorm.weight", (C,))]
        if moe:
            E, _, FE = moe
            specs += [(p + "q_norm.weight", (HD,)), (p + "k_norm.weight", (HD,)), (p + "mlp.gate_up", (E, 2 * FE, C)),
                      (p + "mlp.down", (E, C, FE)), (p + "mlp.gate.weight", (E, C))]
        else:
            specs += [(p + "gate_proj.weight", (Fd, C)), (p + "up_proj.weight", (Fd, C)), (p + "down_proj.weight", (C, Fd))]
    return specs + [("norm.weight", (C,)), ("lm_head.weight", (V, C))]


def init_params(specs, seed):
    """HF's init, normal(0, 0.02) matrices and ones for norms, from one seeded generator: the
    starting point of both implementations."""
    g = torch.Generator().manual_seed(seed)
    return {n: torch.empty(s).normal_(0.0, 0.02, generator=g) if len(s) >= 2 else torch.ones(s) for n, s in specs}


def hf_names(t, L, moe):
    """t (module name -> tensor: parameters or their gradients) under Hugging Face's names;
    the fused experts' tensors as per-expert slices (views)."""
    out = {"model.embed_tokens.weight": t["embed_tokens.weight"], "model.norm.weight": t["norm.weight"],
           "lm_head.weight": t["lm_head.weight"]}
    for l in range(L):
        p, q = f"layers.{l}.", f"model.layers.{l}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            out[q + n + ".weight"] = t[p + n + ".weight"]
        for n in ("q_proj", "k_proj", "v_proj", "o_proj") + (("q_norm", "k_norm") if moe else ()):
            out[q + "self_attn." + n + ".weight"] = t[p + n + ".weight"]
        if moe:
            E, _, FE = moe
            out[q + "mlp.gate.weight"] = t[p + "mlp.gate.weight"]
            for e in range(E):
                out[q + f"mlp.experts.{e}.gate_proj.weight"] = t[p + "mlp.gate_up"][e, :FE]
                out[q + f"mlp.experts.{e}.up_proj.weight"] = t[p + "mlp.gate_up"][e, FE:]
                out[q + f"mlp.experts.{e}.down_proj.weight"] = t[p + "mlp.down"][e]
        else:
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[q + "mlp." + n + ".weight"] = t[p + n + ".weight"]
    return out


def f_rmsnorm(x, w, eps):   # x (..., D), w (D): fp32 statistics, as HF's LlamaRMSNorm
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))


def f_linear(x, w, mx):   # x (..., K), w (M, K) -> (..., M); with mx on MXFP8 operands
    if mx:
        return MXFakeLinear.apply(x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], -1)
    return F.linear(x, w)


def f_tables(HD, T, theta):
    """RoPE's cos and sin as (T, 1, HD), to broadcast over (B, T, heads, HD); sin with the
    sign of rotate-half folded in (-sin on the first half), so that rotate_half(q) * sin is
    cat(q2, q1) * sin_signed without a negation; and the causal mask as an additive (T, T)
    (0 on and below the diagonal, -inf above): s + mask is masked_fill(s, mask, -inf)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, HD, 2, dtype=torch.int64).float() / HD))
    emb = torch.cat([torch.outer(torch.arange(T).float(), inv_freq)] * 2, dim=-1)   # (T, HD)
    sin = emb.sin()
    sin[:, : HD // 2].neg_()
    mask = torch.zeros(T, T).masked_fill_(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    return emb.cos()[:, None], sin[:, None], mask


def f_rope(q, cos, sin):   # q (B, T, heads, HD); cos, sin (T, 1, HD), sin signed (f_tables)
    # In fp32, as HF's fp32 tables make it under autocast. One explicit cast of a bf16 q
    # rather than one inside each of the two products (the same values), so that backward
    # also casts once, after adding the two paths' gradients in fp32.
    q, h = q.float(), q.shape[-1] // 2
    return q * cos + torch.cat((q[..., h:], q[..., :h]), dim=-1) * sin


def f_attention(W, p, h, c, cos, sin, mask):   # h (B, T, C) -> (B, T, C)
    B, T, _ = h.shape
    NH, NKV, HD = c.NH, c.NKV, c.HD
    q = f_linear(h, W[p + "q_proj.weight"], c.mx).view(B, T, NH, HD)
    k = f_linear(h, W[p + "k_proj.weight"], c.mx).view(B, T, NKV, HD)
    v = f_linear(h, W[p + "v_proj.weight"], c.mx).view(B, T, NKV, HD)
    if c.moe:   # Qwen3: RMSNorm over each head of q and k
        q, k = f_rmsnorm(q, W[p + "q_norm.weight"], c.eps), f_rmsnorm(k, W[p + "k_norm.weight"], c.eps)
    q, k = f_rope(q, cos, sin), f_rope(k, cos, sin)
    if NKV != NH:
        k, v = k.repeat_interleave(NH // NKV, dim=2), v.repeat_interleave(NH // NKV, dim=2)
    q, k, v = (t.transpose(1, 2).reshape(B * NH, T, HD) for t in (q, k, v))
    # scores, the scale and the causal mask in one GEMM: mask + (q k^T) / sqrt(HD)
    s = torch.baddbmm(mask, q, k.transpose(1, 2), alpha=1.0 / math.sqrt(HD))   # (B*NH, T, T)
    a = torch.bmm(torch.softmax(s, dim=-1, dtype=torch.float).to(v.dtype), v)    # (B*NH, T, HD)
    return f_linear(a.view(B, NH, T, HD).transpose(1, 2).reshape(B, T, NH * HD), W[p + "o_proj.weight"], c.mx)


def f_moe(W, p, h, c):   # h (B, T, C) -> (B, T, C), router logits (B*T, E): as MoE.forward
    E, K, FE = c.moe
    hs = h.reshape(-1, h.shape[-1])
    logits = F.linear(hs, W[p + "mlp.gate.weight"])
    w, sel = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float), K, dim=-1)   # (N, K)
    w = w / w.sum(dim=-1, keepdim=True)
    order = torch.sort(sel.reshape(-1), stable=True).indices
    counts = torch.bincount(sel.reshape(-1), minlength=E).tolist()
    tok = order // K
    gate_up, down, outs = W[p + "mlp.gate_up"], W[p + "mlp.down"], []
    for e, xs in enumerate(torch.split(hs[tok], counts)):
        if counts[e]:
            gu = f_linear(xs, gate_up[e], c.mx)
            outs.append(f_linear(F.silu(gu[:, :FE]) * gu[:, FE:], down[e], c.mx))
    ye = torch.cat(outs).float() * w.reshape(-1)[order, None]
    out = torch.zeros(hs.shape, dtype=torch.float).index_add_(0, tok, ye)
    return out.view(h.shape), logits


def f_forward(W, c, tables, idx, targets):   # W: name -> tensor; idx, targets (B, T) -> the loss
    cos, sin, mask = tables
    x = F.embedding(idx, W["embed_tokens.weight"])
    router = []
    for l in range(c.L):
        p = f"layers.{l}."
        x = x + f_attention(W, p, f_rmsnorm(x, W[p + "input_layernorm.weight"], c.eps), c, cos, sin, mask)
        h = f_rmsnorm(x, W[p + "post_attention_layernorm.weight"], c.eps)
        if c.moe:
            y, r = f_moe(W, p, h, c)
            router.append(r)
        else:
            y = f_linear(F.silu(f_linear(h, W[p + "gate_proj.weight"], c.mx)) * f_linear(h, W[p + "up_proj.weight"], c.mx),
                         W[p + "down_proj.weight"], c.mx)
        x = x + y
    logits = F.linear(f_rmsnorm(x, W["norm.weight"], c.eps), W["lm_head.weight"])   # (B, T, V)
    loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))
    if router and c.aux_coef:
        loss = loss + c.aux_coef * load_balancing_loss_func([r.float() for r in router], c.moe[0], c.moe[1])
    return loss


def clip_grad_norm(params, max_norm):
    """torch.nn.utils.clip_grad_norm_(params, max_norm) (2-norm) on multi-tensor ops: torch
    1.13's takes a norm and a multiply per tensor, two calls each; this one a call each."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.norm(torch.stack(torch._foreach_norm(grads)), 2.0)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    torch._foreach_mul_(grads, coef.item())
    return total


def f_config(L, NH, NKV, HD, eps=1e-6, moe=None, aux_coef=0.0, mx=False):
    """What the functional forward needs besides the parameters."""
    return types.SimpleNamespace(L=L, NH=NH, NKV=NKV, HD=HD, eps=eps, moe=moe, aux_coef=aux_coef, mx=mx)


def build(impl, V, C, L, NH, NKV, Fd, T, theta, HD, moe, aux_coef, mx, seed):
    """The model of --impl from init_params(seed): (parameters by name, loss function of (idx,
    targets)); the module's parameters are its own, loaded with the same values."""
    W0 = init_params(param_specs(V, C, L, NH, NKV, HD, Fd, moe), seed)
    if impl == "module":
        model = Llama(V, C, L, NH, NKV, Fd, T, theta=theta, HD=HD, moe=moe, aux_coef=aux_coef, mx=mx)
        named = dict(model.named_parameters())
        assert [(n, tuple(p.shape)) for n, p in named.items()] == [(n, tuple(t.shape)) for n, t in W0.items()]
        with torch.no_grad():
            for n, p in named.items():
                p.copy_(W0[n])
        return named, model
    W = {n: t.requires_grad_() for n, t in W0.items()}
    c, tables = f_config(L, NH, NKV, HD, moe=moe, aux_coef=aux_coef, mx=mx), f_tables(HD, T, theta)
    return W, lambda idx, targets: f_forward(W, c, tables, idx, targets)


def make_optimizer(named, lr):
    """AdamW as mxtrain's (betas 0.9, 0.95, eps 1e-8, weight decay 0.1 on matrices only), one
    multi-tensor pass (foreach)."""
    decay = [p for p in named.values() if p.dim() >= 2]
    no_decay = [p for p in named.values() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)


def train_step(loss_fn, named, opt, x, y, precision):
    """One step as `mxtrain train` takes it: zero the gradients, forward, backward, clip the
    global gradient norm to 1.0, AdamW. Returns the loss."""
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = loss_fn(x, y)
    loss.backward()
    clip_grad_norm(named.values(), 1.0)
    opt.step()
    return loss


def check():
    """Both implementations against tests/py/model_ref.py (the oracle of the C tests) at fp32:
    loss and every gradient, on a small Llama and a small Qwen3-MoE with experts that get no
    tokens; then three training steps of each in every precision, whose losses must agree."""
    import model_ref
    worst = 0.0
    for moe in (None, (6, 2, 24)):
        B, T, V, C, L, NH, NKV, HD, Fd, theta = 2, 19, 67, 64, 2, 4, 2, 16, 48, 1e6 if moe else 1e4
        aux, kind = 0.05 if moe else 0.0, "Qwen3-MoE" if moe else "Llama"
        torch.manual_seed(7)
        x, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
        cfg = {"B": B, "T": T, "hidden_size": C, "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
               "num_hidden_layers": L, "rms_norm_eps": 1e-6, "model_type": 2 if moe else 0, "rope_theta": theta,
               "num_experts": moe[0] if moe else 0, "num_experts_per_tok": moe[1] if moe else 0,
               "norm_topk_prob": 1, "output_router_logits": 1 if moe else 0, "router_aux_loss_coef": aux}
        ref = None
        for impl in ("module", "functional"):
            named, loss_fn = build(impl, V, C, L, NH, NKV, Fd, T, theta, HD, moe, aux, False, 7)
            with torch.no_grad():   # norms away from 1, so that their gradients are checked too
                g = torch.Generator().manual_seed(8)
                for p in named.values():
                    if p.dim() < 2:
                        p.add_(torch.randn(p.shape, generator=g) * 0.1)
            if ref is None:   # the oracle, on the same values under Hugging Face's names
                W = {k: v.detach().clone().requires_grad_() for k, v in hf_names(named, L, moe).items()}
                ce, _, total = model_ref.forward(cfg, W, x, y)
                total.backward()
                ref = total.item(), {k: t.grad for k, t in W.items()}
            loss = loss_fn(x, y)
            loss.backward()
            err = abs(loss.item() - ref[0]) / abs(ref[0])
            assert err <= 1e-5, f"{impl} {kind} loss {loss.item()} != oracle {ref[0]}"
            grads = hf_names({n: p.grad for n, p in named.items()}, L, moe)
            for k, want in ref[1].items():
                got = grads[k]
                if want is None or want.norm() == 0:   # an expert no token chose
                    assert got is None or got.norm() == 0, f"{impl} {k}: gradient where the oracle has none"
                    continue
                e = ((got - want).norm() / want.norm()).item()
                assert e <= 1e-5, f"{impl} {kind} {k}: gradient relative error {e:.3g}"
                worst = max(worst, e)
            print(f"train_torch check: {impl} {kind}: loss {loss.item():.6f} and {len(ref[1])} gradients agree with "
                  f"model_ref.py")
        # the whole step (clipping, AdamW, autocast, fake quantization) of both, 3 steps on new batches
        for precision in ("fp32", "bf16", "mxfp8"):
            torch.manual_seed(9)
            batches = [(torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))) for _ in range(3)]
            losses = {}
            for impl in ("module", "functional"):
                named, loss_fn = build(impl, V, C, L, NH, NKV, Fd, T, theta, HD, moe, aux, precision == "mxfp8", 7)
                opt = make_optimizer(named, 1e-2)
                losses[impl] = [train_step(loss_fn, named, opt, bx, by, precision).item() for bx, by in batches]
            tol = 1e-5 if precision == "fp32" else 1e-3
            e = max(abs(a - b) / abs(a) for a, b in zip(losses["module"], losses["functional"]))
            assert e <= tol, f"{kind} {precision}: module losses {losses['module']} != functional {losses['functional']}"
            print(f"train_torch check: {kind} {precision}: 3 steps, module and functional losses agree "
                  f"(relative difference {e:.1e} <= {tol:g}): {' '.join(f'{l:.6f}' for l in losses['module'])}")
    # clip_grad_norm against torch's clip_grad_norm_, on gradients with a norm above 1 and below
    g = torch.Generator().manual_seed(10)
    for scale in (1.0, 0.01):
        ps = [torch.zeros(s, requires_grad=True) for s in ((67, 64), (64,), (3, 5, 7), (1,))]
        qs = [torch.zeros(p.shape, requires_grad=True) for p in ps]
        for p, q in zip(ps, qs):
            p.grad = torch.randn(p.shape, generator=g) * scale
            q.grad = p.grad.clone()
        got, want = clip_grad_norm(ps, 1.0), torch.nn.utils.clip_grad_norm_(qs, 1.0)
        e = max(((p.grad - q.grad).norm() / q.grad.norm()).item() for p, q in zip(ps, qs))
        assert abs(got.item() - want.item()) <= 1e-6 * want.item() and e <= 1e-6, \
            f"clip_grad_norm: norm {got.item()} != torch's {want.item()}, or gradients differ by {e:.3g}"
        print(f"train_torch check: clip_grad_norm = torch.nn.utils.clip_grad_norm_ (gradient norm {want.item():.4f})")
    print(f"train_torch check: ok (worst gradient relative error {worst:.2e})")


def read_shard(path):
    header = np.fromfile(path, dtype="<i4", count=256)
    magic, version, count = int(header[0]), int(header[1]), int(header[2])
    dtype = {(20240520, 1): "<u2", (20240801, 7): "<u4"}[(magic, version)]
    return np.fromfile(path, dtype=dtype, offset=1024, count=count).astype(np.int64)


def blas_library():
    for line in open("/proc/self/maps"):
        path = line.split()[-1]
        if "blas" in os.path.basename(path).lower():
            return path
    return "none loaded"


GEMMS = {"mm", "bmm", "addmm", "addmm_", "baddbmm", "baddbmm_", "addbmm"}
DTYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4, "short int": 2,
               "signed char": 1, "unsigned char": 1, "bool": 1}


class OpCounter(TorchDispatchMode):
    """What the ops a step calls (forward, backward and optimizer) move, whatever the
    machine: for each GEMM its FLOPs, for every other op that computes (not a view) the
    bytes of the tensors it reads and writes (numel x element size). It sees the ops called
    from Python and autograd, not those an op calls inside itself (the profiler does)."""

    def __init__(self):
        super().__init__()
        self.calls, self.bytes, self.flops = collections.Counter(), collections.Counter(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.calls[name] += 1
        rets = func._schema.returns
        if name == "_unsafe_view" or rets and all(r.alias_info is not None and not r.alias_info.is_write for r in rets):
            return out   # a view: no data moved
        ts = [t for t in list(args) + list((kwargs or {}).values()) + [out]
              for t in (t if isinstance(t, (list, tuple)) else [t]) if isinstance(t, torch.Tensor)]
        if name in GEMMS:   # out (..., M, N) = a (..., M, K) b (..., K, N)
            self.flops += 2 * out.numel() * ts[-2].shape[-2]
        else:
            self.bytes[name] += sum(t.numel() * t.element_size() for t in ts)
        return out


def profile(step):
    """--profile: step() once to warm up, then once under torch.profiler: calls and self CPU
    time by op, and every copy that changes the dtype (autocast's casts, type promotion inside
    an op) with the bytes it reads and writes; then once more under OpCounter."""
    from torch.profiler import ProfilerActivity, profile as tprofile
    step()
    with tprofile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=60))
    casts = collections.defaultdict(lambda: [0, 0])   # "src -> dst": calls, bytes
    for e in prof.profiler.kineto_results.events():   # copy_(dst, src): the shapes and dtypes of both
        if e.name() == "aten::copy_" and e.dtypes()[0] != e.dtypes()[1] and e.shapes()[0]:   # not 0-d (scalars)
            dst, src = e.dtypes()[:2]
            k = casts[f"{src} -> {dst}".replace("c10::BFloat16", "bf16").replace("float", "fp32")]
            k[0] += 1
            k[1] += math.prod(e.shapes()[0]) * (DTYPE_BYTES[dst] + DTYPE_BYTES[src])
    for what, (k, b) in sorted(casts.items()):
        print(f"casts {what}: {k} calls, {b / 2**20:.1f} MiB read + written")
    with OpCounter() as n:
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    print(f"one step, ops called from Python and autograd: {sum(n.calls.values())} calls; GEMMs "
          f"{n.flops / 1e9:.2f} GFLOP in {sum(n.calls[g] for g in GEMMS)} calls; the other ops read and write "
          f"{sum(n.bytes.values()) / 2**20:.1f} MiB; {faults} minor page faults")
    for op in sorted(n.calls, key=lambda o: (-n.bytes[o], -n.calls[o])):
        if n.bytes[op]:
            print(f"  {op:32s} {n.calls[op]:6d} calls {n.bytes[op] / 2**20:10.1f} MiB")


def main():
    if sys.argv[1:] == ["--check"]:
        torch.set_num_threads(1)
        check()
        return
    ap = argparse.ArgumentParser()
    ap.error = lambda message: sys.exit(f"train_torch.py: {message} (see --help)")   # one line, exit status 1
    ap.add_argument("--shard", required=True)
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--impl", choices=("module", "functional"), default="functional")
    ap.add_argument("--precision", choices=("bf16", "fp32", "mxfp8"), default="bf16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--vocab", type=int, default=257)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--model", choices=("dense", "moe"), default="dense")
    ap.add_argument("--head-dim", type=int, default=0, help="default hidden / heads")
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--moe-intermediate", type=int, default=192)
    ap.add_argument("--rope-theta", type=float, default=0.0, help="default 1e4 (dense), 1e6 (moe)")
    ap.add_argument("--aux-coef", type=float, default=0.001, help="router_aux_loss_coef (moe)")
    ap.add_argument("--profile", action="store_true", help="profile one step after a warm-up step, then exit")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    B, T = a.batch, a.seq
    moe = (a.experts, a.top_k, a.moe_intermediate) if a.model == "moe" else None
    theta = a.rope_theta or (1e6 if moe else 1e4)
    named, loss_fn = build(a.impl, a.vocab, a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, T, theta,
                           a.head_dim or a.hidden // a.heads, moe, a.aux_coef if moe else 0.0, a.precision == "mxfp8", a.seed)
    opt = make_optimizer(named, a.lr)
    tokens = read_shard(a.shard)
    nparams = sum(p.numel() for p in named.values())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {a.precision}, {a.model}, {a.impl}, "
          f"{nparams} parameters, BLAS: {blas_library()}", flush=True)
    # the speed of the model's largest linear layer (gate/up: (B*T, C) x (F, C)^T) in this mode
    xp, wp = torch.randn(B * T, a.hidden), torch.randn(a.intermediate, a.hidden)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            F.linear(xp, wp)
        best = min(best, time.perf_counter() - t0)
    print(f"torch linear {B * T}x{a.hidden} . ({a.intermediate}x{a.hidden})^T, {a.precision}: "
          f"{2 * B * T * a.hidden * a.intermediate / best * 1e-9:.1f} GFLOP/s", flush=True)
    pos, bt = 0, B * T

    def batch():   # llm.c's order: B*T+1 consecutive tokens, advancing by B*T, from the start at the end
        nonlocal pos
        if pos + bt + 1 > len(tokens):
            pos = 0
        buf = torch.from_numpy(tokens[pos : pos + bt + 1])
        pos += bt
        return buf[:-1].view(B, T), buf[1:].view(B, T)

    if a.profile:
        profile(lambda: train_step(loss_fn, named, opt, *batch(), a.precision))
        return
    out = open(a.metrics, "w")
    for step in range(1, a.steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = train_step(loss_fn, named, opt, *batch(), a.precision)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        out.write(json.dumps({"step": step, "loss": round(loss.item(), 6), "tokens": bt, "step_s": round(dt, 4),
                              "tokens_per_s": round(bt / dt, 1), "cpu_s": round(cpu, 4)}) + "\n")
        out.flush()
        print(f"step {step}/{a.steps} loss {loss.item():.4f} {dt:.2f} s ({cpu:.2f} s CPU)", flush=True)


if __name__ == "__main__":
    main()
