"""A PyTorch emulation of MX quantization and of the MXFP8 linear layer (SPEC §4, §5),
written from the specification, independent of the C library.

mx_quantize(x, axis, elem, mode) gives the FP8 codes and E8M0 scales of a 2-D float32
tensor; mx_dequantize inverts it. MXLinear is Y = X W^T whose three GEMMs run on MX operands
quantized from high precision: forward X rowwise, W rowwise; dX from dY rowwise and W colwise;
dW from dY colwise and X colwise. Products of dequantized values are exact; sums run in fp32.

usage: /usr/bin/python3 tests/py/mx_ref.py check-trace DIR    compare the C model's traced
       GEMM operands (mx_model_trace_mx) with this quantizer, bit for bit
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scaled_ref  # noqa: E402

ROWWISE, COLWISE = 0, 1
FORMATS = {0: dict(mbits=3, bias=7, emax=8, max=448.0), 1: dict(mbits=2, bias=15, emax=15, max=57344.0)}


def _scale_codes(amax, nonfinite, f, mode):
    """E8M0 codes from block maxima (float64 tensor) per SPEC §4."""
    if mode == 0:   # floor: 2^(floor(log2 amax) - emax)
        _, e = torch.frexp(amax)
        code = torch.where(amax == 0, torch.zeros_like(e), (e - 1 - f["emax"]).clamp(-127, 127) + 127)
    else:           # rceil: smallest power of two >= fp32(amax * fp32(1/max))
        inv = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(f["max"], dtype=torch.float32)
        d = (amax.float() * inv).double()
        m, e = torch.frexp(d)
        ceil_log2 = torch.where(m == 0.5, e - 1, e)
        code = torch.where(d == 0, torch.zeros_like(e), (ceil_log2 + 127).clamp(min=0))
    return torch.where(nonfinite, torch.full_like(code, 255), code).long()


def _encode(xd, code, nonfinite, f):
    """FP8 codes of xd (float64) scaled by 2^(127 - code) (same shape), saturating."""
    v = xd * torch.pow(2.0, (127 - code).clamp(max=254).double())   # exact
    a = v.abs()
    _, e2 = torch.frexp(a)
    p = (e2 - 1).clamp(min=1 - f["bias"])
    step = torch.pow(2.0, (p - f["mbits"]).double())
    val = (torch.round(a / step) * step).clamp(max=f["max"])   # round half to even, saturate
    _, e3 = torch.frexp(val)
    E = (e3 - 1).clamp(min=1 - f["bias"])
    mant_steps = (val / torch.pow(2.0, (E - f["mbits"]).double())).long()   # in [2^mbits, 2^(mbits+1)) for normals
    normal = val >= 2.0 ** (1 - f["bias"])
    codes = torch.where(normal, ((E + f["bias"]) << f["mbits"]) + mant_steps - (1 << f["mbits"]), mant_steps)
    codes = codes | (torch.signbit(v).long() << 7)
    return torch.where(nonfinite, torch.full_like(codes, 0x7F), codes)


def mx_quantize(x, axis, elem, mode):
    """x: (R, C) float32 -> codes uint8 (R, C), scales uint8 (R, ceil(C/32)) or (ceil(R/32), C)."""
    if axis == COLWISE:
        q, s = mx_quantize(x.t().contiguous(), ROWWISE, elem, mode)
        return q.t().contiguous(), s.t().contiguous()
    f = FORMATS[elem]
    R, C = x.shape
    nb = (C + 31) // 32
    xp = torch.zeros(R, nb * 32, dtype=torch.float64)
    xp[:, :C] = x.double()
    xb = xp.view(R, nb, 32)
    nonfinite = ~torch.isfinite(xb).all(-1)
    amax = torch.where(torch.isfinite(xb), xb.abs(), torch.zeros_like(xb)).amax(-1)
    code = _scale_codes(amax, nonfinite, f, mode)
    codes = _encode(xb, code[..., None].expand_as(xb), nonfinite[..., None].expand_as(xb), f)
    return codes.reshape(R, nb * 32)[:, :C].to(torch.uint8).contiguous(), code.to(torch.uint8)


def mx_quantize_tiles(x, elem, mode):
    """x: (R, C) float32 -> codes uint8 (R, C) and one scale per 32x32 tile (ceil(R/32), ceil(C/32))."""
    f = FORMATS[elem]
    R, C = x.shape
    tr, tc = (R + 31) // 32, (C + 31) // 32
    xp = torch.zeros(tr * 32, tc * 32, dtype=torch.float64)
    xp[:R, :C] = x.double()
    xt = xp.view(tr, 32, tc, 32).permute(0, 2, 1, 3)   # (tr, tc, 32, 32)
    finite = torch.isfinite(xt)
    nonfinite = ~finite.flatten(2).all(-1)
    amax = torch.where(finite, xt.abs(), torch.zeros_like(xt)).flatten(2).amax(-1)
    code = _scale_codes(amax, nonfinite, f, mode)
    codes = _encode(xt, code[..., None, None].expand_as(xt), nonfinite[..., None, None].expand_as(xt), f)
    codes = codes.permute(0, 2, 1, 3).reshape(tr * 32, tc * 32)[:R, :C]
    return codes.to(torch.uint8).contiguous(), code.to(torch.uint8)


def tiles_as_plane(q, tile_scales, axis):
    """The scale layout of a blocked plane along axis, from one scale per 32x32 tile."""
    R, C = q.shape
    if axis == ROWWISE:
        return tile_scales.repeat_interleave(32, dim=0)[:R, :]
    return tile_scales.repeat_interleave(32, dim=1)[:, :C]


def mx_dequantize(q, s, axis, elem):
    """Exact values of a plane, as float32 (NaN where the scale or code is NaN)."""
    if axis == COLWISE:
        return mx_dequantize(q.t().contiguous(), s.t().contiguous(), ROWWISE, elem).t().contiguous()
    f = FORMATS[elem]
    q = q.long()
    mag = q & 0x7F
    ef, mf = mag >> f["mbits"], mag & ((1 << f["mbits"]) - 1)
    sub = mf.double() * 2.0 ** (1 - f["bias"] - f["mbits"])
    nor = ((1 << f["mbits"]) + mf).double() * torch.pow(2.0, (ef - f["bias"] - f["mbits"]).double())
    val = torch.where(ef == 0, sub, nor) * torch.where((q & 0x80) != 0, -1.0, 1.0)
    R, C = q.shape
    scale = torch.pow(2.0, s.long().double() - 127).repeat_interleave(32, dim=1)[:, :C]
    nan = (s.long() == 255).repeat_interleave(32, dim=1)[:, :C] | (mag == 0x7F if elem == 0 else ef == 31)
    out = val * scale
    return torch.where(nan, torch.full_like(out, float("nan")), out).float()


def mx_fake(x, axis, elem, mode):
    q, s = mx_quantize(x, axis, elem, mode)
    return mx_dequantize(q, s, axis, elem)


def mx_fake_weight(w, axis, elem, mode, tiles):
    """A weight's plane values: blocks along axis, or 32x32 tiles (the same for both axes)."""
    if not tiles:
        return mx_fake(w, axis, elem, mode)
    q, t = mx_quantize_tiles(w, elem, mode)
    return mx_dequantize(q, tiles_as_plane(q, t, ROWWISE), ROWWISE, elem)


class MXLinear(torch.autograd.Function):
    """y = x w^T with MX operands; spec = (inputs_elem, weight_elem, grads_elem, mode, tiles)
    where tiles = 1 quantizes the weight in 32x32 tiles (1-32-32 recipes)."""

    @staticmethod
    def forward(ctx, x, w, spec):
        ctx.save_for_backward(x, w)
        ctx.spec = spec
        i, wt, _, mode, tiles = spec[:5]
        return mx_fake(x, ROWWISE, i, mode) @ mx_fake_weight(w, ROWWISE, wt, mode, tiles).t()

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        i, wt, g, mode, tiles = ctx.spec[:5]
        dx = mx_fake(dy, ROWWISE, g, mode) @ mx_fake_weight(w, COLWISE, wt, mode, tiles)
        dw = mx_fake(dy, COLWISE, g, mode).t() @ mx_fake(x, COLWISE, i, mode)
        return dx, dw, None


TENSOR = 2   # a traced per-tensor operand (MXI_TRACE_TENSOR): its s.bin is its fp32 dequantization scale
# the rowwise recipes' operands (MXI_TRACE_ROWS, _COLS, _TORCHAO_TENSOR): fp32 scales per row,
# per column, or one by torchao's arithmetic; the dim each reduces over
LINES = {3: 1, 4: 0, 5: None}
# the blockwise recipe's operands (MXI_TRACE_BLOCKS_1x128, _128x128, _128x1): fp32 scales per block
BLOCKS = {6: (1, 128), 7: (128, 128), 8: (128, 1)}
HP_BITS = {"forward": 1, "dinput": 2, "dweight": 4}   # high_precision_gemms: not traced
ROLES = {"forward": {"a": "input", "b": "weight"}, "dinput": {"a": "grad", "b": "weight"},
         "dweight": {"a": "grad", "b": "input"}}


def check_trace(d):
    """Each traced GEMM operand plane must equal this quantizer applied to the traced fp32
    tensor; an operand that was a saved input (no fp32 tensor left) must be byte-identical to
    one of the traced saved planes, which are checked the same way."""
    mode = int(open(os.path.join(d, "mode.txt")).read())
    checked, saved = 0, []

    def load(base):
        rows, cols, axis, elem, tiles = np.fromfile(base + "meta.bin", dtype="<i8")
        q = np.fromfile(base + "q.bin", dtype=np.uint8).reshape(rows, cols)
        s = np.fromfile(base + "s.bin", dtype="<f4" if axis == TENSOR or axis in LINES or axis in BLOCKS else np.uint8)
        hp = None
        if os.path.exists(base + "hp.bin"):
            hp = torch.from_numpy(np.fromfile(base + "hp.bin", dtype="<f4").reshape(rows, cols))
        return hp, q, s, int(axis), int(elem), int(tiles)

    def matches_quantizer(name, hp, q, s, axis, elem, tiles=0, role=None):
        if axis in LINES:   # torchao's per-line scales (tests/py/scaled_ref.py)
            wq, ws = scaled_ref.quantize_lines(hp, elem, LINES[axis], mode)
            ws = ws.numpy().reshape(-1)
            if np.array_equal(wq, q) and np.array_equal(ws.view(np.uint32), s.view(np.uint32)):
                return True
            print(f"{name}: per-line operand differs from the reference, first code at "
                  f"{np.argwhere(wq != q)[:1].tolist()}, first scale at {np.argwhere(ws != s)[:1].tolist()}")
            return False
        if axis in BLOCKS:   # the blockwise recipe's per-block scales (tests/py/scaled_ref.py)
            wq, ws = scaled_ref.quantize_blocks(hp, elem, *BLOCKS[axis], mode)
            ws = ws.reshape(-1)
            if np.array_equal(wq, q) and np.array_equal(ws.view(np.uint32), s.view(np.uint32)):
                return True
            print(f"{name}: per-block operand differs from the reference, first code at "
                  f"{np.argwhere(wq != q)[:1].tolist()}, first scale at {np.argwhere(ws != s)[:1].tolist()}")
            return False
        if axis == TENSOR:   # one scale for the whole tensor (tests/py/scaled_ref.py)
            wq, ws = scaled_ref.quantize(hp, elem, role, mode)
            if np.array_equal(wq, q) and np.float32(ws) == s[0]:
                return True
            print(f"{name}: per-tensor operand differs from the reference (scale {s[0]!r} vs {ws!r}), first code at "
                  f"{np.argwhere(wq != q)[:1].tolist()}")
            return False
        if tiles:
            wq, t = mx_quantize_tiles(hp, elem, mode)
            ws = tiles_as_plane(wq, t, axis)
        else:
            wq, ws = mx_quantize(hp, axis, elem, mode)
        if np.array_equal(wq.numpy(), q) and np.array_equal(ws.numpy().reshape(-1), s):
            return True
        print(f"{name}: planes differ from the reference quantizer, first at {np.argwhere(wq.numpy() != q)[:1].tolist()}")
        return False

    for base in sorted(p[: -len("meta.bin")] for p in os.listdir(d) if p.startswith("save") and p.endswith("meta.bin")):
        hp, q, s, axis, elem, _ = load(os.path.join(d, base))
        if not matches_quantizer(base, hp, q, s, axis, elem, role="input"):   # saves are inputs
            return 1
        saved.append((q, s))
        checked += 1
    hp_path = os.path.join(d, "hp.txt")
    hp_set = int(open(hp_path).read()) if os.path.exists(hp_path) else 0
    for kind in ("forward", "dinput", "dweight"):
        if hp_set & HP_BITS[kind]:
            continue   # run in fp32: nothing quantized to check
        for op in "ab":
            hp, q, s, axis, elem, tiles = load(os.path.join(d, f"{kind}_{op}_"))
            if hp is None:
                if not any(np.array_equal(q, sq) and np.array_equal(s, ss) for sq, ss in saved):
                    print(f"{kind} operand {op}: a saved input that no traced save produced")
                    return 1
            elif not matches_quantizer(f"{kind} operand {op}", hp, q, s, axis, elem, tiles, ROLES[kind][op]):
                return 1
            checked += 1
    print(f"mx_ref: {checked} traced planes (GEMM operands and saved inputs) match the reference quantizer bit for bit")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "check-trace":
        sys.exit(check_trace(sys.argv[2]))
    print(__doc__)
    sys.exit(2)
