#!/usr/bin/env bash
# Long runs of the reliability suite (see docs/RELIABILITY.md).
#
#   scripts/soak.sh                 every step below
#   scripts/soak.sh crash input     only these steps
#
# Steps: crash, contention, disk, corrupt, input, operations. Each runs the `soak_*`
# (#[ignore]d) variants of its test file and, where a count drives a default test, that
# test with the count raised. Counts come from the environment (defaults below); the
# full-disk step needs root (it mounts tmpfs file systems) and skips itself otherwise. The
# 1 GiB payload step needs about 4 GB of free memory.
#
# Every step runs even when an earlier one fails; the summary at the end lists them, and
# the exit status is non-zero when any failed. The logs stay in $SOAK_LOG_DIR.
set -uo pipefail
cd "$(dirname "$0")/.."

export RELIABILITY_KILLS="${RELIABILITY_KILLS:-1000}"
export RELIABILITY_CONTENDERS="${RELIABILITY_CONTENDERS:-8}"
export RELIABILITY_ROUNDS="${RELIABILITY_ROUNDS:-2000}"
export RELIABILITY_CORRUPT_TRIALS="${RELIABILITY_CORRUPT_TRIALS:-2000}"
export RELIABILITY_OP_KILLS="${RELIABILITY_OP_KILLS:-300}"
export RELIABILITY_WAL_COPIES="${RELIABILITY_WAL_COPIES:-200}"
export PROPTEST_CASES="${PROPTEST_CASES:-2000}"
SOAK_LOG_DIR="${SOAK_LOG_DIR:-target/soak}"
mkdir -p "$SOAK_LOG_DIR"

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(crash contention disk corrupt input operations)

echo "soak: kills=$RELIABILITY_KILLS contenders=$RELIABILITY_CONTENDERS rounds=$RELIABILITY_ROUNDS" \
  "corrupt_trials=$RELIABILITY_CORRUPT_TRIALS proptest_cases=$PROPTEST_CASES" \
  "op_kills=$RELIABILITY_OP_KILLS wal_copies=$RELIABILITY_WAL_COPIES logs=$SOAK_LOG_DIR"
cargo test --release --no-run --test reliability_crash --test reliability_contention \
  --test reliability_disk --test reliability_corrupt --test reliability_input \
  --test reliability_operations || exit 1

summary=()
failed=0

# run NAME TEST-FILE LIBTEST-ARGS...: one cargo test invocation, logged and timed.
run() {
  local name=$1 file=$2
  shift 2
  local log="$SOAK_LOG_DIR/$name.log" start=$SECONDS status
  echo "=== $name: cargo test --release --test $file -- $*"
  cargo test --release --test "$file" -- --nocapture "$@" >"$log" 2>&1
  status=$?
  # The suite's figure lines (kills, rounds, bytes, peak RSS, …).
  grep -E '^(crash_during_[a-z_]+|deleted_wal_of_a_live_copy|contention|full_disk(_timed)?|corrupt_random_flips|checkpoint|huge_payload|batches|session ids|deep_json):' "$log" \
    | grep -v RELIABILITY_SEED
  grep -E '^test result:' "$log" | tail -n 1
  if [ $status -eq 0 ]; then
    summary+=("ok     $name ($((SECONDS - start)) s)")
  else
    summary+=("FAILED $name ($((SECONDS - start)) s, see $log)")
    failed=1
  fi
}

for step in "${steps[@]}"; do
  case $step in
    crash) run crash reliability_crash --ignored --exact soak_crash_during_appends ;;
    contention) run contention reliability_contention --ignored --exact soak_contention ;;
    disk)
      run disk reliability_disk --ignored --exact soak_full_disk
      run disk-default reliability_disk full_disk
      ;;
    corrupt) run corrupt reliability_corrupt --ignored --exact soak_random_flipped_bytes ;;
    input)
      run input-proptest reliability_input proptest_
      run input-huge-random reliability_input --ignored --exact soak_huge_random_payload
      run input-over-blob-limit reliability_input --ignored --exact soak_payload_over_the_blob_limit
      ;;
    operations) run operations reliability_operations --ignored soak_ ;;
    *)
      echo "unknown step $step (crash, contention, disk, corrupt, input, operations)" >&2
      exit 2
      ;;
  esac
done

echo "=== summary"
printf '%s\n' "${summary[@]}"
exit $failed
