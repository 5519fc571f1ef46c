#!/usr/bin/env python3
"""GPT-2 124M trained in PyTorch: the reference gpu_train_bench is compared against in the same run.

The same model and settings as `gpu_train_bench --model gpt2`: 12 layers, hidden 768, 12 heads,
seq 1024, vocab 50257, tied LM head, GELU (tanh), LayerNorm with bias; synthetic tokens; bf16
autocast over fp32 parameters (fp32 master weights, like ours), fused AdamW, gradient clipping at
1.0, F.scaled_dot_product_attention (flash attention), torch.compile. Timed with CUDA events after
warm-up (compilation happens there). Prints the same table row format as gpu_train_bench.

  python3 bench/torch_gpt2.py [--micro-batch 16] [--steps 10] [--warmup 5] [--no-compile]

Model FLOPs per token (for MFU) count what ours counts (Transformer::forward_flops_per_token):
2 x the matmul parameters (qkv, proj, fc, fc proj, LM head) plus attention scores and values
counted as non-causal (PaLM's convention, 4 T C per layer), x 3 for forward and backward.
"""
import argparse
import math
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # the benchmark script checks for torch first; this is for direct calls
    print("torch_gpt2: PyTorch is not installed here - skipped")
    sys.exit(77)

LAYERS, HIDDEN, HEADS, SEQ, VOCAB = 12, 768, 12, 1024, 50257


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.ln2 = nn.LayerNorm(HIDDEN)
        self.fc = nn.Linear(HIDDEN, 4 * HIDDEN)
        self.fc_proj = nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, HIDDEN)
        self.wpe = nn.Embedding(SEQ, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(HIDDEN)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(t, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
        return F.cross_entropy(logits.float().view(-1, VOCAB), targets.view(-1))


def forward_flops_per_token():
    per_layer = 2 * (HIDDEN * 3 * HIDDEN + HIDDEN * HIDDEN + 2 * HIDDEN * 4 * HIDDEN)
    attention = 4 * SEQ * HIDDEN  # QK^T and PV, non-causal as ours counts them (PaLM)
    return LAYERS * (per_layer + attention) + 2 * HIDDEN * VOCAB


def datasheet_bf16_flops(name):
    if "H200" in name or "H100 80GB HBM3" in name or "H100 SXM" in name:
        return 989.4e12
    if "H100" in name:
        return 756.0e12
    if "A100" in name:
        return 312.0e12
    return 0.0


def measure_gemm_flops(size):
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b.T
    times = []
    for _ in range(7):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            a @ b.T
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 3)
    times.sort()
    return 2.0 * size**3 / (times[len(times) // 2] * 1e-3)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--gemm-size", type=int, default=8192)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("torch_gpt2: no GPU here - skipped")
        return 77
    torch.manual_seed(1234)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    gpu = torch.cuda.get_device_name(0)
    model = GPT2().cuda()
    params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_model = model if args.no_compile else torch.compile(model)
    generator = torch.Generator(device="cuda").manual_seed(42)
    b = args.micro_batch

    def step():
        data = torch.randint(0, VOCAB, (b, SEQ + 1), device="cuda", generator=generator)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = step_model(data[:, :-1], data[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    print(f"torch_gpt2: GPT-2 124M on {gpu}, torch {torch.__version__}, "
          f"{'torch.compile' if not args.no_compile else 'eager'}, micro-batch {b} "
          f"({b * SEQ} tokens/step), {args.warmup} warm-up + {args.steps} timed steps", flush=True)
    compile_start = time.time()
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    print(f"torch_gpt2: warm-up (compilation included) {time.time() - compile_start:.1f} s",
          flush=True)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.steps):
        loss = step()
    stop.record()
    stop.synchronize()
    ms = start.elapsed_time(stop) / args.steps
    tokens_per_s = 1000.0 * b * SEQ / ms
    model_flops = 3.0 * forward_flops_per_token() * tokens_per_s
    gemm = measure_gemm_flops(args.gemm_size)
    peak = datasheet_bf16_flops(gpu)
    peak_text = f"{peak / 1e12:.0f} TFLOP/s" if peak else "unknown"
    mfu_peak = f"{100.0 * model_flops / peak:.1f}%" if peak else "n/a"
    print(f"\n| impl | model | params | micro-batch x seq | tokens/s | ms/step | model TFLOP/s | "
          f"MFU (datasheet {peak_text}) | MFU (measured GEMM {gemm / 1e12:.0f} TFLOP/s) | "
          f"last loss |\n|---|---|---|---|---|---|---|---|---|---|")
    print(f"| pytorch | gpt2 | {params / 1e6:.1f}M | {b} x {SEQ} | {tokens_per_s:.0f} | {ms:.2f} | "
          f"{model_flops / 1e12:.1f} | {mfu_peak} | {100.0 * model_flops / gemm:.1f}% | "
          f"{loss.item():.4f} |")
    print(f"(GEMM ceiling: {args.gemm_size}^3 bf16 torch.matmul on random data)")
    if not math.isfinite(loss.item()):
        print("torch_gpt2: the loss is not finite", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
