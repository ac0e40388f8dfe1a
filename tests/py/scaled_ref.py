"""A PyTorch emulation of the per-tensor recipes and their linear layer, written from the
anchors' definitions (docs/quantization-plan.md), independent of the C library.

tensorwise FP8 (TransformerEngine's current scaling): scale = fp32(fp8_max / amax), amax the
largest finite-or-Inf magnitude with NaN ignored; amax 0, Inf or NaN gives 1, an Inf scale
FLT_MAX; mode 1 (pow2) keeps 2^floor(log2 scale). codes = FP8(fp32(x * scale)), round to
nearest even, saturating; the dequantization scale is fp32(1 / scale).

HiF8 (MindSpeed): dequantization scale s = fp32(amax * fp32(1 / target)), target 15 for
inputs and weights and 224 for gradients (0 or non-finite s gives 1); mode 1 (pow2) takes
instead the smallest power of two at or above s; codes = HiF8(fp32(x / s)), round to nearest
with ties away from zero, saturating at 32768. The HiF8 codes come from a decoder written
from the bit layout of arXiv 2409.16626. Each role takes its own format: a recipe may mix
HiF8 and FP8 roles.

delayed (TransformerEngine's DelayedScaling) casts with scales fixed before the pass, from
the amax history (spec's seventh value: the input, weight and grad scales): FP8 codes =
FP8(fp32(x * scale)) dequantized by fp32(1 / scale), HiF8 codes = HiF8(fp32(x / s))
dequantized by s, the same scale in every product that reads the tensor.

ScaledLinear is y = x w^T whose three GEMMs run on the codes' values with fp32 sums, the
result multiplied by alpha = fp32(scale_a * scale_b): forward X, W; dX from dY and W; dW
from dY and X (each tensor quantized whole)."""
import numpy as np
import torch

FP8 = {0: dict(mbits=3, bias=7, max=448.0), 1: dict(mbits=2, bias=15, max=57344.0)}
HIF8 = 2
TARGET_ACT, TARGET_GRAD = 15.0, 224.0
FLT_MAX = float(np.finfo(np.float32).max)


def f32(x):
    return float(np.float32(x))


def amax_of(x):
    a = x.abs()
    a = a[~torch.isnan(a)]
    return float(a.max()) if a.numel() else 0.0


# ---- FP8 ----

def fp8_scale(amax, elem, pow2):
    if not (amax > 0) or np.isinf(amax):
        return 1.0
    s = np.float32(FP8[elem]["max"]) / np.float32(amax)   # one fp32 division
    s = FLT_MAX if np.isinf(s) else float(s)
    if pow2:
        m, e = np.frexp(s)   # s = m 2^e, m in [0.5, 1)
        s = float(np.ldexp(1.0, int(e) - 1))
    return s


def fp8_encode(v, elem):
    """FP8 codes of the fp32 values v (float64 tensor holding them), RNE, saturating, NaN -> 0x7F."""
    f = FP8[elem]
    nan = torch.isnan(v)
    a = torch.where(nan, torch.zeros_like(v), v.abs())
    _, e2 = torch.frexp(a)
    p = (e2 - 1).clamp(min=1 - f["bias"])
    step = torch.pow(2.0, (p - f["mbits"]).double())
    val = (torch.round(a / step) * step).clamp(max=f["max"])
    _, e3 = torch.frexp(val)
    E = (e3 - 1).clamp(min=1 - f["bias"])
    steps = (val / torch.pow(2.0, (E - f["mbits"]).double())).long()
    normal = val >= 2.0 ** (1 - f["bias"])
    codes = torch.where(normal, ((E + f["bias"]) << f["mbits"]) + steps - (1 << f["mbits"]), steps)
    codes = codes | (torch.signbit(v).long() << 7)
    return torch.where(nan, torch.full_like(codes, 0x7F), codes)


def fp8_decode(q, elem):
    f = FP8[elem]
    q = q.long()
    mag = q & 0x7F
    ef, mf = mag >> f["mbits"], mag & ((1 << f["mbits"]) - 1)
    sub = mf.double() * 2.0 ** (1 - f["bias"] - f["mbits"])
    nor = ((1 << f["mbits"]) + mf).double() * torch.pow(2.0, (ef - f["bias"] - f["mbits"]).double())
    return torch.where(ef == 0, sub, nor) * torch.where((q & 0x80) != 0, -1.0, 1.0)


# ---- HiF8 ----

def hif8_value(c):
    """Value of one code from the layout: sign | dot | exponent (sign-magnitude) | mantissa."""
    sign = -1.0 if c & 0x80 else 1.0
    m = c & 0x7F
    if c == 0x80:
        return float("nan")
    if m == 0x6F:
        return sign * float("inf")
    for pre, mask, D, mb in ((0x60, 0x60, 3, 1), (0x40, 0x60, 2, 2), (0x20, 0x60, 1, 3), (0x10, 0x70, 0, 3)):
        if m & mask == pre:
            field = (m >> mb) & ((1 << (D + 1)) - 1)
            e = (1 << D) + (field & ((1 << D) - 1))
            if field >> D:
                e = -e
            return sign * 2.0 ** e * (1 + (m & ((1 << mb) - 1)) / 2 ** mb)
    if m & 0x78 == 0x08:
        return sign * (1 + (m & 7) / 8)
    return sign * 2.0 ** (m - 23) if m else 0.0


HIF8_VALUES = np.array([hif8_value(c) for c in range(256)])
_pos = sorted((HIF8_VALUES[c], c) for c in range(1, 0x80) if c != 0x6F)   # positive finite codes
POS_VALS = np.array([0.0] + [v for v, _ in _pos])
POS_CODES = np.array([0] + [c for _, c in _pos])


def hif8_encode(v):
    """HiF8 codes of the values v (float64 numpy), nearest with ties away, saturating."""
    a = np.abs(v)
    nan = np.isnan(v)
    a = np.where(nan, 0.0, np.minimum(a, POS_VALS[-1]))
    i = np.clip(np.searchsorted(POS_VALS, a, side="right") - 1, 0, len(POS_VALS) - 2)
    lo, hi = POS_VALS[i], POS_VALS[i + 1]
    pick = np.where(a >= (lo + hi) / 2, i + 1, i)
    pick = np.where(a == POS_VALS[-1], len(POS_VALS) - 1, pick)
    codes = POS_CODES[pick]
    codes = np.where((np.signbit(v)) & (codes != 0), codes | 0x80, codes)
    return np.where(nan, 0x80, codes)


# ---- a whole tensor ----

def quantize(x, elem, role, pow2, fixed=None):
    """x float32 tensor -> (codes uint8 numpy, dequantization scale); role 'grad' or another;
    fixed: a delayed recipe's scale for x (FP8: the quantization scale; HiF8: the dequantization one)."""
    if fixed is not None:
        if elem == HIF8:
            y = (x.float() / torch.tensor(fixed, dtype=torch.float32)).double().numpy()
            return hif8_encode(y).astype(np.uint8), f32(fixed)
        v = (x.float() * torch.tensor(fixed, dtype=torch.float32)).double()
        return fp8_encode(v, elem).numpy().astype(np.uint8), f32(np.float32(1.0) / np.float32(fixed))
    amax = amax_of(x)
    if elem == HIF8:
        target = TARGET_GRAD if role == "grad" else TARGET_ACT
        s = f32(np.float32(amax) * (np.float32(1.0) / np.float32(target)))
        if not (s > 0) or np.isinf(s):
            s = 1.0
        if pow2:   # the smallest power of two >= s, by doubling and halving (exact in float64)
            p = 1.0
            while p < s:
                p *= 2.0
            while p / 2.0 >= s:
                p /= 2.0
            s = p
        y = (x.float() / torch.tensor(s, dtype=torch.float32)).double().numpy()   # fp32 division
        return hif8_encode(y).astype(np.uint8), s
    s = fp8_scale(amax, elem, pow2)
    v = (x.float() * torch.tensor(s, dtype=torch.float32)).double()   # fp32 product
    return fp8_encode(v, elem).numpy().astype(np.uint8), f32(np.float32(1.0) / np.float32(s))


def values(q, elem):
    if elem == HIF8:
        return torch.from_numpy(HIF8_VALUES[q.astype(np.int64)]).float()
    return fp8_decode(torch.from_numpy(q.astype(np.int64)), elem).float()


ROLE = {"input": 0, "weight": 1, "grad": 2}


def scaled_mm(a, ea, ra, b, eb, rb, pow2, ta=False, tb=False, fixed=None):
    qa, sa = quantize(a, ea, ra, pow2, None if fixed is None else fixed[ROLE[ra]])
    qb, sb = quantize(b, eb, rb, pow2, None if fixed is None else fixed[ROLE[rb]])
    va, vb = values(qa, ea), values(qb, eb)
    acc = (va.t() if ta else va) @ (vb.t() if tb else vb)
    return acc * torch.tensor(f32(np.float32(sa) * np.float32(sb)), dtype=torch.float32)


class ScaledLinear(torch.autograd.Function):
    """y = x w^T; spec = (inputs_elem, weight_elem, grads_elem, pow2, tiles, granularity[, hp,
    dgrad_w_tensor, (input, weight, grad scales) of a delayed recipe])."""

    @staticmethod
    def forward(ctx, x, w, spec):
        ctx.save_for_backward(x, w)
        ctx.spec = spec
        i, wt, _, pow2 = spec[:4]
        fixed = spec[8] if len(spec) > 8 else None
        return scaled_mm(x, i, "input", w, wt, "weight", pow2, tb=True, fixed=fixed)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        i, wt, g, pow2 = ctx.spec[:4]
        fixed = ctx.spec[8] if len(ctx.spec) > 8 else None
        dx = scaled_mm(dy, g, "grad", w, wt, "weight", pow2, fixed=fixed)
        dw = scaled_mm(dy, g, "grad", x, i, "input", pow2, ta=True, fixed=fixed)
        return dx, dw, None


# ---- torchao's rowwise recipes (float8_utils.amax_to_scale, to_fp8_saturated) ----
#
# Each operand of a product is quantized per line along that product's reduction dim:
# amax of the line (NaN propagates, as torch.amax), scale = fp32(fp64(max) / max(amax, 1e-12))
# in float64, with pow2 exp2(floor(log2(scale))) on the fp32 scale; codes = FP8(clamp(fp32(x *
# scale), +/-max)); the product runs on the codes' values with fp32 sums and each output
# element is multiplied by fp32(sa[i] * sb[j]) of the reciprocal scales.

EPS = 1e-12


def torchao_scale(amax, elem, pow2):
    s = (FP8[elem]["max"] / torch.clamp(amax.double(), min=EPS)).float()
    return torch.exp2(torch.floor(torch.log2(s))) if pow2 else s


def quantize_lines(x, elem, dim, pow2):
    """x float32 (rows, cols); dim 1: one scale per row, 0: per column, None: one for all.
    Returns (codes uint8 numpy, dequantization scales float32 tensor shaped for broadcasting)."""
    a = x.float().abs()
    amax = a.amax(dim=dim, keepdim=True) if dim is not None else a.max().reshape(1, 1)
    if dim is not None:   # torch.amax propagates NaN; make sure of it whatever the build
        amax = torch.where(torch.isnan(x).any(dim=dim, keepdim=True), torch.full_like(amax, float("nan")), amax)
    elif torch.isnan(x).any():
        amax = torch.full_like(amax, float("nan"))
    s = torchao_scale(amax, elem, pow2)
    m = FP8[elem]["max"]
    v = torch.clamp(x.float() * s, -m, m)
    return fp8_encode(v.double(), elem).numpy().astype(np.uint8), (1.0 / s).float()


def lines_mm(a, ea, da, b, eb, db, pow2, ta=False, tb=False):
    """op(a) @ op(b) on per-line operands; da / db the dim each is reduced over in its own layout."""
    qa, sa = quantize_lines(a, ea, da, pow2)
    qb, sb = quantize_lines(b, eb, db, pow2)
    va, vb = values(qa, ea), values(qb, eb)
    if ta:
        va, sa = va.t(), sa.t()
    if tb:
        vb, sb = vb.t(), sb.t()
    acc = va @ vb
    return acc * (sa.reshape(-1, 1) * sb.reshape(1, -1))   # fp32(sa[i] * sb[j]), then times acc


class RowwiseLinear(torch.autograd.Function):
    """y = x w^T; spec = (inputs, weight, grads, pow2, tiles, granularity 2, hp, dgrad_w_tensor)."""

    @staticmethod
    def forward(ctx, x, w, spec):
        ctx.save_for_backward(x, w)
        ctx.spec = spec
        return lines_mm(x, spec[0], 1, w, spec[1], 1, spec[3], tb=True)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        i, wt, g, pow2 = ctx.spec[:4]
        w_tensor = len(ctx.spec) > 7 and ctx.spec[7] == 1
        dx = lines_mm(dy, g, 1, w, wt, None if w_tensor else 0, pow2)
        dw = lines_mm(dy, g, 0, x, i, 0, pow2, ta=True)
        return dx, dw, None


class HighPrecision(torch.autograd.Function):
    """high_precision_gemms: the products in spec[6]'s bits (1 fprop, 2 dgrad, 4 wgrad) in
    fp32, the others as the recipe's class computes them."""

    @staticmethod
    def forward(ctx, x, w, spec, cls):
        ctx.save_for_backward(x, w)
        ctx.spec, ctx.cls = spec, cls
        if spec[6] & 1:
            return x @ w.t()
        with torch.no_grad():
            return cls.apply(x, w, spec)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        hp = ctx.spec[6]
        with torch.enable_grad():
            xx, ww = x.detach().requires_grad_(), w.detach().requires_grad_()
            ctx.cls.apply(xx, ww, ctx.spec).backward(dy)
        dx = dy @ w if hp & 2 else xx.grad
        dw = dy.t() @ x if hp & 4 else ww.grad
        return dx, dw, None, None


# ---- the blockwise recipe (DeepSeek-V3, TransformerEngine Float8BlockScaling) ----
#
# Each operand of a product is quantized to E4M3 (or the recipe's format) with one scale per
# block: 1x128 along the reduction dim for activations and gradients, 128x128 tiles for the
# weight, 128x1 (along the tokens) for both operands of the weight gradient. A block at an
# edge holds what is left (its amax over those elements). The scale is TE's, as fp8_scale
# above: fp32(fp8_max / amax) with NaN elements ignored by the amax, 1 for amax 0, Inf or NaN,
# FLT_MAX for an Inf quotient, power of two by truncating it (pow2, the default); codes =
# FP8(fp32(x * scale)); the dequantized element is fp32(value * fp32(1 / scale)); the product
# runs on the dequantized operands (summed here in float64, then rounded to fp32).

def block_scales(amax, elem, pow2):
    """fp8_scale over an array of amaxes (numpy float32) -> float32 quantization scales."""
    amax = np.asarray(amax, dtype=np.float32)
    bad = ~(amax > 0) | np.isinf(amax)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s = np.float32(FP8[elem]["max"]) / np.where(bad, np.float32(1), amax)
    s = np.where(np.isinf(s), np.float32(FLT_MAX), s).astype(np.float32)
    if pow2:
        _, e = np.frexp(s.astype(np.float64))
        s = np.ldexp(1.0, e - 1).astype(np.float32)
    return np.where(bad, np.float32(1), s).astype(np.float32)


def quantize_blocks(x, elem, br, bc, pow2):
    """x float32 (rows, cols) in br x bc blocks -> (codes uint8 numpy (rows, cols), dequantization
    scales float32 numpy (ceil(rows/br), ceil(cols/bc)))."""
    a = x.float().numpy()
    R, C = a.shape
    nbr, nbc = -(-R // br), -(-C // bc)
    pad = np.zeros((nbr * br, nbc * bc), dtype=np.float32)   # zeros leave every amax as it is
    pad[:R, :C] = np.where(np.isnan(a), np.float32(0), np.abs(a))
    amax = pad.reshape(nbr, br, nbc, bc).max(axis=(1, 3))
    s = block_scales(amax, elem, pow2)
    full = np.repeat(np.repeat(s, br, axis=0), bc, axis=1)[:R, :C]
    v = torch.from_numpy((a * full).astype(np.float32)).double()   # fp32 product
    sinv = (np.float32(1) / s).astype(np.float32)
    return fp8_encode(v, elem).numpy().astype(np.uint8), sinv


def dequant_blocks(x, elem, br, bc, pow2):
    q, sinv = quantize_blocks(x, elem, br, bc, pow2)
    R, C = q.shape
    full = np.repeat(np.repeat(sinv, br, axis=0), bc, axis=1)[:R, :C].astype(np.float64)
    return (values(q, elem).double() * torch.from_numpy(full)).float().double()   # fp32(value * scale)


def blocks_mm(a, ba, b, bb, ea, eb, pow2, ta=False, tb=False):
    va, vb = dequant_blocks(a, ea, *ba, pow2), dequant_blocks(b, eb, *bb, pow2)
    return ((va.t() if ta else va) @ (vb.t() if tb else vb)).float()


ROW_1x128, TILE, COL_128x1 = (1, 128), (128, 128), (128, 1)


class BlockwiseLinear(torch.autograd.Function):
    """y = x w^T; spec = (inputs, weight, grads, pow2, tiles, granularity 3, hp, 0)."""

    @staticmethod
    def forward(ctx, x, w, spec):
        ctx.save_for_backward(x, w)
        ctx.spec = spec
        return blocks_mm(x, ROW_1x128, w, TILE, spec[0], spec[1], spec[3], tb=True)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        i, wt, g, pow2 = ctx.spec[:4]
        dx = blocks_mm(dy, ROW_1x128, w, TILE, g, wt, pow2)
        dw = blocks_mm(dy, COL_128x1, x, COL_128x1, g, i, pow2, ta=True)
        return dx, dw, None
