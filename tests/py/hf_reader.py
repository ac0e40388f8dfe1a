"""An independent reader of Hugging Face model directories, as the HF ecosystem reads them:
the model is built from config.json alone (model_type, architectures and the hyper-parameters
under transformers' names), every tensor of the safetensors files (model.safetensors, or the
shards model.safetensors.index.json lists) must be exactly the set of tensors, with the shapes,
that config implies, each file must carry {"format": "pt"} metadata, and the loss of the first
batch of an llm.c token shard is computed by the plain PyTorch model of model_ref.py (fp32)
and compared with the `loss` scalar `mxtrain grads` wrote for the same directory and tokens.

usage: /usr/bin/python3 tests/py/hf_reader.py MODEL_DIR TOKENS B T GRADS
"""
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_ref  # noqa: E402

ARCH = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


def read_file(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    assert header.get("__metadata__") == {"format": "pt"}, (path, header.get("__metadata__"))
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        if info["dtype"] == "F32":
            a = np.frombuffer(data[b:e], dtype="<f4")
        elif info["dtype"] == "BF16":
            a = (np.frombuffer(data[b:e], dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise AssertionError(f"{path}: {name} has dtype {info['dtype']}")
        out[name] = a.reshape(info["shape"]), info["dtype"]
    return out


def read_weights(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_file(os.path.join(d, "model.safetensors"))
    idx = json.load(open(index))
    out = {}
    for f in sorted(set(idx["weight_map"].values())):
        part = read_file(os.path.join(d, f))
        for name in part:
            assert idx["weight_map"].get(name) == f, f"{name} is in {f}, the index says {idx['weight_map'].get(name)}"
        out.update(part)
    assert set(out) == set(idx["weight_map"]), sorted(set(out) ^ set(idx["weight_map"]))
    total = sum(a.size * (2 if dt == "BF16" else 4) for a, dt in out.values())
    assert idx["metadata"]["total_size"] == total, (idx["metadata"]["total_size"], total)
    return out


def expected_shapes(c):
    """Every tensor a transformers model of this config has, with its shape."""
    C, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    NH = c["num_attention_heads"]
    NKV = c.get("num_key_value_heads") or NH
    HD = c.get("head_dim") or C // NH
    moe = c["model_type"] == "qwen3_moe"
    s = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    if not c.get("tie_word_embeddings", False):
        s["lm_head.weight"] = (V, C)
    for l in range(L):
        p = f"model.layers.{l}."
        s[p + "input_layernorm.weight"] = (C,)
        s[p + "post_attention_layernorm.weight"] = (C,)
        for name, rows in (("q", NH * HD), ("k", NKV * HD), ("v", NKV * HD)):
            s[p + f"self_attn.{name}_proj.weight"] = (rows, C)
            if c.get("attention_bias", False):
                s[p + f"self_attn.{name}_proj.bias"] = (rows,)
        s[p + "self_attn.o_proj.weight"] = (C, NH * HD)
        if c.get("attention_bias", False):
            s[p + "self_attn.o_proj.bias"] = (C,)
        if c["model_type"] != "llama":
            s[p + "self_attn.q_norm.weight"] = (HD,)
            s[p + "self_attn.k_norm.weight"] = (HD,)
        sparse = moe and l not in c.get("mlp_only_layers", []) and (l + 1) % c.get("decoder_sparse_step", 1) == 0
        if sparse:
            E, FE = c["num_experts"], c["moe_intermediate_size"]
            s[p + "mlp.gate.weight"] = (E, C)
            for e in range(E):
                s[p + f"mlp.experts.{e}.gate_proj.weight"] = (FE, C)
                s[p + f"mlp.experts.{e}.up_proj.weight"] = (FE, C)
                s[p + f"mlp.experts.{e}.down_proj.weight"] = (C, FE)
        else:
            F = c["intermediate_size"]
            s[p + "mlp.gate_proj.weight"] = (F, C)
            s[p + "mlp.up_proj.weight"] = (F, C)
            s[p + "mlp.down_proj.weight"] = (C, F)
    return s


def load(d):
    """The model of directory d, from config.json alone: (model_ref config, weights)."""
    c = json.load(open(os.path.join(d, "config.json")))
    assert c["architectures"] == [ARCH[c["model_type"]]], (c["model_type"], c["architectures"])
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings", "tie_word_embeddings",
                "attention_bias", "vocab_size", "torch_dtype", "hidden_act"):
        assert key in c, f"config.json has no {key}"
    if c["model_type"] == "qwen3_moe":
        for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "mlp_only_layers",
                    "decoder_sparse_step", "output_router_logits", "router_aux_loss_coef"):
            assert key in c, f"config.json has no {key}"
    assert c["hidden_act"] == "silu" and c.get("rope_scaling") is None
    raw = read_weights(d)
    want = expected_shapes(c)
    assert set(raw) == set(want), f"tensors not implied by config.json: {sorted(set(raw) - set(want))}; " \
                                  f"missing: {sorted(set(want) - set(raw))}"
    for name, (a, dt) in raw.items():
        assert tuple(a.shape) == want[name], (name, a.shape, want[name])
        assert dt == {"float32": "F32", "bfloat16": "BF16"}[c["torch_dtype"]], (name, dt, c["torch_dtype"])
    W = {k: torch.from_numpy(a.copy()) for k, (a, _) in raw.items()}
    cfg = {"model_type": {"llama": 0, "qwen3": 1, "qwen3_moe": 2}[c["model_type"]],
           "hidden_size": c["hidden_size"], "num_attention_heads": c["num_attention_heads"],
           "num_key_value_heads": c["num_key_value_heads"], "head_dim": c["head_dim"],
           "num_hidden_layers": c["num_hidden_layers"], "rms_norm_eps": c["rms_norm_eps"],
           "rope_theta": c["rope_theta"], "num_experts": c.get("num_experts", 0),
           "num_experts_per_tok": c.get("num_experts_per_tok", 0), "norm_topk_prob": c.get("norm_topk_prob", False),
           "output_router_logits": c.get("output_router_logits", False),
           "router_aux_loss_coef": c.get("router_aux_loss_coef", 0.0), "name": c["architectures"][0],
           "dtype": c["torch_dtype"]}
    return cfg, W


def batch_loss(cfg, W, tokens, B, T, first=0):
    """(cross-entropy, total loss) of the B x T batch whose inputs start at token `first` of
    an llm.c shard (the targets one token later), in fp32."""
    head = np.fromfile(tokens, dtype="<i4", count=256)
    width = {(20240520, 1): "<u2", (20240801, 7): "<u4"}[(int(head[0]), int(head[1]))]
    size = np.dtype(width).itemsize
    toks = np.fromfile(tokens, dtype=width, offset=1024 + first * size, count=B * T + 1).astype(np.int64)
    inputs = torch.from_numpy(toks[:-1]).view(B, T)
    targets = torch.from_numpy(toks[1:]).view(B, T)
    with torch.no_grad():
        ce, aux, total = model_ref.forward(dict(cfg, B=B, T=T), W, inputs, targets)
    return ce.item(), total.item()


def main(d, tokens, B, T, grads):
    cfg, W = load(d)
    _, total = batch_loss(cfg, W, tokens, B, T)
    got = float(read_file(grads)["loss"][0])
    assert abs(got - total) <= 1e-5 * total, (got, total)
    print(f"    hf_reader: {cfg['name']} from config.json alone, {len(W)} tensors ({cfg['dtype']}); "
          f"loss {total:.6f} = mxtrain grads {got:.6f}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
