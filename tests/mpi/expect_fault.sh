#!/usr/bin/env bash
# Runs the MPI test binary with one rank stopped or killed mid-run, and checks how the run ends:
# within the bound, with a failing exit code, and with an error naming rank 1. A stopped rank is
# found by the others' timeouts (exit code 1); a killed one by mpirun itself, which ends the run
# with the signal's code (137) and names the rank.
# usage: expect_fault.sh MPIEXEC BINARY RANKS stop|die
set -uo pipefail
mpiexec=$1 binary=$2 ranks=$3 fault=$4
bound=30
start=$(date +%s)
output=$(timeout -s KILL $bound "$mpiexec" --oversubscribe --allow-run-as-root -np "$ranks" \
  "$binary" --fault="$fault" 2>&1)
code=$?
elapsed=$(($(date +%s) - start))
echo "$output"
echo "expect_fault: exit code $code after ${elapsed}s"
if [ "$code" -eq 0 ] || [ "$elapsed" -ge "$bound" ]; then
  echo "expect_fault: the run did not end with an error in time" >&2
  exit 1
fi
if [ "$fault" = stop ]; then
  [ "$code" -eq 1 ] || { echo "expect_fault: exit code $code, not 1" >&2; exit 1; }
  grep -q "waiting for rank 1" <<<"$output" || { echo "expect_fault: no error names rank 1" >&2; exit 1; }
  grep -q "step 'dispatch" <<<"$output" || { echo "expect_fault: no error names the step" >&2; exit 1; }
else
  grep -qi "rank 1" <<<"$output" || { echo "expect_fault: nothing names rank 1" >&2; exit 1; }
fi
