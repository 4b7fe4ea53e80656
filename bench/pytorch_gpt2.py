#!/usr/bin/env python3
"""GPT-2 small trained in PyTorch eager on one GPU: the reference for bench/bench_gpu.c
(--device cpu: any shape on one CPU thread, the reference for bench/bench_model.c).

The same model as common/model.c: token + position embeddings, pre-LayerNorm blocks of
causal multi-head attention (the T x T scores materialised, softmax, then V: the
algorithm of our attention kernels) and a GELU (tanh) MLP, a final LayerNorm, an LM head
tied to the token embedding, softmax cross-entropy, and AdamW (learning rate 1e-3 with no
warm-up, betas 0.9/0.95, eps 1e-8, weight decay 0.01 on every tensor: bench_gpu's
settings). Random tokens, copied to the GPU every
step as a data loader would; untimed warm-up steps, then timed steps measured with CUDA
events. FLOPs per step as gpt_flops_per_step: 6 x (parameters - wpe) x tokens + 12 L T C
x tokens for attention.

    python3 bench/pytorch_gpt2.py [--batch 16] [--steps 10] [--warmup 3]
                                  [--precision fp32|tf32|both] [--sdpa]
    /usr/bin/python3 bench/pytorch_gpt2.py --device cpu --layers 4 --heads 4 --dim 256 \
        --ctx 64 --batch 8 --vocab 256 --steps 20     (bench256, one thread)
        [--autocast bf16]

--autocast bf16: PyTorch's automatic mixed precision, the reference for our
--precision bf16: torch.autocast(dtype=torch.bfloat16) around the forward and the loss
(matmuls in bf16, LayerNorm, softmax and the loss in fp32 by autocast's own lists), the
backward outside it, the weights and AdamW in fp32 as AMP keeps them (no loss scale:
bf16 has fp32's range). Its row is named "autocast-bf16".

On the CPU, Debian's torch runs its GEMMs in Debian's OpenBLAS, whose thread pool
torch.set_num_threads does not reach: openblas_set_num_threads(1) is called through
ctypes as well, so that the figure is one thread's, like ours.

--sdpa uses torch's fused scaled_dot_product_attention instead (flash/memory-efficient
kernels: not our algorithm, shown for reference). Prints a table and one RESULT line per
precision, like bench_gpu; without PyTorch or a GPU it prints "SKIP: <why>" and exits 0.
"""
import argparse
import math
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--precision", choices=["fp32", "tf32", "both"], default="both")
    p.add_argument("--sdpa", action="store_true", help="fused attention (reference)")
    p.add_argument("--autocast", choices=["bf16"], default=None,
                   help="torch.autocast bf16 around forward and loss, fp32 weights")
    add_model_arguments(p, layers=12, heads=12, dim=768, ctx=1024, vocab=50304)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    return p.parse_args()


def add_model_arguments(p, layers, heads, dim, ctx, vocab):
    """The model's shape and seed, with these defaults (shared with pytorch_ddp.py)."""
    p.add_argument("--layers", type=int, default=layers)
    p.add_argument("--heads", type=int, default=heads)
    p.add_argument("--dim", type=int, default=dim)
    p.add_argument("--ctx", type=int, default=ctx)
    p.add_argument("--vocab", type=int, default=vocab)
    p.add_argument("--seed", type=int, default=1234)


def bench_adamw(torch, params):
    """bench_gpu's AdamW: run_config_default() (lr 1e-3) with warmup_steps = 0."""
    return torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)


def one_cpu_thread(torch):
    """torch's own pool and OpenBLAS's, both to one thread."""
    import ctypes
    import ctypes.util
    torch.set_num_threads(1)
    for name in ("openblas", "openblas64", "blas"):
        path = ctypes.util.find_library(name)
        if not path:
            continue
        lib = ctypes.CDLL(path)
        if hasattr(lib, "openblas_set_num_threads"):
            lib.openblas_set_num_threads(1)
            return path
    return "no OpenBLAS found: its threads are not limited"


def build_model(torch, args):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            C = args.dim
            self.ln1 = nn.LayerNorm(C, eps=1e-5)
            self.qkv = nn.Linear(C, 3 * C)
            self.proj = nn.Linear(C, C)
            self.ln2 = nn.LayerNorm(C, eps=1e-5)
            self.fc = nn.Linear(C, 4 * C)
            self.fc2 = nn.Linear(4 * C, C)
            mask = torch.tril(torch.ones(args.ctx, args.ctx, dtype=torch.bool))
            self.register_buffer("mask", mask, persistent=False)

        def attention(self, x):
            B, T, C = x.shape
            hs = C // args.heads
            q, k, v = self.qkv(x).split(C, dim=2)
            q, k, v = (t.view(B, T, args.heads, hs).transpose(1, 2) for t in (q, k, v))
            if args.sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
                att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
                att = F.softmax(att, dim=-1)
                y = att @ v
            return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))

        def forward(self, x):
            x = x + self.attention(self.ln1(x))
            return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(args.vocab, args.dim)
            self.wpe = nn.Embedding(args.ctx, args.dim)
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.lnf = nn.LayerNorm(args.dim, eps=1e-5)
            # our initialisation: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)),
            # biases 0, LayerNorms 1 and 0
            residual_std = 0.02 / math.sqrt(2 * args.layers)
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif ".ln" in name or name.startswith("lnf"):
                    nn.init.ones_(p)
                elif name.endswith("proj.weight") or name.endswith("fc2.weight"):
                    nn.init.normal_(p, 0.0, residual_std)
                else:
                    nn.init.normal_(p, 0.0, 0.02)

        def forward(self, tokens, targets):
            T = tokens.shape[1]
            pos = torch.arange(T, device=tokens.device)
            x = self.wte(tokens) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            logits = F.linear(self.lnf(x), self.wte.weight)   # tied LM head
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return GPT()


def flops_per_step(model, args):
    params = sum(p.numel() for p in model.parameters())   # the tied weight once
    tokens = args.batch * args.ctx
    non_embedding = params - args.ctx * args.dim           # as gpt_flops_per_step
    attention = 12.0 * args.layers * args.ctx * args.dim
    return tokens * (6.0 * non_embedding + attention), params


def run(torch, args, tf32):
    # "high" lets fp32 matmuls use TF32 tensor cores, "highest" keeps full fp32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    on_gpu = args.device == "cuda"
    model = build_model(torch, args).to(device)
    opt = bench_adamw(torch, model.parameters())
    n = args.batch * args.ctx
    host = torch.randint(0, args.vocab, (2, args.batch, args.ctx), dtype=torch.long)
    if on_gpu:
        host = host.pin_memory()

    def step():
        tokens = host[0].to(device, non_blocking=True)
        targets = host[1].to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        # AMP: forward and loss under autocast, the backward outside it
        with torch.autocast(device_type=args.device, dtype=torch.bfloat16,
                            enabled=args.autocast == "bf16"):
            loss = model(tokens, targets)
        loss.backward()
        opt.step()
        return loss

    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    first = step().item()
    for _ in range(args.warmup - 1):
        step()
    if on_gpu:
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
    wall = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    if on_gpu:
        stop.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(stop) / args.steps
    else:
        ms = 1e3 * (time.perf_counter() - wall) / args.steps
    flops, params = flops_per_step(model, args)
    result = {"ms": ms, "tokens_per_s": n / (ms * 1e-3), "tflops": flops / (ms * 1e-3) / 1e12,
              "first": first, "last": loss.item(), "params": params,
              "peak": torch.cuda.max_memory_allocated() if on_gpu else 0}
    del model, opt
    if on_gpu:
        torch.cuda.empty_cache()
    return result


def main():
    args = parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"SKIP: no PyTorch ({e})")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"SKIP: PyTorch {torch.__version__} sees no GPU"
              f" (built for CUDA {torch.version.cuda})")
        return 0
    args.warmup = max(args.warmup, 1)
    impl = "pytorch-sdpa" if args.sdpa else "pytorch"
    if args.device == "cpu" or args.autocast:
        args.precision = "fp32"   # TF32 is a GPU format; autocast replaces it
    if args.device == "cpu":
        where = f"one CPU thread ({one_cpu_thread(torch)})"
    else:
        where = torch.cuda.get_device_name(0)
    print(f"PyTorch {torch.__version__} eager ({'fused sdpa' if args.sdpa else 'naive'}"
          f" attention) on {where}: layers {args.layers}, heads"
          f" {args.heads}, dim {args.dim}, ctx {args.ctx}, vocab {args.vocab}; batch"
          f" {args.batch} x {args.ctx} tokens; {args.warmup} warm-up + {args.steps} timed steps")
    print(f"{'precision':<14} {'ms/step':>10} {'tokens/s':>12} {'TFLOP/s':>9}"
          f" {'loss first -> last':>22} {'device mem':>12}")
    status = 0
    for tf32 in (False, True):
        if (args.precision == "fp32" and tf32) or (args.precision == "tf32" and not tf32):
            continue
        r = run(torch, args, tf32)
        name = "tf32" if tf32 else "fp32"
        if args.autocast:
            name = "autocast-" + args.autocast
        print(f"{name:<14} {r['ms']:>10.1f} {r['tokens_per_s']:>12.0f} {r['tflops']:>9.2f}"
              f" {r['first']:>10.4f} -> {r['last']:<9.4f} {r['peak'] / 1e9:>9.2f} GB")
        print(f"RESULT impl={impl} precision={name} batch={args.batch} ms={r['ms']:.3f}"
              f" tokens_per_s={r['tokens_per_s']:.0f} tflops={r['tflops']:.3f}"
              f" loss={r['last']:.4f}", flush=True)
        if not math.isfinite(r["first"]) or abs(r["first"] - math.log(args.vocab)) > 1.0:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
