"""bench/ab.sh's table: each case's median per round for A and B, and B / A of their medians.

    python3 bench/ab_summary.py OUT_DIR ROUNDS

Reads OUT_DIR/{a,b}-{round}.json as `moekit bench --json` writes them (the CPU table's
`median_ms` or the GPU table's `median_us`). A case is the same (case, weights, tokens, routing)
on both sides; a case one side lacks, or that failed its check on either side, is reported and
makes the exit status 1.
"""

import json
import statistics
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f).get("results", [])
    except (OSError, ValueError) as e:
        print(f"ab: {path}: {e}")
        return None


def key(result):
    return (result["case"], result["weights"], result["tokens"], result.get("routing", ""))


def micros(result):
    if "median_us" in result:
        return result["median_us"]
    return result["median_ms"] * 1e3


def main():
    out, rounds = sys.argv[1], int(sys.argv[2])
    times = {"a": {}, "b": {}}
    failed = set()
    missing_run = False
    for side in ("a", "b"):
        for r in range(1, rounds + 1):
            results = load(f"{out}/{side}-{r}.json")
            if results is None:
                missing_run = True
                continue
            for result in results:
                times[side].setdefault(key(result), []).append(micros(result))
                if not result.get("ok", False):
                    failed.add((side, key(result)))
    cases = sorted(set(times["a"]) | set(times["b"]), key=str)
    print("| case | weights | T | routing | A us (rounds) | B us (rounds) | B / A |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    status = 1 if missing_run or failed else 0
    for k in cases:
        a, b = times["a"].get(k), times["b"].get(k)
        cells = [" / ".join(f"{v:.1f}" for v in side) if side else "-" for side in (a, b)]
        ratio = f"{statistics.median(b) / statistics.median(a):.3f}" if a and b else "-"
        if not (a and b):
            status = 1
        flags = "".join(f" ({s.upper()} FAILED its check)" for s in "ab" if (s, k) in failed)
        print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {cells[0]} | {cells[1]} | {ratio}{flags} |")
    return status


if __name__ == "__main__":
    sys.exit(main())
