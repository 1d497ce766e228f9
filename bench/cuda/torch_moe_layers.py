"""The two PyTorch MoE layers `moekit bench --device cuda` is compared with, timed the same way.

  loop:       a loop over the experts, as most reference implementations write it (index the
              tokens routed to each expert, two matmuls, index_add back); it syncs with the host
              once per expert, so it runs eagerly.
  grouped_mm: the layer a PyTorch user writes today: top-k, a device-side sort of the (token,
              slot) pairs by expert, torch._grouped_mm for GEMM1 and GEMM2 with the gated SiLU
              between, the router weight applied and the top-k summed back in token order; no
              host sync, so batches of T <= 64 are replayed from a CUDA graph as moekit's are.
              fp8: torch._scaled_grouped_mm with e4m3 weights and activations, row-wise scales
              (per output channel, per token): it takes no 128x128 block scales, so it is the
              nearest fp8 layer PyTorch offers, not DeepSeek's block format.

Same cases, shapes and distributions as moekit's (weights of standard deviation 1/sqrt(fan-in),
unit-normal hidden states, fresh unit-normal router logits for every repeat), an L2 flush before
every repeat, CUDA events around each forward, median of the timed repeats after warm-up.
Writes JSON: python3 torch_moe_layers.py OUT.json [--cases dsv3,qwen3,mixtral]
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F

CASES = [  # name, E, k, H, I, token counts, formats: moekit's GPU cases (src/bench/cases.cpp)
    ("dsv3-decode", 256, 8, 7168, 2048, [1, 8, 64], ["fp8-block", "bf16"]),
    ("dsv3-prefill", 256, 8, 7168, 2048, [512, 4096, 16384], ["fp8-block", "bf16"]),
    ("qwen3-30b-a3b", 128, 8, 2048, 768, [1, 8, 64, 512, 4096], ["bf16", "fp8-block"]),
    ("mixtral-8x7b", 8, 2, 4096, 14336, [1, 64, 1024], ["bf16"]),
]
WARMUP, REPEATS, GRAPH_MAX_TOKENS = 2, 10, 64
FP8 = torch.float8_e4m3fn


def route(logits, k):
    w, ids = torch.topk(torch.softmax(logits.float(), dim=-1), k, dim=-1)
    return w / w.sum(dim=-1, keepdim=True), ids


def loop_layer(x, logits, w13, w2, k):
    T, H = x.shape
    E, two_i, _ = w13.shape
    inter = two_i // 2
    w, ids = route(logits, k)
    out = torch.zeros(T, H, device=x.device, dtype=torch.float32)
    for e in range(E):
        tok, slot = torch.where(ids == e)
        if tok.numel() == 0:
            continue
        h = x[tok] @ w13[e].t()
        a = F.silu(h[:, :inter]) * h[:, inter:]
        out.index_add_(0, tok, (a @ w2[e].t()).float() * w[tok, slot, None])
    return out.to(torch.bfloat16)


def sort_by_expert(logits, k, E):
    w, ids = route(logits, k)
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    # bincount would sync with the host to size its output; a scatter into E counters does not.
    counts = torch.zeros(E, dtype=torch.int32, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0).to(torch.int32)
    return w.flatten()[order], order, offs


def combine(y, weight, order, T, k, H):
    out = torch.empty(T * k, H, device=y.device, dtype=torch.float32)
    out[order] = y.float() * weight[:, None]
    return out.view(T, k, H).sum(dim=1).to(torch.bfloat16)


def grouped_layer(x, logits, w13, w2, k):
    T, H = x.shape
    E, two_i, _ = w13.shape
    inter = two_i // 2
    weight, order, offs = sort_by_expert(logits, k, E)
    rows = x[order // k]
    h = torch._grouped_mm(rows, w13.transpose(-2, -1), offs=offs)
    a = F.silu(h[:, :inter]) * h[:, inter:]
    y = torch._grouped_mm(a, w2.transpose(-2, -1), offs=offs)
    return combine(y, weight, order, T, k, H)


def quantize_rows(t):
    scale = t.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / 448.0
    return (t.float() / scale).to(FP8), scale.squeeze(-1)


def quantize_experts(w):
    """e4m3 weights with one scale per expert and output row, an expert at a time (the whole
    stack in f32 would not fit beside the bf16 one)."""
    q = torch.empty(w.shape, dtype=FP8, device=w.device)
    s = torch.empty(w.shape[:2], dtype=torch.float32, device=w.device)
    for e in range(w.shape[0]):
        q[e], s[e] = quantize_rows(w[e])
    return q, s


def scaled_grouped_layer(x, logits, q13, s13, q2, s2, k):
    T, H = x.shape
    E, two_i, _ = q13.shape
    inter = two_i // 2
    weight, order, offs = sort_by_expert(logits, k, E)
    rows, row_scale = quantize_rows(x[order // k])
    h = torch._scaled_grouped_mm(rows, q13.transpose(-2, -1), row_scale, s13, offs=offs,
                                 out_dtype=torch.bfloat16)
    a, a_scale = quantize_rows(F.silu(h[:, :inter]) * h[:, inter:])
    y = torch._scaled_grouped_mm(a, q2.transpose(-2, -1), a_scale, s2, offs=offs,
                                 out_dtype=torch.bfloat16)
    return combine(y, weight, order, T, k, H)


def time_layer(forward, x, logits_list, graphed, flush):
    """CUDA events around each forward, after an L2 flush, the repeat's logits copied in first."""
    logits = logits_list[0].clone()
    if graphed:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                forward(x, logits)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward(x, logits)
        run = graph.replay
    else:
        run = lambda: forward(x, logits)  # noqa: E731
    times = []
    for r, step_logits in enumerate(logits_list):
        logits.copy_(step_logits)
        flush.fill_(r & 0xFF)
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        stop.record()
        stop.synchronize()
        if r >= WARMUP:
            times.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(times)


def main():
    out_path = sys.argv[1]
    wanted = None
    if len(sys.argv) > 3 and sys.argv[2] == "--cases":
        wanted = set(sys.argv[3].split(","))
    torch.manual_seed(2024)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(max(4 * l2, 64 << 20), dtype=torch.uint8, device="cuda")
    results = []
    for name, E, k, H, inter, tokens, formats in CASES:
        if wanted and not any(name.startswith(w) for w in wanted):
            continue
        w13 = torch.randn(E, 2 * inter, H, device="cuda", dtype=torch.bfloat16) / H ** 0.5
        w2 = torch.randn(E, H, inter, device="cuda", dtype=torch.bfloat16) / inter ** 0.5
        for fmt in formats:
            if fmt == "bf16":
                layers = {"loop": lambda x, g: loop_layer(x, g, w13, w2, k),
                          "grouped_mm": lambda x, g: grouped_layer(x, g, w13, w2, k)}
            else:
                q13, s13 = quantize_experts(w13)
                q2, s2 = quantize_experts(w2)
                layers = {"grouped_mm": lambda x, g: scaled_grouped_layer(x, g, q13, s13, q2, s2, k)}
            for T in tokens:
                x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
                logits_list = [torch.randn(T, E, device="cuda") for _ in range(WARMUP + REPEATS)]
                for layer, forward in layers.items():
                    row = {"case": name, "weights": fmt, "tokens": T, "layer": layer,
                           "graph": layer != "loop" and T <= GRAPH_MAX_TOKENS}
                    if fmt != "bf16":
                        row["note"] = "torch._scaled_grouped_mm, row-wise fp8 scales"
                    try:
                        row["median_us"] = time_layer(forward, x, logits_list, row["graph"], flush)
                    except Exception as e:  # report and go on: one failing layer is a result
                        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                    results.append(row)
                    shown = f"{row['median_us']:.1f} us" if "median_us" in row else row["error"]
                    print(f"torch {layer:<10} {name} {fmt} T={T}: {shown}", flush=True)
            if fmt != "bf16":
                del q13, s13, q2, s2
        del w13, w2
        torch.cuda.empty_cache()
    json.dump({"torch": torch.__version__, "results": results}, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
