#!/usr/bin/env bash
# Runs the MPI test binary with one rank stopped or killed mid-run, and checks how the run ends:
# within the bound, with a failing exit code, and with an error naming rank 1
# (docs/EXPERT_PARALLEL.md, "Faults"):
# - stop: the others' timeouts find it; they name rank 1 and the step, and end the run with
#   exit code 1;
# - die: mpirun itself notices the death, ends every rank at once, names rank 1 and the signal,
#   and exits with the signal's code, 137 (128 + SIGKILL): mpirun decides that code;
# - die_survivors: the same death under `--mca orte_abort_on_non_zero_status 0`, which keeps
#   mpirun from ending the others: their timeouts find it, they name rank 1 and the step, and end
#   the run; mpirun still exits 137, the first failure's code.
# usage: expect_fault.sh MPIEXEC BINARY RANKS stop|die|die_survivors
set -uo pipefail
mpiexec=$1 binary=$2 ranks=$3 fault=$4
bound=30
launcher=()
[ "$fault" = die_survivors ] && launcher=(--mca orte_abort_on_non_zero_status 0)
start=$(date +%s)
output=$(timeout -s KILL $bound "$mpiexec" --oversubscribe --allow-run-as-root "${launcher[@]}" \
  -np "$ranks" "$binary" --fault="${fault%_survivors}" 2>&1)
code=$?
elapsed=$(($(date +%s) - start))
echo "$output"
echo "expect_fault: exit code $code after ${elapsed}s"
fail() {
  echo "expect_fault: $*" >&2
  exit 1
}
if [ "$code" -eq 0 ] || [ "$elapsed" -ge "$bound" ]; then fail "the run did not end with an error in time"; fi
case $fault in
  stop) want_code=1 ;;
  *) want_code=137 ;;
esac
[ "$code" -eq "$want_code" ] || fail "exit code $code, not $want_code"
if [ "$fault" = die ]; then
  grep -q "process rank 1 .* exited on signal 9" <<<"$output" || fail "mpirun did not name rank 1"
else
  grep -q "waiting for rank 1" <<<"$output" || fail "no error names rank 1"
  grep -q "step 'dispatch" <<<"$output" || fail "no error names the step"
fi
