"""PyTorch oracle for the transformer layers (src/model/layers.c).

Writes, under OUTDIR, raw little-endian arrays NAME.bin (float32, or int32 for tokens) with
random inputs and the outputs and gradients PyTorch's autograd computes for them, written
after Hugging Face's Llama/Qwen3 modeling code. tests/test_layers.c reads them back.
usage: /usr/bin/python3 tests/py/layers_ref.py OUTDIR
"""
import os
import sys

import torch

B, T, C, NH, NKV, HD, F, V = 2, 37, 96, 3, 1, 32, 80, 67
N = B * T
THETA, EPS = 10000.0, 1e-6


def save(outdir, name, t):
    arr = t.detach().contiguous()
    arr = arr.numpy().astype("<i4" if arr.dtype in (torch.int32, torch.int64) else "<f4")
    arr.tofile(os.path.join(outdir, name + ".bin"))


def rotate_half(x):  # as in transformers' modeling_llama
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(T, HD, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, HD, 2, dtype=torch.int64).float() / HD))
    freqs = torch.outer(torch.arange(T).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    g = torch.Generator().manual_seed(1234)
    rnd = lambda *s: torch.randn(*s, generator=g)

    # RMSNorm (LlamaRMSNorm / Qwen3RMSNorm)
    x, w, dy = rnd(N, C).requires_grad_(), (1 + 0.1 * rnd(C)).requires_grad_(), rnd(N, C)
    y = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))
    y.backward(dy)
    for k, v in dict(rms_x=x, rms_w=w, rms_dy=dy, rms_y=y, rms_dx=x.grad, rms_dw=w.grad).items():
        save(outdir, k, v)

    # Rotary embedding on (B, T, H, HD)
    x, dy = rnd(B, T, NH, HD).requires_grad_(), rnd(B, T, NH, HD)
    cos, sin = rope_cos_sin(T, HD, THETA)
    y = x * cos[None, :, None, :] + rotate_half(x) * sin[None, :, None, :]
    y.backward(dy)
    for k, v in dict(rope_x=x, rope_dy=dy, rope_y=y, rope_dx=x.grad, rope_cos=cos[:, : HD // 2],
                     rope_sin=sin[:, : HD // 2]).items():
        save(outdir, k, v)

    # Causal grouped-query attention
    q, k, v = rnd(B, T, NH, HD).requires_grad_(), rnd(B, T, NKV, HD).requires_grad_(), rnd(B, T, NKV, HD).requires_grad_()
    dy = rnd(B, T, NH, HD)
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    kh = kh.repeat_interleave(NH // NKV, dim=1)   # HF repeat_kv
    vh = vh.repeat_interleave(NH // NKV, dim=1)
    scores = qh @ kh.transpose(-1, -2) / HD ** 0.5
    scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    y = (torch.softmax(scores, dim=-1) @ vh).transpose(1, 2)
    y.backward(dy)
    for name, t in dict(att_q=q, att_k=k, att_v=v, att_dy=dy, att_y=y, att_dq=q.grad, att_dk=k.grad,
                        att_dv=v.grad).items():
        save(outdir, name, t)

    # The same attention at bf16 compute precision, as torch.autocast runs a bf16 matmul but
    # with fp32 outputs: each product's factors rounded to bf16, in backward too (dO, dS),
    # accumulation in fp32; the softmax and its backward in fp32 on fp32 values, but for the
    # softmax backward's row sum sum(P * dP), taken as flash attention takes it: dO . O with
    # both rounded to bf16.
    class BF16MatMul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            r = lambda t: t.to(torch.bfloat16).float()
            ctx.save_for_backward(r(a), r(b))
            return r(a) @ r(b)

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            g = g.to(torch.bfloat16).float()
            return g @ b.transpose(-1, -2), a.transpose(-1, -2) @ g

    class SoftmaxBF16MatMul(torch.autograd.Function):   # softmax(s) @ v, as BF16MatMul, D = dO . O
        @staticmethod
        def forward(ctx, s, b):
            r = lambda t: t.to(torch.bfloat16).float()
            p = torch.softmax(s, dim=-1)
            o = r(p) @ r(b)
            ctx.save_for_backward(p, r(b), r(o))
            return o

        @staticmethod
        def backward(ctx, g):
            p, b, o = ctx.saved_tensors
            g = g.to(torch.bfloat16).float()
            dp = g @ b.transpose(-1, -2)
            d = (g * o).sum(-1, keepdim=True)
            return p * (dp - d), p.to(torch.bfloat16).float().transpose(-1, -2) @ g

    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    kh = kh.repeat_interleave(NH // NKV, dim=1)
    vh = vh.repeat_interleave(NH // NKV, dim=1)
    scores = BF16MatMul.apply(qh, kh.transpose(-1, -2)) / HD ** 0.5
    scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    y = SoftmaxBF16MatMul.apply(scores, vh).transpose(1, 2)
    y.backward(dy)
    for name, t in dict(attb_y=y, attb_dq=q.grad, attb_dk=k.grad, attb_dv=v.grad).items():
        save(outdir, name, t)

    # SwiGLU: silu(gate) * up
    gt, up, dy = rnd(N, F).requires_grad_(), rnd(N, F).requires_grad_(), rnd(N, F)
    y = torch.nn.functional.silu(gt) * up
    y.backward(dy)
    for name, t in dict(swi_g=gt, swi_u=up, swi_dy=dy, swi_y=y, swi_dg=gt.grad, swi_du=up.grad).items():
        save(outdir, name, t)

    # Cross-entropy (mean over rows)
    z = (3 * rnd(N, V)).requires_grad_()
    tgt = torch.randint(0, V, (N,), generator=g)
    loss = torch.nn.functional.cross_entropy(z, tgt)
    loss.backward()
    for name, t in dict(ce_z=z, ce_tgt=tgt, ce_loss=loss.reshape(1), ce_dz=z.grad).items():
        save(outdir, name, t)

    # Embedding, with repeated tokens
    wte, dy = rnd(V, C).requires_grad_(), rnd(N, C)
    tok = torch.randint(0, V // 4, (N,), generator=g)
    y = torch.nn.functional.embedding(tok, wte)
    y.backward(dy)
    for name, t in dict(emb_w=wte, emb_tok=tok, emb_dy=dy, emb_y=y, emb_dw=wte.grad).items():
        save(outdir, name, t)

    # MoE routing over two layers plus Hugging Face's load-balancing loss
    E, K, COEF = 6, 2, 0.25
    for norm in (0, 1):
        z1, z2 = rnd(N, E).requires_grad_(), rnd(N, E).requires_grad_()
        g1, g2 = rnd(N, K), rnd(N, K)
        loss = 0
        outs = {}
        for i, (z, gg) in enumerate(((z1, g1), (z2, g2))):
            p = torch.softmax(z, dim=1, dtype=torch.float)
            w, idx = torch.topk(p, K, dim=-1)
            if norm:
                w = w / w.sum(dim=-1, keepdim=True)
            loss = loss + (w * gg).sum()
            outs[f"moe{norm}_w{i}"], outs[f"moe{norm}_idx{i}"] = w, idx
        cat = torch.softmax(torch.cat((z1, z2), dim=0), dim=-1)
        _, sel = torch.topk(cat, K, dim=-1)
        tpe = torch.nn.functional.one_hot(sel, E).float().mean(dim=0)
        aux = (tpe * cat.mean(dim=0).unsqueeze(0)).sum() * E
        (loss + COEF * aux).backward()
        outs.update({f"moe{norm}_z0": z1, f"moe{norm}_z1": z2, f"moe{norm}_g0": g1, f"moe{norm}_g1": g2,
                     f"moe{norm}_aux": aux.reshape(1), f"moe{norm}_dz0": z1.grad, f"moe{norm}_dz1": z2.grad})
        for name, t in outs.items():
            save(outdir, name, t)

    # Megatron's document masking, written after get_ltor_masks_and_position_ids: in each row,
    # every end-of-document token ends its document (it belongs to it); the attention mask
    # then hides the earlier documents from the later rows, and the position ids restart
    # after each EOD. Rotary embedding at those positions, then the masked attention (fp32).
    EOD = 0
    toks = torch.randint(1, V, (B, T), generator=g)
    for b, ends in enumerate(((4, 5, 25, T - 1), (T - 2,))):   # documents of 1 token, an EOD last
        for i in ends:
            toks[b, i] = EOD
    mask = torch.tril(torch.ones(B, T, T))
    pos = torch.arange(T).repeat(B, 1)
    for b in range(B):
        prev = 0
        for i in (toks[b] == EOD).nonzero().flatten().tolist():
            mask[b, i + 1:, : i + 1] = 0
            pos[b, i + 1:] -= i + 1 - prev
            prev = i + 1
    q, k, v = rnd(B, T, NH, HD).requires_grad_(), rnd(B, T, NKV, HD).requires_grad_(), rnd(B, T, NKV, HD).requires_grad_()
    dy = rnd(B, T, NH, HD)
    cos, sin = rope_cos_sin(T, HD, THETA)
    c, s = cos[pos][:, :, None, :], sin[pos][:, :, None, :]
    qr, kr = q * c + rotate_half(q) * s, k * c + rotate_half(k) * s
    qh, kh, vh = qr.transpose(1, 2), kr.transpose(1, 2), v.transpose(1, 2)
    kh = kh.repeat_interleave(NH // NKV, dim=1)
    vh = vh.repeat_interleave(NH // NKV, dim=1)
    scores = (qh @ kh.transpose(-1, -2) / HD ** 0.5).masked_fill(mask[:, None] == 0, float("-inf"))
    y = (torch.softmax(scores, dim=-1) @ vh).transpose(1, 2)
    y.backward(dy)
    for name, t in dict(doc_tok=toks, doc_q=q, doc_k=k, doc_v=v, doc_dy=dy, doc_y=y, doc_dq=q.grad, doc_dk=k.grad,
                        doc_dv=v.grad).items():
        save(outdir, name, t)


if __name__ == "__main__":
    main(sys.argv[1])
