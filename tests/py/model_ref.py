"""PyTorch oracle for whole-model loss and gradients (Llama / Qwen3 / Qwen3-MoE semantics,
written after Hugging Face transformers' modeling code, in fp32).

usage: /usr/bin/python3 tests/py/model_ref.py DIR
DIR holds what the C side wrote: config.txt ("key value" lines), index.txt ("name ndim d0
[d1]" lines, Hugging Face tensor names), NAME.bin (float32 weights), inputs.bin, targets.bin
(int32, B*T), and optionally mx.txt: "inputs weight grads mode tiles granularity" (element
formats 0 = E4M3, 1 = E5M2, 2 = HiF8; granularity 0 = mx, mode 0 = floor, 1 = rceil, tiles 1
for 32x32 weight tiles; granularity 1 = per tensor (tests/py/scaled_ref.py), mode 0 = fp32,
1 = power-of-two scales; granularity 2 = per line, torchao's rowwise; 3 = per block (1x128,
128x128, 128x1: the blockwise recipe); then optionally
"hp dgrad_w_tensor": high_precision_gemms bits (1 fprop, 2 dgrad, 4 wgrad) and 1 for
rowwise_with_gw_hp's per-tensor dgrad weight) then one converted
module name per line, whose GEMMs
are emulated in MX (tests/py/mx_ref.py; MoE experts as the fused gate_up GEMM, SwiGLU, then
down). Writes grad/NAME.bin for every tensor and loss.bin = [ce, aux, total].
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mx_ref import MXLinear  # noqa: E402
from scaled_ref import BlockwiseLinear, HighPrecision, RowwiseLinear, ScaledLinear  # noqa: E402


def spec_of(spec, key):
    """A delayed recipe's spec carries a table of scales (ninth value, by weight name, and
    (name, expert) for fused experts): the module's own scales in its place."""
    if spec is None or len(spec) < 9 or not isinstance(spec[8], dict):
        return spec
    return spec[:8] + (spec[8][key],)


def qlinear(x, w, spec):
    """A converted GEMM: MX blocks, per tensor when spec's sixth value (granularity) is 1, per
    line (torchao's rowwise) when 2, per block (blockwise) when 3; spec's seventh (high_precision_gemms bits) runs those
    products in fp32; a delayed recipe's scales are its ninth (spec_of)."""
    gran = spec[5] if len(spec) > 5 else 0
    cls = {1: ScaledLinear, 2: RowwiseLinear, 3: BlockwiseLinear}.get(gran, MXLinear)
    if len(spec) > 6 and spec[6]:
        return HighPrecision.apply(x, w, spec, cls)
    return cls.apply(x, w, spec)


def read_config(d):
    cfg = {}
    for line in open(os.path.join(d, "config.txt")):
        k, v = line.split()
        cfg[k] = float(v) if "." in v or "e" in v else int(v)
    return cfg


def rmsnorm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class SoftmaxMatmul(torch.autograd.Function):
    """softmax(s) @ v whose backward takes the softmax backward's row sum sum(P * dP) as flash
    attention takes it, dO . O, summed in double and rounded once (mxtrain's attention):
    mathematically the same; at the rounding level the emulated runs then flip the same FP8
    roundings as mxtrain."""

    @staticmethod
    def forward(ctx, s, v):
        p = torch.softmax(s, dim=-1)
        o = p @ v
        ctx.save_for_backward(p, v, o)
        return o

    @staticmethod
    def backward(ctx, g):
        p, v, o = ctx.saved_tensors
        d = (g.double() * o.double()).sum(-1, keepdim=True).to(g.dtype)
        return p * (g @ v.transpose(-1, -2) - d), p.transpose(-1, -2) @ g


def load_balancing_loss_func(gate_logits, num_experts, top_k):   # as in transformers
    concatenated = torch.cat(gate_logits, dim=0)
    routing_weights = torch.softmax(concatenated, dim=-1)
    _, selected_experts = torch.topk(routing_weights, top_k, dim=-1)
    expert_mask = torch.nn.functional.one_hot(selected_experts, num_experts)
    tokens_per_expert = torch.mean(expert_mask.float(), dim=0)
    router_prob_per_expert = torch.mean(routing_weights, dim=0)
    return torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * num_experts


def read_mx(d):
    path = os.path.join(d, "mx.txt")
    if not os.path.exists(path):
        return None, set()
    lines = open(path).read().split("\n")
    return tuple(int(v) for v in lines[0].split()), set(l for l in lines[1:] if l)


def forward(cfg, W, inputs, targets, mx_spec=None, mx_modules=frozenset()):
    B, T = cfg["B"], cfg["T"]
    C, NH, NKV, HD, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["num_hidden_layers"]
    eps, qk_norm = cfg["rms_norm_eps"], cfg["model_type"] != 0
    bias = lambda name: W.get(name)
    def matmul_t(x, w, name):   # x (..., K) @ w (N, K)^T, in MX when the plan converts `name`
        if name not in mx_modules:
            return x @ w.T
        return qlinear(x.reshape(-1, x.shape[-1]), w, spec_of(mx_spec, name + ".weight")).view(*x.shape[:-1], w.shape[0])

    lin = lambda x, name: matmul_t(x, W[name + ".weight"], name) + (W[name + ".bias"] if name + ".bias" in W else 0)
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, HD, 2, dtype=torch.int64).float() / HD))
    freqs = torch.outer(torch.arange(T).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]
    x = W["model.embed_tokens.weight"][inputs]
    router_logits = []
    for l in range(L):
        p = f"model.layers.{l}."
        h = rmsnorm(x, W[p + "input_layernorm.weight"], eps)
        q = lin(h, p + "self_attn.q_proj").view(B, T, NH, HD)
        k = lin(h, p + "self_attn.k_proj").view(B, T, NKV, HD)
        v = lin(h, p + "self_attn.v_proj").view(B, T, NKV, HD)
        if qk_norm:
            q = rmsnorm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rmsnorm(k, W[p + "self_attn.k_norm.weight"], eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // NKV, dim=1)
        v = v.repeat_interleave(NH // NKV, dim=1)
        s = q @ k.transpose(-1, -2) / HD ** 0.5
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        a = SoftmaxMatmul.apply(s, v).transpose(1, 2).reshape(B, T, NH * HD)
        x = x + lin(a, p + "self_attn.o_proj")
        h = rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps)
        if p + "mlp.gate.weight" in W:   # Qwen3MoeSparseMoeBlock
            E, K = cfg["num_experts"], cfg["num_experts_per_tok"]
            hs = h.reshape(-1, C)
            logits = matmul_t(hs, W[p + "mlp.gate.weight"], p + "mlp.gate")
            router_logits.append(logits)
            rw = torch.softmax(logits, dim=1, dtype=torch.float)
            rw, sel = torch.topk(rw, K, dim=-1)
            if cfg["norm_topk_prob"]:
                rw = rw / rw.sum(dim=-1, keepdim=True)
            out = torch.zeros_like(hs)
            mask = torch.nn.functional.one_hot(sel, num_classes=E).permute(2, 1, 0)
            for e in range(E):
                idx, top_x = torch.where(mask[e])
                order = torch.argsort(top_x)   # a group lists its tokens in ascending order (SPEC §5)
                idx, top_x = idx[order], top_x[order]
                if top_x.numel() == 0:
                    continue
                ep = p + f"mlp.experts.{e}."
                cur = hs[top_x]
                if p + "mlp.experts" in mx_modules:   # FC1 on the fused gate|up weight, SwiGLU, FC2
                    FE = W[ep + "gate_proj.weight"].shape[0]
                    gu = qlinear(cur, torch.cat((W[ep + "gate_proj.weight"], W[ep + "up_proj.weight"])),
                                 spec_of(mx_spec, (p + "mlp.experts.gate_up_proj", e)))
                    y = qlinear(torch.nn.functional.silu(gu[:, :FE]) * gu[:, FE:], W[ep + "down_proj.weight"],
                                spec_of(mx_spec, (p + "mlp.experts.down_proj", e)))
                else:
                    y = (torch.nn.functional.silu(cur @ W[ep + "gate_proj.weight"].T) * (cur @ W[ep + "up_proj.weight"].T)) @ W[ep + "down_proj.weight"].T
                out = out.index_add(0, top_x, y * rw[top_x, idx, None])
            mlp = out.view(B, T, C)
        else:
            mlp = lin(torch.nn.functional.silu(lin(h, p + "mlp.gate_proj")) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
        x = x + mlp
    x = rmsnorm(x, W["model.norm.weight"], eps)
    head = W["lm_head.weight"] if "lm_head.weight" in W else W["model.embed_tokens.weight"]
    logits = matmul_t(x, head, "lm_head")
    ce = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
    aux = torch.zeros(())
    total = ce
    if router_logits and cfg["output_router_logits"]:
        aux = load_balancing_loss_func(router_logits, cfg["num_experts"], cfg["num_experts_per_tok"])
        total = ce + cfg["router_aux_loss_coef"] * aux
    if router_logits and cfg.get("z_loss_coef", 0) > 0:   # ST-MoE's router z-loss, per layer a mean over tokens
        total = total + cfg["z_loss_coef"] * sum(torch.logsumexp(g, dim=-1).square().mean() for g in router_logits)
    return ce, aux, total


def main(d):
    cfg = read_config(d)
    W = {}
    for line in open(os.path.join(d, "index.txt")):
        parts = line.split()
        name, shape = parts[0], [int(s) for s in parts[2:]]
        W[name] = torch.from_numpy(np.fromfile(os.path.join(d, name + ".bin"), dtype="<f4").reshape(shape)).requires_grad_()
    n = cfg["B"] * cfg["T"]
    inputs = torch.from_numpy(np.fromfile(os.path.join(d, "inputs.bin"), dtype="<i4").astype(np.int64)).view(cfg["B"], cfg["T"])
    targets = torch.from_numpy(np.fromfile(os.path.join(d, "targets.bin"), dtype="<i4").astype(np.int64)).view(cfg["B"], cfg["T"])
    assert inputs.numel() == n
    mx_spec, mx_modules = read_mx(d)
    ce, aux, total = forward(cfg, W, inputs, targets, mx_spec, mx_modules)
    total.backward()
    os.makedirs(os.path.join(d, "grad"), exist_ok=True)
    for name, t in W.items():
        g = t.grad if t.grad is not None else torch.zeros_like(t)
        g.detach().numpy().astype("<f4").tofile(os.path.join(d, "grad", name + ".bin"))
    np.array([ce.item(), aux.item(), total.item()], dtype="<f8").tofile(os.path.join(d, "loss.bin"))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1])
