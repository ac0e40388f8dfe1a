"""PyTorch reference for `mxtrain generate`: greedy decoding with a KV cache in plain PyTorch
(fp32), written after Hugging Face transformers' Llama / Qwen3 / Qwen3-MoE modeling code, on a
model directory read by hf_reader.py (config.json alone, and its safetensors).

usage: /usr/bin/python3 tests/py/generate_ref.py DIR MAX_NEW PROMPT...
       /usr/bin/python3 tests/py/generate_ref.py DIR MAX_NEW --ids EOS ID,ID,...
  Decodes each prompt on its own (byte-level, as `mxtrain prepare` tokenizes: end-of-text
  256, then the prompt's bytes) for up to MAX_NEW tokens, stopping at end-of-text, and writes
  what `mxtrain generate` must write to standard output: each prompt's new bytes followed by
  a newline. Standard error gets each sequence's length and the decoding's tokens/s.
  With --ids, one prompt given as token ids (the end-of-document token EOS first) of DIR's
  tokenizer.json, a byte-level BPE: generation stops at EOS, and the new tokens' text is
  their vocabulary strings mapped back through GPT-2's byte-to-unicode table (added tokens
  have none), written here from its definition.
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reader  # noqa: E402

EOT = 256


def rmsnorm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Decoder:
    """The model with a KV cache: step(ids) runs the new tokens ids (1, t) after those cached."""

    def __init__(self, cfg, W):
        self.c, self.W = cfg, W
        HD = cfg["head_dim"]
        self.inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, HD, 2, dtype=torch.int64).float() / HD))
        self.cache = [None] * cfg["num_hidden_layers"]
        self.past = 0

    def lin(self, x, name):
        y = x @ self.W[name + ".weight"].T
        return y + self.W[name + ".bias"] if name + ".bias" in self.W else y

    def step(self, ids):
        c, W = self.c, self.W
        t = ids.shape[1]
        NH, NKV, HD, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
        freqs = torch.outer(torch.arange(self.past, self.past + t).float(), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        x = W["model.embed_tokens.weight"][ids]
        for l in range(c["num_hidden_layers"]):
            p = f"model.layers.{l}."
            h = rmsnorm(x, W[p + "input_layernorm.weight"], eps)
            q = self.lin(h, p + "self_attn.q_proj").view(1, t, NH, HD)
            k = self.lin(h, p + "self_attn.k_proj").view(1, t, NKV, HD)
            v = self.lin(h, p + "self_attn.v_proj").view(1, t, NKV, HD)
            if c["model_type"] != 0:
                q = rmsnorm(q, W[p + "self_attn.q_norm.weight"], eps)
                k = rmsnorm(k, W[p + "self_attn.k_norm.weight"], eps)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if self.cache[l] is not None:
                k = torch.cat((self.cache[l][0], k), dim=2)
                v = torch.cat((self.cache[l][1], v), dim=2)
            self.cache[l] = (k, v)
            k = k.repeat_interleave(NH // NKV, dim=1)
            v = v.repeat_interleave(NH // NKV, dim=1)
            s = q @ k.transpose(-1, -2) / HD ** 0.5
            T = k.shape[2]
            mask = torch.ones(t, T, dtype=torch.bool).triu(T - t + 1)
            s = s.masked_fill(mask, float("-inf"))
            a = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(1, t, NH * HD)
            x = x + self.lin(a, p + "self_attn.o_proj")
            h = rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps)
            if p + "mlp.gate.weight" in W:   # Qwen3MoeSparseMoeBlock
                E, K = c["num_experts"], c["num_experts_per_tok"]
                hs = h.reshape(-1, h.shape[-1])
                rw = torch.softmax(hs @ W[p + "mlp.gate.weight"].T, dim=1, dtype=torch.float)
                rw, sel = torch.topk(rw, K, dim=-1)
                if c["norm_topk_prob"]:
                    rw = rw / rw.sum(dim=-1, keepdim=True)
                out = torch.zeros_like(hs)
                for e in range(E):
                    tok, slot = torch.where(sel == e)
                    if tok.numel() == 0:
                        continue
                    ep = p + f"mlp.experts.{e}."
                    cur = hs[tok]
                    y = (torch.nn.functional.silu(cur @ W[ep + "gate_proj.weight"].T) *
                         (cur @ W[ep + "up_proj.weight"].T)) @ W[ep + "down_proj.weight"].T
                    out = out.index_add(0, tok, y * rw[tok, slot, None])
                mlp = out.view(x.shape)
            else:
                mlp = self.lin(torch.nn.functional.silu(self.lin(h, p + "mlp.gate_proj")) * self.lin(h, p + "mlp.up_proj"),
                               p + "mlp.down_proj")
            x = x + mlp
        self.past += t
        x = rmsnorm(x[:, -1], W["model.norm.weight"], eps)
        head = W["lm_head.weight"] if "lm_head.weight" in W else W["model.embed_tokens.weight"]
        return x @ head.T


def byte_level_text(d, ids):
    """The text of byte-level BPE tokens: GPT-2's table maps each byte to a printable character
    (the printable Latin-1 ones to themselves, the others to 256 + n in byte order)."""
    import json
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    to_byte, n = {chr(b): b for b in keep}, 0
    for b in range(256):
        if b not in keep:
            to_byte[chr(256 + n)] = b
            n += 1
    t = json.load(open(os.path.join(d, "tokenizer.json")))
    added = {a["id"] for a in t.get("added_tokens", [])}
    by_id = {i: s for s, i in t["model"]["vocab"].items()}
    return b"".join(bytes(to_byte[ch] for ch in by_id[i]) for i in ids if i in by_id and i not in added)


def generate(cfg, W, prompt, max_new, eot=EOT):
    """Greedy: (new tokens, seconds of the steps after the first). prompt: its ids after the
    end-of-document token eot."""
    d = Decoder(cfg, W)
    ids = torch.tensor([[eot] + list(prompt)], dtype=torch.int64)
    out = []
    t0 = None
    with torch.no_grad():
        logits = d.step(ids)
        for i in range(max_new):
            nxt = int(torch.argmax(logits[0]))
            if nxt == eot:
                break
            out.append(nxt)
            if i + 1 == max_new or d.past >= cfg["max_position_embeddings"]:
                break
            if t0 is None:
                t0 = time.perf_counter()
            logits = d.step(torch.tensor([[nxt]], dtype=torch.int64))
    return out, (time.perf_counter() - t0) if t0 else 0.0


def main():
    d, max_new, prompts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg, W = hf_reader.load(d)
    import json
    cfg["max_position_embeddings"] = json.load(open(os.path.join(d, "config.json")))["max_position_embeddings"]
    if prompts[:1] == ["--ids"]:
        eos, ids = int(prompts[1]), [int(i) for i in prompts[2].split(",")]
        toks, _ = generate(cfg, W, ids[1:], max_new, eot=eos)
        sys.stdout.buffer.write(byte_level_text(d, toks) + b"\n")
        print(f"generate_ref: {len(toks)} tokens: {toks}", file=sys.stderr)
        return
    for p in prompts:
        toks, secs = generate(cfg, W, p.encode(), max_new)
        sys.stdout.buffer.write(bytes(toks) + b"\n")
        rate = (len(toks) - 1) / secs if secs > 0 else 0.0
        print(f"generate_ref: {len(toks)} tokens, {rate:.1f} tokens/s after the first", file=sys.stderr)


if __name__ == "__main__":
    main()
