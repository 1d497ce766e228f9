"""moekit's GPU bench beside the two PyTorch layers (torch_moe_layers.py), case by case.

  python3 compare.py BENCH_JSON TORCH_JSON OUT_JSON

Prints one table (moekit's time, % of floor and TB/s; each torch layer's time and moekit's
speed-up over it) and, last, one summary line; writes the joined rows to OUT_JSON. A missing or
unreadable torch file leaves its columns empty and says so in the summary.
"""
import json
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    bench, torch_run, out_path = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
    if "results" not in bench:
        print(f"moekit bench cuda: no results ({bench.get('error', 'no results')})")
        sys.exit(1)
    torch_rows = {}
    for row in torch_run.get("results", []):
        torch_rows[(row["case"], row["weights"], row["tokens"], row["layer"])] = row
    joined, faster, compared = [], 0, 0
    print(f"{'case':<14} {'weights':<10} {'routing':<7} {'T':>5} {'moekit us':>10} {'floor%':>7} "
          f"{'TB/s':>6} {'TFLOP/s':>8} {'check':<6} {'torch loop us':>14} {'x':>6} "
          f"{'torch grouped us':>17} {'x':>6}")
    for r in bench["results"]:
        row = dict(r)
        cells = []
        for layer in ("loop", "grouped_mm"):
            t = torch_rows.get((r["case"], r["weights"], r["tokens"], layer))
            # Skewed routing is moekit's alone: the torch layers are timed on uniform routing.
            if t is None or "median_us" not in t or r["routing"] != "uniform":
                cells += ["-" if t is None or r["routing"] != "uniform" else "failed", ""]
                continue
            speedup = t["median_us"] / r["median_us"]
            row[f"torch_{layer}_us"] = t["median_us"]
            compared += 1
            faster += speedup > 1.0
            cells += [f"{t['median_us']:.1f}", f"{speedup:.2f}"]
        joined.append(row)
        print(f"{r['case']:<14} {r['weights']:<10} {r['routing']:<7} {r['tokens']:>5} "
              f"{r['median_us']:>10.1f} {100 * r['floor_ratio']:>6.1f}% {r['tbs']:>6.2f} "
              f"{r['tflops']:>8.1f} {'ok' if r['ok'] else 'FAILED':<6} {cells[0]:>14} "
              f"{cells[1]:>6} {cells[2]:>17} {cells[3]:>6}")
    with open(out_path, "w") as f:
        json.dump({"gpu": bench.get("gpu"), "torch": torch_run.get("torch", torch_run.get("error")),
                   "results": joined}, f, indent=1)
    ok = sum(r["ok"] for r in bench["results"])
    ratios = sorted(100 * r["floor_ratio"] for r in bench["results"])
    median = ratios[len(ratios) // 2] if ratios else 0.0
    vs = (f"faster than torch in {faster}/{compared}" if compared
          else f"no torch figures ({torch_run.get('error', 'none matched')})")
    print(f"moekit bench cuda: {ok}/{len(bench['results'])} checked ok, median {median:.0f}% of "
          f"floor, {vs}")
    sys.exit(0 if ok == len(bench["results"]) else 1)


if __name__ == "__main__":
    main()
