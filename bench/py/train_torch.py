"""The PyTorch side of bench/bench_train.sh: the same model trained the same way, for
throughput.

usage: /usr/bin/python3 bench/py/train_torch.py --shard FILE --metrics OUT.jsonl
           [--precision bf16|fp32|mxfp8] [--threads N] [--steps N] [--batch B] [--seq T]
           [--hidden C] [--layers L] [--heads NH] [--kv-heads NKV] [--intermediate F]
           [--vocab V] [--lr X] [--seed S]
           [--model dense|moe] [--head-dim HD] [--experts E] [--top-k K]
           [--moe-intermediate FE] [--rope-theta X] [--aux-coef X]
       /usr/bin/python3 bench/py/train_torch.py --check

The model is the one of tests/py/model_ref.py as an nn.Module (HF semantics). --model dense
(the default) is Llama: token embedding, per layer RMSNorm, q/k/v/o projections without
bias, rotate-half RoPE, causal attention (explicit scores, masked softmax: torch 1.13 has no
fused attention), residual, RMSNorm, SwiGLU MLP, residual; final RMSNorm, untied lm_head,
mean cross-entropy. --model moe is Qwen3-MoE: the same with RMSNorm on q and k per head
before RoPE, and every MLP a sparse MoE block: a router (mlp.gate, no bias), softmax in
fp32, the top-K experts per token (weights renormalised to sum 1, norm_topk_prob), each
expert a SwiGLU MLP on the tokens routed to it (its gate and up projections as one fused
GEMM, as mxtrain runs them), outputs summed with the routing weights; plus
router_aux_loss_coef times Hugging Face's load-balancing loss over all layers' router
logits (load_balancing_loss_func of tests/py/model_ref.py). --check compares this module's
loss and gradients with model_ref.forward, the oracle the C tests use, on small dense and
MoE models (fp32, relative error <= 1e-5), and exits non-zero on a mismatch.
One step is what `mxtrain train` does in a step: read the next batch from the llm.c shard
(llm.c's order: B*T+1 consecutive tokens, advancing by B*T), zero the gradients, forward,
backward, clip the global gradient norm to 1.0, AdamW (weight decay on matrices only).
--precision bf16 runs forward and backward under torch.autocast("cpu", dtype=bfloat16);
fp32 runs plain fp32; mxfp8 is what a researcher gets in PyTorch on a CPU today: fake
quantization (torch 1.13 has no fp8 dtype) of the blocks' linear layers to MXFP8 (E4M3
codes, one power-of-two scale per 32 elements, floor scales as in the OCP MX spec and
examples/qwen3_moe_mxfp8.yaml), emulated with fp32 tensor ops, GEMMs in fp32. Master
weights and AdamW state are fp32 in every mode.
Writes one JSON line per step: step, loss, tokens, step_s, tokens_per_s (as mxtrain does),
and on stdout the parameter count and which BLAS library torch loaded.
"""
import argparse
import json
import math
import os
import time

import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

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


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


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

    def forward(self, x, cos, sin, mask):   # x (B, T, C); cos, sin (1, 1, T, HD); mask (T, T)
        B, T, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.NH, self.HD)
        k = self.k_proj(h).view(B, T, self.NKV, self.HD)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)                         # (B, NH|NKV, T, HD)
        v = self.v_proj(h).view(B, T, self.NKV, self.HD).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.NKV != self.NH:
            k = k.repeat_interleave(self.NH // self.NKV, dim=1)
            v = v.repeat_interleave(self.NH // self.NKV, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(self.HD)   # (B, NH, T, T)
        s = s.masked_fill(mask, float("-inf"))
        a = torch.softmax(s.float(), dim=-1).to(v.dtype) @ v     # (B, NH, T, HD)
        x = x + self.o_proj(a.transpose(1, 2).reshape(B, T, self.NH * self.HD))
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
        inv_freq = 1.0 / (theta ** (torch.arange(0, HD, 2, dtype=torch.int64).float() / HD))
        emb = torch.cat([torch.outer(torch.arange(T).float(), inv_freq)] * 2, dim=-1)   # (T, HD)
        self.register_buffer("cos", emb.cos()[None, None], persistent=False)
        self.register_buffer("sin", emb.sin()[None, None], persistent=False)
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1), persistent=False)
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

    def hf_tensors(self):
        """The parameters as Hugging Face tensors (views; per-expert slices of the fused ones)."""
        out = {"model.embed_tokens.weight": self.embed_tokens.weight, "model.norm.weight": self.norm.weight,
               "lm_head.weight": self.lm_head.weight}
        for l, b in enumerate(self.layers):
            p = f"model.layers.{l}."
            for n in ("input_layernorm", "post_attention_layernorm"):
                out[p + n + ".weight"] = getattr(b, n).weight
            for n in ("q_proj", "k_proj", "v_proj", "o_proj") + (("q_norm", "k_norm") if b.qk_norm else ()):
                out[p + "self_attn." + n + ".weight"] = getattr(b, n).weight
            if b.qk_norm:
                out[p + "mlp.gate.weight"] = b.mlp.gate.weight
                FE = b.mlp.FE
                for e in range(b.mlp.E):
                    q = p + f"mlp.experts.{e}."
                    out[q + "gate_proj.weight"] = b.mlp.gate_up[e, :FE]
                    out[q + "up_proj.weight"] = b.mlp.gate_up[e, FE:]
                    out[q + "down_proj.weight"] = b.mlp.down[e]
            else:
                for n in ("gate_proj", "up_proj", "down_proj"):
                    out[p + "mlp." + n + ".weight"] = getattr(b, n).weight
        return out


def check():
    """This module against tests/py/model_ref.py (the oracle of the C tests) at fp32: loss and
    every gradient, on a small Llama and a small Qwen3-MoE with experts that get no tokens."""
    import model_ref
    torch.manual_seed(7)
    worst = 0.0
    for moe in (None, (6, 2, 24)):
        B, T, V, C, L, NH, NKV, HD, Fd, theta = 2, 19, 67, 64, 2, 4, 2, 16, 48, 1e6 if moe else 1e4
        model = Llama(V, C, L, NH, NKV, Fd, T, theta=theta, HD=HD, moe=moe, aux_coef=0.05 if moe else 0.0)
        with torch.no_grad():   # norms away from 1, so that their gradients are checked too
            for name, p in model.named_parameters():
                p.add_(torch.randn_like(p) * (0.1 if p.dim() < 2 else 0.0))
        x, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
        loss = model(x, y)
        loss.backward()
        cfg = {"B": B, "T": T, "hidden_size": C, "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
               "num_hidden_layers": L, "rms_norm_eps": 1e-6, "model_type": 2 if moe else 0, "rope_theta": theta,
               "num_experts": moe[0] if moe else 0, "num_experts_per_tok": moe[1] if moe else 0,
               "norm_topk_prob": 1, "output_router_logits": 1 if moe else 0, "router_aux_loss_coef": 0.05}
        hf = model.hf_tensors()
        W = {k: v.detach().clone().requires_grad_() for k, v in hf.items()}
        ce, aux, total = model_ref.forward(cfg, W, x, y)
        total.backward()
        err = abs(loss.item() - total.item()) / abs(total.item())
        assert err <= 1e-5, f"{'moe' if moe else 'dense'} loss {loss.item()} != oracle {total.item()}"
        grads = {}   # the module's gradients under Hugging Face names (slices of the fused experts)
        for k, v in hf.items():
            leaf = v if v.is_leaf else None
            grads[k] = leaf.grad if leaf is not None else None
        for l, b in enumerate(model.layers):
            if b.qk_norm:
                FE = b.mlp.FE
                for e in range(b.mlp.E):
                    q = f"model.layers.{l}.mlp.experts.{e}."
                    grads[q + "gate_proj.weight"] = b.mlp.gate_up.grad[e, :FE]
                    grads[q + "up_proj.weight"] = b.mlp.gate_up.grad[e, FE:]
                    grads[q + "down_proj.weight"] = b.mlp.down.grad[e]
        for k, t in W.items():
            g, want = grads[k], t.grad
            if want is None or want.norm() == 0:   # an expert no token chose
                assert g is None or g.norm() == 0, f"{k}: gradient where the oracle has none"
                continue
            e = ((g - want).norm() / want.norm()).item()
            assert e <= 1e-5, f"{'moe' if moe else 'dense'} {k}: gradient relative error {e:.3g}"
            worst = max(worst, e)
        print(f"train_torch check: {'Qwen3-MoE' if moe else 'Llama'} loss {loss.item():.6f} and {len(W)} gradients "
              f"agree with model_ref.py")
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


def main():
    if sys.argv[1:] == ["--check"]:
        torch.set_num_threads(1)
        check()
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--shard", required=True)
    ap.add_argument("--metrics", required=True)
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
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    B, T = a.batch, a.seq
    moe = (a.experts, a.top_k, a.moe_intermediate) if a.model == "moe" else None
    theta = a.rope_theta or (1e6 if moe else 1e4)
    model = Llama(a.vocab, a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, T, theta=theta,
                  HD=a.head_dim or None, moe=moe, aux_coef=a.aux_coef if moe else 0.0,
                  mx=a.precision == "mxfp8")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)   # one multi-tensor pass
    tokens = read_shard(a.shard)
    nparams = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {a.precision}, {a.model}, {nparams} parameters, "
          f"BLAS: {blas_library()}", flush=True)
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
    out = open(a.metrics, "w")
    pos, bt = 0, B * T
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        if pos + bt + 1 > len(tokens):
            pos = 0
        buf = torch.from_numpy(tokens[pos : pos + bt + 1])
        pos += bt
        x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        out.write(json.dumps({"step": step, "loss": round(loss.item(), 6), "tokens": bt, "step_s": round(dt, 4),
                              "tokens_per_s": round(bt / dt, 1)}) + "\n")
        out.flush()
        print(f"step {step}/{a.steps} loss {loss.item():.4f} {dt:.2f} s", flush=True)


if __name__ == "__main__":
    main()
