#!/usr/bin/env python3
"""Times a plain PyTorch MoE layer on the cases of a `moekit bench --json` file.

Every case is timed the way moekit's bench times it: the whole layer (router logits and hidden
states in, combined output out), fresh pre-generated router logits for each run, caches flushed
between runs, warm-up first, then median, min and max of as many runs as moekit made. PyTorch has
no CPU kernels for moekit's quantised formats, so every case runs with fp32 weights and
activations and again with bf16 weights and activations, on the same shape. Prints one table with
moekit's figures next to PyTorch's and writes both to a combined JSON file.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

# moekit's bench checks bf16 outputs to this relative L2 error; fp32 against float64 is far tighter.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
VARIANTS = {"fp32": torch.float32, "bf16": torch.bfloat16}
CHECKED_TOKENS = 4
# moekit's skewed routing: a few hot experts per run get this added to their logits.
SKEW_BOOST = 3.0


def moe_layer(x, logits, w13, w2, top_k):
    """Routing to output: softmax, top-k, renormalised weights, one pass per expert hit."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    weights /= weights.sum(dim=-1, keepdim=True)
    flat_ids = ids.flatten()
    order = torch.argsort(flat_ids, stable=True)
    rows_of = order // top_k
    weight_of = weights.flatten()[order].to(x.dtype)
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
    out = torch.zeros_like(x)
    start = 0
    for expert, n in enumerate(counts):
        if n == 0:
            continue
        rows = rows_of[start : start + n]
        gate, up = (x[rows] @ w13[expert].T).chunk(2, dim=-1)
        y = (F.silu(gate) * up) @ w2[expert].T
        out.index_add_(0, rows, y * weight_of[start : start + n, None])
        start += n
    return out


def reference(x, logits, w13, w2, top_k):
    """The same layer in float64 numpy, token by token, from the same inputs and weights."""
    x = x.double().numpy()
    logits = logits.double().numpy()
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        probs = np.exp(logits[t] - logits[t].max())
        probs /= probs.sum()
        chosen = np.argsort(-probs, kind="stable")[:top_k]
        for e in chosen:
            gate_up = w13[e].double().numpy() @ x[t]
            gate, up = np.split(gate_up, 2)
            hidden = gate / (1.0 + np.exp(-gate)) * up
            out[t] += probs[e] / probs[chosen].sum() * (w2[e].double().numpy() @ hidden)
    return out


def relative_l2(got, expected):
    return float(np.linalg.norm(got - expected) / max(np.linalg.norm(expected), 1e-300))


def last_level_cache_bytes():
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            text = f.read().strip()
    except OSError:
        return 0
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


class CacheFlusher:
    """Like moekit's bench: the next run reads its weights from memory, as in a real model,
    where every other layer runs between two visits to this one."""

    def __init__(self):
        n = max(64 << 20, 4 * last_level_cache_bytes()) // 4
        self.buffer = torch.ones(n, dtype=torch.float32)

    def flush(self):
        self.buffer.sum().item()


def router_logits(generator, tokens, experts, top_k, routing):
    logits = torch.randn(tokens, experts, generator=generator)
    if routing == "skewed":
        hot = torch.randperm(experts, generator=generator)[: max(1, top_k // 2)]
        logits[:, hot] += SKEW_BOOST
    return logits


def random_weights(generator, experts, hidden, intermediate):
    """fp32 [E, 2I, H] and [E, H, I], scaled so activations stay near unit size."""
    w13 = torch.randn(experts, 2 * intermediate, hidden, generator=generator)
    w13 *= hidden**-0.5
    w2 = torch.randn(experts, hidden, intermediate, generator=generator)
    w2 *= intermediate**-0.5
    return w13, w2


def time_shape(shape, w13, w2, dtype, runs, settings, flusher):
    """Times one weight variant at each token count; returns {(tokens, routing): result}."""
    experts, top_k, hidden, _ = shape
    results = {}
    for (tokens, routing), repeats in sorted(runs.items()):
        generator = torch.Generator().manual_seed(settings.seed + tokens)
        x = torch.randn(tokens, hidden, generator=generator).to(dtype)
        logits = [
            router_logits(generator, tokens, experts, top_k, routing)
            for _ in range(settings.warmup + repeats)
        ]
        for i in range(settings.warmup):
            moe_layer(x, logits[i], w13, w2, top_k)
        seconds, distinct = [], []
        for run_logits in logits[settings.warmup :]:
            flusher.flush()
            start = time.perf_counter()
            out = moe_layer(x, run_logits, w13, w2, top_k)
            seconds.append(time.perf_counter() - start)
            distinct.append(len(torch.topk(run_logits, top_k, dim=-1).indices.unique()))
        n = min(tokens, CHECKED_TOKENS)
        expected = reference(x[:n], run_logits[:n], w13, w2, top_k)
        error = relative_l2(out[:n].double().numpy(), expected)
        seconds.sort()
        results[(tokens, routing)] = {
            "median_ms": seconds[len(seconds) // 2] * 1e3,
            "min_ms": seconds[0] * 1e3,
            "max_ms": seconds[-1] * 1e3,
            "repeats": len(seconds),
            "distinct_experts": int(statistics.median_low(distinct)),
            "error": error,
            "ok": error <= TOLERANCE[dtype],
        }
        print(
            f"torch {dtype_name(dtype)} E={experts} k={top_k} H={hidden} T={tokens} {routing}: "
            f"{results[(tokens, routing)]['median_ms']:.3f} ms, error {error:.1e}",
            file=sys.stderr,
            flush=True,
        )
    return results


def dtype_name(dtype):
    return next(name for name, d in VARIANTS.items() if d == dtype)


def shape_of(case):
    return (case["experts"], case["top_k"], case["hidden"], case["intermediate"])


def time_cases(cases, settings):
    """PyTorch results for every moekit case, timed once per distinct shape and token count."""
    runs = {}
    for c in cases:
        key = (c["tokens"], c["routing"])
        shape_runs = runs.setdefault(shape_of(c), {})
        shape_runs[key] = max(shape_runs.get(key, 0), settings.repeats or c["repeats"])
    flusher = CacheFlusher()
    timings = {}
    for shape, shape_runs in runs.items():
        experts, _, hidden, intermediate = shape
        generator = torch.Generator().manual_seed(settings.seed)
        w13, w2 = random_weights(generator, experts, hidden, intermediate)
        for name, dtype in VARIANTS.items():
            w13, w2 = w13.to(dtype), w2.to(dtype)  # fp32 first: bf16 is rounded from it
            results = time_shape(shape, w13, w2, dtype, shape_runs, settings, flusher)
            for key, result in results.items():
                timings.setdefault((shape, *key), {})[name] = result
        del w13, w2  # before the next shape's weights are made
    return timings


def combine(moekit, timings, threads, load_before):
    results = []
    for c in moekit["results"]:
        torch_result = timings[(shape_of(c), c["tokens"], c["routing"])]
        best = min(r["median_ms"] for r in torch_result.values())
        # A hand-written cases file may carry no moekit time.
        speedup = best / c["median_ms"] if c["median_ms"] > 0 else None
        results.append({**c, "torch": torch_result, "speedup_vs_torch": speedup})
    machine = {
        **moekit.get("machine", {}),
        "torch": torch.__version__,
        "torch_threads": threads,
        "python": platform.python_version(),
        # Other work on the machine slows PyTorch's OpenMP threads far more than their share.
        "load_average_before": load_before,
    }
    return {"machine": machine, "results": results}


def table(combined):
    head = (
        f"{'case':<20} {'weights':<14} {'T':>5} {'moekit ms':>10} {'torch-fp32 ms':>14} "
        f"{'torch-bf16 ms':>14} {'speedup':>8} {'floor%':>7}"
    )
    lines = [head]
    for r in combined["results"]:
        fp32, bf16 = r["torch"]["fp32"], r["torch"]["bf16"]
        speedup = r["speedup_vs_torch"]
        speedup = "-" if speedup is None else f"{speedup:.2f}x"
        lines.append(
            f"{r['case']:<20} {r['weights']:<14} {r['tokens']:>5} {r['median_ms']:>10.3f} "
            f"{fp32['median_ms']:>14.3f} {bf16['median_ms']:>14.3f} "
            f"{speedup:>8} {100 * r['floor_ratio']:>6.1f}%"
        )
    lines.append(
        "speedup: the faster PyTorch variant's median over moekit's; floor%: moekit's roofline "
        "floor over its median"
    )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", required=True, help="moekit bench --json output")
    parser.add_argument("--out", help="write moekit's and PyTorch's results here as JSON")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs first (moekit's: 2)")
    parser.add_argument("--repeats", type=int, help="timed runs (default: as many as moekit's)")
    parser.add_argument("--threads", type=int, help="default: moekit's threads, else all cores")
    parser.add_argument("--seed", type=int, default=1)
    settings = parser.parse_args()

    with open(settings.cases) as f:
        moekit = json.load(f)
    if not moekit.get("results"):
        sys.exit(f"{settings.cases}: no \"results\" to compare with")
    threads = settings.threads or moekit.get("machine", {}).get("threads") or os.cpu_count()
    torch.set_num_threads(threads)
    load_before = os.getloadavg()[0]
    if load_before > 0.5 * os.cpu_count():
        print(
            f"warning: load average {load_before:.1f} on {os.cpu_count()} cores: PyTorch's "
            "OpenMP threads will wait for the CPU and its times will not mean much",
            file=sys.stderr,
        )
    with torch.inference_mode():
        timings = time_cases(moekit["results"], settings)
    combined = combine(moekit, timings, threads, load_before)
    print(table(combined))
    if settings.out:
        with open(settings.out, "w") as f:
            json.dump(combined, f, indent=1)
            f.write("\n")
    failed = [k for k, v in timings.items() for r in v.values() if not r["ok"]]
    if failed:
        sys.exit(f"PyTorch layer disagrees with the float64 reference on {failed}")


if __name__ == "__main__":
    main()
