"""torch.optim.AdamW oracle: reads w0 and 5 gradients (float32) and per-step learning
rates, runs torch's AdamW, writes the weights after each step.
usage: /usr/bin/python3 tests/py/adamw_ref.py DIR N"""
import os
import sys

import numpy as np
import torch

d, n = sys.argv[1], int(sys.argv[2])
w0 = np.fromfile(os.path.join(d, "w0.bin"), dtype="<f4")
grads = np.fromfile(os.path.join(d, "grads.bin"), dtype="<f4").reshape(-1, n)
lrs = np.fromfile(os.path.join(d, "lrs.bin"), dtype="<f4")
for decay in (0, 1):
    w = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt = torch.optim.AdamW([w], lr=float(lrs[0]), betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1 if decay else 0.0)
    out = []
    for step, g in enumerate(grads):
        for group in opt.param_groups:
            group["lr"] = float(lrs[step])
        w.grad = torch.from_numpy(g.copy())
        opt.step()
        out.append(w.detach().numpy().copy())
    np.stack(out).astype("<f4").tofile(os.path.join(d, f"w_decay{decay}.bin"))
