#!/usr/bin/env python3
"""The 12 GEMMs of one layer step of the issue-20 model timed alone with PyTorch (MKL), in the
layouts nn.Linear's forward and autograd use: forward F.linear(x, w, b) (x @ w.t() + b), dgrad
dy @ w, wgrad dy.t() @ x (and, as a second wgrad column, dw.addmm_(dy.t(), x): the product summed
into an existing gradient, which is what `cargo bench --bench layer_gemms` times for ours).
Usage: python3 benches/layer_gemms_torch.py [--threads 2] [--repeat 50]
Needs torch (not used by CI). Prints median wall and process CPU ms and the best wall ms per GEMM.
"""
import argparse, time
import torch
import torch.nn.functional as F


def median_ms(repeat, f):
    """Median (wall, process CPU) ms and the best wall ms of `repeat` calls after 3 warm-up calls."""
    for _ in range(3):
        f()
    wall, cpu = [], []
    for _ in range(repeat):
        start, cpu0 = time.perf_counter(), time.process_time()
        f()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - cpu0)
    wall.sort()
    cpu.sort()
    return wall[repeat // 2] * 1e3, cpu[repeat // 2] * 1e3, wall[0] * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokens = 1024
    linears = [("qkv", 256, 768), ("out-proj", 256, 256), ("fc1", 256, 1024), ("fc2", 1024, 256)]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {args.repeat} timed calls, medians")
    print("| GEMM | M x N x K | torch call | wall ms | GFLOP/s | best wall ms | CPU ms |")
    print("|---|---|---|---:|---:|---:|---:|")
    total, total_best, total_cpu = 0.0, 0.0, 0.0
    for label in ["fwd", "dgrad", "wgrad", "wgrad+="]:
        for name, inp, out in linears:
            x, w = torch.rand(tokens, inp) - 0.5, torch.rand(out, inp) - 0.5
            dy, b = torch.rand(tokens, out) - 0.5, torch.rand(out) - 0.5
            dw = torch.zeros(out, inp)
            if label == "fwd":
                m, n, k, call, f = tokens, out, inp, "F.linear(x, w, b)", lambda: F.linear(x, w, b)
            elif label == "dgrad":
                m, n, k, call, f = tokens, inp, out, "dy @ w", lambda: dy @ w
            elif label == "wgrad":
                m, n, k, call, f = out, inp, tokens, "dy.t() @ x", lambda: dy.t() @ x
            else:
                m, n, k, call, f = out, inp, tokens, "dw.addmm_(dy.t(), x)", lambda: dw.addmm_(dy.t(), x)
            ms, cpu, best = median_ms(args.repeat, f)
            if label != "wgrad+=":
                total += ms
                total_best += best
                total_cpu += cpu
            print(f"| {name} {label} | {m} x {n} x {k} | {call} | {ms:.3f} | {2 * m * n * k / ms / 1e6:.0f} | {best:.3f} | {cpu:.3f} |")
    print(f"| sum of 12 (fwd, dgrad, wgrad) | | | {total:.3f} | | {total_best:.3f} | {total_cpu:.3f} |")


if __name__ == "__main__":
    main()
