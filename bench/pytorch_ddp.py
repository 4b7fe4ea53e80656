#!/usr/bin/env python3
"""PyTorch DistributedDataParallel on N CPU processes (gloo): the reference for
chapter 1's DDP row in make bench.

The model, initialisation and AdamW are bench/pytorch_gpt2.py's. Each process computes
on one thread (torch's pool and Debian's OpenBLAS both set to one) with batch / N
sequences, and DDP all-reduces the gradients in its default buckets (25 MiB, the first
1 MiB) over gloo, overlapped with the backward. Rank 0 times the steps between barriers.

    /usr/bin/python3 bench/pytorch_ddp.py --ranks 2 --layers 4 --heads 4 --dim 256 \\
        --ctx 64 --batch 8 --vocab 256 --steps 20          (bench256 on two processes)

Prints one table row and a RESULT line; without PyTorch it prints "SKIP: <why>".
"""
import argparse
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_gpt2 import add_model_arguments, bench_adamw, build_model, one_cpu_thread  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch", type=int, default=8, help="global batch in sequences")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    add_model_arguments(p, layers=4, heads=4, dim=256, ctx=64, vocab=256)   # bench256
    args = p.parse_args()
    args.sdpa = False   # build_model's naive attention, as ours
    if args.ranks < 1 or args.batch % args.ranks:
        p.error(f"--batch {args.batch} must split evenly over --ranks {args.ranks}")
    return args


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, args, port, results):
    import torch
    import torch.distributed as dist
    one_cpu_thread(torch)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.ranks)
    torch.manual_seed(args.seed)   # the same initial model on every rank, as DDP checks
    net = build_model(torch, args)
    # the only buffers are the causal masks: constants, of type bool, which gloo cannot
    # broadcast, so DDP is told to leave them alone
    DDP = torch.nn.parallel.DistributedDataParallel
    DDP._set_params_and_buffers_to_ignore_for_model(net, [n for n, _ in net.named_buffers()])
    model = DDP(net, broadcast_buffers=False)
    opt = bench_adamw(torch, model.parameters())
    local = args.batch // args.ranks
    data = torch.randint(0, args.vocab, (2, args.batch, args.ctx), dtype=torch.long)
    tokens = data[0, rank * local:(rank + 1) * local]
    targets = data[1, rank * local:(rank + 1) * local]

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(tokens, targets)
        loss.backward()   # the all-reduce buckets run during this
        opt.step()
        return loss

    for _ in range(max(args.warmup, 1)):
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    dist.barrier()
    ms = 1e3 * (time.perf_counter() - start) / args.steps
    if rank == 0:
        results.put((ms, loss.item()))
    dist.destroy_process_group()


def main():
    args = parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"SKIP: no PyTorch ({e})")
        return 0
    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(args, free_port(), results), nprocs=args.ranks, join=True)
    ms, loss = results.get()
    tokens_per_s = args.batch * args.ctx / (ms * 1e-3)
    print(f"PyTorch {torch.__version__} DDP (gloo) on {args.ranks} CPU processes, one thread"
          f" each: layers {args.layers}, heads {args.heads}, dim {args.dim}, ctx {args.ctx},"
          f" vocab {args.vocab}; global batch {args.batch} x {args.ctx} tokens;"
          f" {args.warmup} warm-up + {args.steps} timed steps")
    print(f"{'ranks':>5} {'ms/step':>10} {'tokens/s':>10} {'last loss':>10}")
    print(f"{args.ranks:>5} {ms:>10.1f} {tokens_per_s:>10.0f} {loss:>10.4f}")
    print(f"RESULT impl=pytorch-ddp ranks={args.ranks} ms={ms:.3f}"
          f" tokens_per_s={tokens_per_s:.0f} loss={loss:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
