#!/usr/bin/python3
"""Independent safetensors reader/writer for tests/safetensors_torch.sh.

  safetensors_oracle.py write DIR   write DIR/hf_written.safetensors in the Hugging Face
                                    layout (F32, BF16 via torch, F16, F64, a scalar,
                                    metadata first, data ordered as HF's serializer orders
                                    it: by dtype size, then name), for the C reader
  safetensors_oracle.py check DIR   parse DIR/c_written.safetensors (written by
                                    tests/test_safetensors in oracle mode) with struct + json
                                    + numpy and check layout, dtypes, shapes and values

Values come from formulas computed here and in the C test independently: pattern(i) is a
24-bit integer times 2^-20 (exact in fp32); bf16 values are torch's round-to-nearest-even
conversion of fp32 values.
"""
import json
import os
import struct
import sys

import numpy as np
import torch


def pattern(lo, hi):
    i = np.arange(lo, hi, dtype=np.uint64)
    k = ((i * np.uint64(2654435761)) % np.uint64(1 << 24)).astype(np.int64) - (1 << 23)
    return (k.astype(np.float64) * 2.0 ** -20).astype(np.float32)


def bf16_bits(x_f32):
    """fp32 array -> bf16 bit patterns (uint16), rounded by torch."""
    t = torch.from_numpy(np.ascontiguousarray(x_f32, dtype=np.float32)).to(torch.bfloat16)
    return t.view(torch.int16).numpy().view(np.uint16)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def fail(msg):
    print("    safetensors_oracle: " + msg)
    sys.exit(1)


def write(d):
    tensors = {
        "model.layers.0.mlp.up_proj.weight": ("F32", [6, 7], pattern(0, 42).tobytes()),
        "model.layers.0.self_attn.q_proj.weight": ("BF16", [3, 5, 4], bf16_bits(pattern(1000, 1060)).tobytes()),
        "model.norm.weight": ("F16", [33], ((np.arange(33) * 7919 % 2001 - 1000) / 64.0).astype(np.float16).tobytes()),
        "lm_head.bias": ("F64", [2, 2], (0.1 * np.arange(1, 5, dtype=np.float64)).tobytes()),
        "step": ("BF16", [], bf16_bits(np.array([42.0], dtype=np.float32)).tobytes()),
    }
    size = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
    order = sorted(tensors, key=lambda n: (-size[tensors[n][0]], n))  # HF's data order
    header = {"__metadata__": {"format": "pt", "writer": "safetensors_oracle.py"}}
    data = b""
    for name in order:
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode("utf-8")  # default separators: ", " and ": "
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(os.path.join(d, "hf_written.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def check(d):
    path = os.path.join(d, "c_written.safetensors")
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    if (8 + n) % 8:
        fail(f"data section starts at {8 + n}, not a multiple of 8")
    text = blob[8:8 + n].decode("utf-8")
    body = text.rstrip(" ")
    if not body.endswith("}") or len(text) - len(body) >= 8:
        fail(f"header padding is not 0-7 spaces: {text[-12:]!r}")
    header = json.loads(text)
    data = blob[8 + n:]
    meta = header.pop("__metadata__", None)
    if meta != {"format": "pt", "writer": "mxtrain"}:
        fail(f"metadata {meta!r}")
    want = {
        "a.f32": ("F32", [3, 5]),
        "b.bf16": ("BF16", [4, 3, 2]),
        "c.scalar": ("F32", []),
        "d.empty": ("BF16", [2, 0]),
        "e.specials": ("BF16", [8]),
    }
    if sorted(header) != sorted(want):
        fail(f"tensor names {sorted(header)}")
    pos = 0
    for name in sorted(header):  # data in name order, tiling the data section
        e = header[name]
        if (e["dtype"], e["shape"]) != want[name]:
            fail(f"{name}: dtype/shape {e['dtype']} {e['shape']}, want {want[name]}")
        b, end = e["data_offsets"]
        if b != pos:
            fail(f"{name}: begins at {b}, want {pos}")
        pos = end
    if pos != len(data):
        fail(f"tensors end at {pos}, data section has {len(data)} bytes")

    def raw(name, dt):
        b, end = header[name]["data_offsets"]
        return np.frombuffer(data[b:end], dtype=dt).reshape(header[name]["shape"])

    a = raw("a.f32", "<f4")
    if not np.array_equal(a.view(np.uint32), pattern(0, 15).reshape(3, 5).view(np.uint32)):
        fail(f"a.f32 values {a.ravel()[:4]} ...")
    bits = raw("b.bf16", "<u2")
    expect = bf16_bits(pattern(500, 524)).reshape(4, 3, 2)
    if not np.array_equal(bits, expect):
        fail(f"b.bf16 bits {bits.ravel()[:4]} vs torch {expect.ravel()[:4]}")
    if not np.allclose(bf16_to_f32(bits).ravel(), pattern(500, 524), rtol=2 ** -8, atol=0):
        fail("b.bf16 values are not within bf16 rounding of the fp32 pattern")
    c = raw("c.scalar", "<f4")
    if c.shape != () or float(c) != 3.25:
        fail(f"c.scalar {c!r}")
    if raw("d.empty", "<u2").shape != (2, 0):
        fail("d.empty shape")
    sp = np.array([0x7FC00000, 0x7F800000, 0xFF800000, 0x80000000, 0x0000A000, 0x7F7FFFFF, 0x3F808000, 0x3F818000],
                  dtype=np.uint32)
    got = raw("e.specials", "<u2")
    expect = bf16_bits(sp.view(np.float32))
    # NaN: any bf16 NaN will do (torch's vectorised path itself gives 0xFFFF for 0x7FC00000)
    if not (got[0] & 0x7F80 == 0x7F80 and got[0] & 0x7F):
        fail(f"e.specials[0] is {hex(got[0])}, not a bf16 NaN")
    if not np.array_equal(got[1:], expect[1:]):
        fail(f"e.specials bits {[hex(v) for v in got]} vs torch {[hex(v) for v in expect]}")
    print(f"    safetensors_oracle: {path}: 5 tensors, layout and values as expected")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        print(__doc__)
        sys.exit(2)
    (write if sys.argv[1] == "write" else check)(sys.argv[2])
