#!/usr/bin/env bash
# A against B in one sitting: `moekit bench` from two source trees, built side by side and run
# in alternating order on the same machine, so that a change of a few percent is not lost in
# what the machine does from one call (or one device lease) to the next, which moved the GPU
# figures by up to ~5% (docs/CUDA.md) and the CPU ones by more.
#
#   bench/ab.sh export REV DIR      # the tree of git revision REV into DIR (the base, "A")
#   bench/ab.sh BASE_DIR [moekit bench arguments]
#
# The second form builds the moekit command of BASE_DIR (A) and of this tree (B), then runs the
# bench with the same arguments AB_ROUNDS times on each, A first in odd rounds and B first in even
# ones, and prints each case's medians per round and the ratio B / A of their medians.
# For the device machine: export the base into an ignored folder here (`build-ab/base`, say),
# name it in the `run` tool's `carry`, and add `--device cuda` to the bench arguments.
#
# Environment:
#   AB_ROUNDS       rounds (default 3)
#   AB_CMAKE_FLAGS  configure flags for both builds (default: Release; CUDA where nvcc is found)
#   AB_OUT          where the builds' logs and each run's JSON go (default build-ab/out)
#   AB_B_BUILD      a build folder of this tree already configured with the same flags (the
#                   device script's): B's moekit is built there, not in build-ab/b, so a device
#                   call does not compile this tree twice
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = export ]; then
  rev=${2:?usage: bench/ab.sh export REV DIR}
  dir=${3:?usage: bench/ab.sh export REV DIR}
  mkdir -p "$dir"
  # -m: the files are dated now, not at the commit, so a build folder made from another
  # export rebuilds them (make would take sources older than its objects as built).
  git archive "$rev" | tar -x -m -C "$dir"
  echo "ab: $(git rev-parse --short "$rev") exported into $dir"
  exit
fi
base=${1:?usage: bench/ab.sh BASE_DIR [moekit bench arguments]}
shift
[ -f "$base/CMakeLists.txt" ] || { echo "ab: $base holds no source tree" >&2; exit 1; }
base=$(cd "$base" && pwd)
out=${AB_OUT:-build-ab/out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rounds=${AB_ROUNDS:-3}
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
read -r -a flags <<<"${AB_CMAKE_FLAGS:--DCMAKE_BUILD_TYPE=Release}"
declare -A dir=([a]=$PWD/build-ab/a [b]=${AB_B_BUILD:-$PWD/build-ab/b})
dir[b]=$(mkdir -p "${dir[b]}" && cd "${dir[b]}" && pwd)
# Half the cores each; all of them for A where B's folder is built already (AB_B_BUILD).
declare -A jobs=([a]=$(( ($(nproc) + 1) / 2 )) [b]=$(( ($(nproc) + 1) / 2 )))
[ -n "${AB_B_BUILD:-}" ] && jobs[a]=$(nproc)

build() {  # side, source dir
  if cmake -S "$2" -B "${dir[$1]}" "${flags[@]}" >"$out/build-$1.log" 2>&1 &&
    cmake --build "${dir[$1]}" -j "${jobs[$1]}" --target moekit >>"$out/build-$1.log" 2>&1; then
    return 0
  fi
  tail -n 30 "$out/build-$1.log"
  return 1
}
echo "== ab: building A ($base, ${jobs[a]} jobs) and B (this tree in ${dir[b]}, ${jobs[b]} jobs)"
build a "$base" &
a_pid=$!
build b "$PWD" &
b_pid=$!
wait "$a_pid" || { echo "ab: A did not build" >&2; exit 1; }
wait "$b_pid" || { echo "ab: B did not build" >&2; exit 1; }

status=0
for ((round = 1; round <= rounds; round++)); do
  order=(a b)
  ((round % 2 == 0)) && order=(b a)
  for side in "${order[@]}"; do
    echo "== ab: round $round, $side"
    if ! "${dir[$side]}/tools/moekit" bench "$@" --json "$out/$side-$round.json" \
      >"$out/$side-$round.log" 2>&1; then
      tail -n 20 "$out/$side-$round.log"
      status=1
    fi
  done
  # The table of the rounds done so far, so that a run cut short (a device call's time limit)
  # still says what its finished rounds measured.
  if ((round < rounds)); then
    echo "== ab: after round $round"
    python3 bench/ab_summary.py "$out" "$round" || true
  fi
done
python3 bench/ab_summary.py "$out" "$rounds" || status=1
exit "$status"
