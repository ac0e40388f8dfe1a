"""Checks `mxtrain grads` against PyTorch: reads the weights and the token file the C side
used (parsing safetensors and the llm.c shard here, from their specifications), runs the
reference model of model_ref.py at fp32 on the first batch, and compares the loss and every
`grad.<name>` tensor of the C output (relative norm error <= 1e-4). With a recipe, the
converted modules' GEMMs are emulated (tests/py/mx_ref.py, tests/py/scaled_ref.py) and the
bound is 1e-2: SPEC is "inputs weight grads mode tiles granularity" as in model_ref.py's
mx.txt, PLAN the output of `mxtrain plan --json`, whose converted modules are emulated.
With DELAYED, a delayed recipe's delayed_scaling.safetensors: its scales are the casts'.
usage: /usr/bin/python3 tests/py/grads_check.py CONFIG_JSON WEIGHTS TOKENS GRADS [SPEC PLAN [DELAYED]]"""
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_ref  # noqa: E402


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype="<f4").reshape(info["shape"])
    return out


def delayed_scales(path):
    """{weight name: (3,) scales, (fused expert tensor, e): (3,)} from delayed_scaling.safetensors."""
    out = {}
    for name, v in read_safetensors(path).items():
        if not name.endswith(".scale"):
            continue
        base = name[: -len(".scale")]
        if v.ndim == 2:
            for e in range(v.shape[0]):
                out[(base, e)] = tuple(float(x) for x in v[e])
        else:
            out[base] = tuple(float(x) for x in v)
    return out


def main(cfg_json, weights, tokens, grads, spec=None, plan=None, delayed=None):
    cfg = json.loads(cfg_json)
    W = {k: torch.from_numpy(v.copy()).requires_grad_() for k, v in read_safetensors(weights).items()}
    head = np.fromfile(tokens, dtype="<i4", count=256)
    width = {(20240520, 1): "<u2", (20240801, 7): "<u4"}[(int(head[0]), int(head[1]))]
    n = cfg["B"] * cfg["T"]
    toks = np.fromfile(tokens, dtype=width, offset=1024, count=n + 1).astype(np.int64)
    inputs = torch.from_numpy(toks[:n]).view(cfg["B"], cfg["T"])
    targets = torch.from_numpy(toks[1:]).view(cfg["B"], cfg["T"])
    mx_spec, modules, tol, ltol = None, frozenset(), 1e-4, 1e-5
    if spec:
        mx_spec = tuple(int(v) for v in spec.split())
        if delayed:
            mx_spec = mx_spec + (0,) * (8 - len(mx_spec)) + (delayed_scales(delayed),)   # the scales ninth
        modules = frozenset(m["module"] for m in json.load(open(plan))["modules"] if m["converted"])
        tol = ltol = 1e-2
    ce, aux, total = model_ref.forward(cfg, W, inputs, targets, mx_spec, modules)
    total.backward()
    got = read_safetensors(grads)
    assert abs(float(got["loss"]) - total.item()) <= ltol * total.item(), (float(got["loss"]), total.item())
    assert set(got) == {"loss"} | {"grad." + k for k in W}, sorted(set(got) ^ ({"loss"} | {"grad." + k for k in W}))
    worst = 0.0
    for k, t in W.items():
        g = t.grad.numpy()
        err = np.linalg.norm(got["grad." + k] - g) / max(np.linalg.norm(g), 1e-30)
        assert err <= tol or np.linalg.norm(g) == 0 and np.all(got["grad." + k] == 0), f"grad.{k}: relative error {err:.3g}"
        worst = max(worst, err)
    print(f"    grads_check: loss {total.item():.6f}, {len(W)} gradients agree with PyTorch (worst {worst:.2e})")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(*sys.argv[1:8])
