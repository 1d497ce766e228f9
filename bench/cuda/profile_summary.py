"""Summarises a kernel trace of `moekit bench --device cuda` (bench/cuda/profile.sh).

nsys: the cuda_gpu_trace CSV (Start and Duration in ns, Name). A forward is a run of kernels
between the bench's copies and memsets (logits, poisoned output, L2 flush before every repeat);
the last forward of each shape is printed: each kernel's start from the forward's first kernel, its duration, the gap
before it. ncu: mean duration per kernel name, in launch order. stalls: ncu's raw page with
the SpeedOfLight and WarpStateStats sections: per kernel name, in launch order, the mean
duration, DRAM throughput, instructions executed and the four main stall reasons (warp cycles
per issued instruction spent in each).
"""
import re
import csv
import sys
from collections import OrderedDict


def short(name):
    name = name.split("(")[0]
    return name[-60:]


def nsys(path):
    rows = list(csv.DictReader(open(path)))
    # The bench's copies and memsets (logits, poisoned output, L2 flush) fall between forwards.
    forwards, current = [], []
    for r in rows:
        if not r.get("Name"):
            continue
        if r["Name"].startswith("[CUDA"):
            if current:
                forwards.append(current)
            current = []
            continue
        current.append(r)
    if current:
        forwards.append(current)
    kept = [f for f in forwards if len(f) <= 40]
    # The last of every T's forwards before its check: one per distinct kernel count run.
    last = []
    for i, f in enumerate(kept):
        if i + 1 == len(kept) or [r["Name"] for r in kept[i + 1]] != [r["Name"] for r in f]:
            last.append(f)
    for f in last[-int(sys.argv[3]) if len(sys.argv) > 3 else -8:]:
        t0 = int(f[0]["Start (ns)"])
        end = max(int(r["Start (ns)"]) + int(r["Duration (ns)"]) for r in f)
        print(f"-- forward: {len(f)} kernels, {(end - t0) / 1e3:.1f} us first start to last end")
        prev_end = t0
        for r in f:
            s, d = int(r["Start (ns)"]), int(r["Duration (ns)"])
            print(f"{(s - t0) / 1e3:9.1f} {d / 1e3:8.1f} gap {(s - prev_end) / 1e3:6.1f}  {short(r['Name'])}")
            prev_end = s + d


def ncu(path):
    lines = [l for l in open(path) if l.startswith('"')]
    total = OrderedDict()
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = short(r["Kernel Name"])
        value = float(r["Metric Value"].replace(",", ""))
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(r.get("Metric Unit"), 1e-3)
        total.setdefault(name, []).append(value * scale)
    for name, values in total.items():
        print(f"{sum(values) / len(values):9.1f} us x{len(values):4d}  {name}")


def stalls(path):
    lines = [l for l in open(path) if l.startswith('"')]
    rows = list(csv.DictReader(lines))[1:]  # the first row holds the units
    stall = re.compile(r"smsp__average_warps_issue_stalled_(.*)_per_issue_active\.ratio$")

    def number(text):
        try:
            return float(text.replace(",", ""))
        except (AttributeError, ValueError):
            return 0.0

    kernels = OrderedDict()
    for r in rows:
        kernels.setdefault(short(r["Kernel Name"]), []).append(r)
    print(f"{'us':>8} {'n':>4} {'dram%':>6} {'inst':>9}  kernel: stalls (cycles per issue)")
    for name, rs in kernels.items():
        mean = lambda key: sum(number(r.get(key)) for r in rs) / len(rs)
        reasons = sorted(((mean(k), m.group(1)) for k in rs[0] if (m := stall.match(k))), reverse=True)
        top = ", ".join(f"{why} {v:.1f}" for v, why in reasons[:4])
        us = mean("gpu__time_duration.sum") / 1e3
        dram = mean("dram__throughput.avg.pct_of_peak_sustained_elapsed")
        inst = mean("smsp__inst_executed.sum")
        print(f"{us:8.1f} {len(rs):4d} {dram:6.1f} {inst:9.0f}  {name}: {top}")


if __name__ == "__main__":
    {"nsys": nsys, "ncu": ncu, "stalls": stalls}[sys.argv[1]](sys.argv[2])
