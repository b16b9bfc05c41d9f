#!/usr/bin/env python3
"""PyTorch eager on the CPU, the baseline of the CPU-backend speed target (docs/benchmarks.md).

Trains the same-shape decoder as
  fp8 train --text FILE --hidden 256 --layers 4 --heads 8 --ffn 1024 --seq 64 --batch 16
(GPT-2 style: learned positions, pre-LayerNorm, GELU-tanh MLP, untied head, AdamW with decay on
matrices only, global-norm clipping at 1.0, character-level vocabulary of the file) and prints
tokens/s for fp32 and bf16 autocast, timed after warm-up steps.
Usage: python3 benches/pytorch_cpu_baseline.py FILE [--threads 2] [--steps 30] [--warmup 5]
Needs torch (not used by CI).
"""
import argparse, math, time
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Decoder(nn.Module):
    def __init__(self, vocab, seq, d, layers, heads, ffn):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, ffn) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def run(text, args, autocast):
    torch.manual_seed(1)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    model = Decoder(len(chars), args.seq, 256, 4, 8, 1024)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}], lr=1e-3)
    gen = torch.Generator().manual_seed(2)
    tokens, elapsed = 0, 0.0
    for step in range(args.warmup + args.steps):
        starts = torch.randint(0, len(data) - args.seq - 1, (args.batch,), generator=gen)
        x = torch.stack([data[s:s + args.seq] for s in starts])
        y = torch.stack([data[s + 1:s + args.seq + 1] for s in starts])
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= args.warmup:
            elapsed += time.perf_counter() - t0
            tokens += args.batch * args.seq
    return tokens / elapsed, loss.item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("text")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    text = open(args.text, encoding="utf-8").read()
    for name, autocast in [("fp32", False), ("bf16-autocast", True)]:
        tps, loss = run(text, args, autocast)
        print(f"pytorch {torch.__version__} {name}: {tps:.0f} tokens/s ({args.threads} threads, last loss {loss:.3f})")


if __name__ == "__main__":
    main()
