"""torch._grouped_mm for the expert GEMMs of gemm_bench's cases, timed the same way (bf16).

GEMM1 (x @ w13^T per expert), the gated SiLU, GEMM2 (act @ w2^T per expert) with the router
weight: the layer a PyTorch user writes today, given rows already grouped per expert. CUDA
graphs, routings rotated, median of 30 after 5 warm-ups.
"""
import statistics
import torch

BW, PEAK = 4.44e12, 989e12


def case(name, E, k, H, I, T, w13, w2):
    rows = T * k
    graphs, hits, keep = [], [], []  # keep: what each graph reads must outlive it
    x = torch.randn(rows, H, device="cuda", dtype=torch.bfloat16)
    route = torch.rand(rows, 1, device="cuda")
    for r in range(8):
        ids = torch.rand(T, E, device="cuda").topk(k, dim=1).indices.flatten()
        counts = torch.bincount(ids, minlength=E)
        hits.append(int((counts > 0).sum()))
        offs = torch.cumsum(counts, 0).to(torch.int32)
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):  # warm up outside the capture
                h = torch._grouped_mm(x, w13.transpose(-2, -1), offs=offs)
                a = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
                o = torch._grouped_mm(a, w2.transpose(-2, -1), offs=offs).float() * route
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            h = torch._grouped_mm(x, w13.transpose(-2, -1), offs=offs)
            a = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
            o = torch._grouped_mm(a, w2.transpose(-2, -1), offs=offs).float() * route
        graphs.append(g)
        keep.append((offs, h, a, o))
    times = []
    for it in range(35):
        r = it % 8
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graphs[r].replay()
        end.record()
        end.synchronize()
        if it >= 5:
            times.append(start.elapsed_time(end) * 1e3)
    us = statistics.median(times)
    floor = max(statistics.mean(hits) * 3 * I * H * 2 / BW, 2 * rows * 3 * I * H / PEAK) * 1e6
    print(f"| torch._grouped_mm {name} bf16 T={T} | {us:.1f} us | floor {floor:.1f} us | "
          f"{100 * floor / us:.1f}% |", flush=True)


for name, E, k, H, I, ts in [("DeepSeek-V3", 256, 8, 7168, 2048, [1, 8, 64, 4096]),
                             ("Qwen3-30B-A3B", 128, 8, 2048, 768, [1, 64, 512])]:
    w13 = torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16) / H ** 0.5
    w2 = torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16) / I ** 0.5
    for T in ts:
        try:
            case(name, E, k, H, I, T, w13, w2)
        except Exception as e:  # report and go on: the comparison is optional
            print(f"| torch._grouped_mm {name} T={T} | failed: {e} |", flush=True)
    del w13, w2
    torch.cuda.empty_cache()
