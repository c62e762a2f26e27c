#!/usr/bin/env bash
# Long runs of the reliability suite (see docs/RELIABILITY.md).
#
#   scripts/soak.sh                 every step below
#   scripts/soak.sh crash input     only these steps
#
# Steps: crash, contention, disk, corrupt, input, model, operations, load, fuzz. Each runs the
# `soak_*` (#[ignore]d) variants of its test file and, where a count drives a default test,
# that test with the count raised. Counts come from the environment (defaults below); the
# full-disk step needs root (it mounts tmpfs file systems) and skips itself otherwise. The
# 1 GiB payload step needs about 4 GB of free memory. `load` is 200 sessions x 8 tasks for
# RELIABILITY_LOAD_SECS. `fuzz` replays the committed fuzz corpus (fuzz/corpus/) on stable
# Rust; with SOAK_FUZZ_SECS > 0 and `cargo +nightly fuzz` installed it also runs each
# cargo-fuzz target that long (new inputs go to $SOAK_LOG_DIR/fuzz-corpus, crashes to
# fuzz/artifacts/, builds to $FUZZ_TARGET_DIR, default /tmp/fuzz-target).
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
export RELIABILITY_CLI_KILLS="${RELIABILITY_CLI_KILLS:-40}"
export PROPTEST_CASES="${PROPTEST_CASES:-2000}"
export RELIABILITY_LOAD_SECS="${RELIABILITY_LOAD_SECS:-60}"
SOAK_FUZZ_SECS="${SOAK_FUZZ_SECS:-0}"
SOAK_LOG_DIR="${SOAK_LOG_DIR:-target/soak}"
mkdir -p "$SOAK_LOG_DIR"

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(crash contention disk corrupt input model operations load fuzz)

echo "soak: kills=$RELIABILITY_KILLS contenders=$RELIABILITY_CONTENDERS rounds=$RELIABILITY_ROUNDS" \
  "corrupt_trials=$RELIABILITY_CORRUPT_TRIALS proptest_cases=$PROPTEST_CASES" \
  "op_kills=$RELIABILITY_OP_KILLS wal_copies=$RELIABILITY_WAL_COPIES cli_kills=$RELIABILITY_CLI_KILLS" \
  "load_secs=$RELIABILITY_LOAD_SECS fuzz_secs=$SOAK_FUZZ_SECS logs=$SOAK_LOG_DIR"
cargo test --release --no-run --test reliability_crash --test reliability_contention \
  --test reliability_disk --test reliability_corrupt --test reliability_input \
  --test reliability_operations --test reliability_cli_crash --test reliability_load \
  --test reliability_fuzz_corpus --test reliability_model --test reliability_model_lineage \
  --test reliability_output || exit 1

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
  grep -E '^(crash_during_[a-z_]+|deleted_wal_of_a_live_copy|contention|full_disk(_timed)?|corrupt_random_flips|checkpoint|huge_payload|batches|session ids|deep_json|load|fuzz_corpus|cli crash):' "$log" \
    | grep -v RELIABILITY_SEED
  grep -E '^test result:' "$log" | tail -n 1
  record "$name" $status $start "$log"
}

# record NAME STATUS START WHERE: NAME's line of the summary (WHERE: what to look at).
record() {
  if [ "$2" -eq 0 ]; then
    summary+=("ok     $1 ($((SECONDS - $3)) s)")
  else
    summary+=("FAILED $1 ($((SECONDS - $3)) s, see $4)")
    failed=1
  fi
}

# fuzz_run TARGET: one cargo-fuzz target for SOAK_FUZZ_SECS seconds (needs nightly and
# cargo-fuzz; its own target dir, so the stable build is untouched).
fuzz_run() {
  local target=$1 log="$SOAK_LOG_DIR/fuzz-$1.log" start=$SECONDS status
  if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    summary+=("SKIPPED fuzz-$target (no cargo +nightly fuzz)")
    return
  fi
  local scratch
  scratch="$(cd "$SOAK_LOG_DIR" && pwd)/fuzz-corpus/$target"
  mkdir -p "$scratch"
  echo "=== fuzz-$target: cargo +nightly fuzz run $target -- -max_total_time=$SOAK_FUZZ_SECS"
  (cd fuzz && CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-/tmp/fuzz-target}" cargo +nightly fuzz run \
    --target-dir "${FUZZ_TARGET_DIR:-/tmp/fuzz-target}" "$target" "$scratch" "corpus/$target" \
    -- -max_total_time="$SOAK_FUZZ_SECS" -print_final_stats=1) >"$log" 2>&1
  status=$?
  grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|Done )|cov: ' "$log" | tail -n 4
  record "fuzz-$target" $status $start "$log; crash inputs in fuzz/artifacts/$target"
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
    model)
      run model-proptest reliability_model proptest_
      run model-lineage-proptest reliability_model_lineage proptest_
      run output-proptest reliability_output --exact any_batch_append_accepts_prints_as_parseable_json
      ;;
    operations)
      run operations reliability_operations --ignored soak_
      run operations-cli reliability_cli_crash --exact cli_commands_killed_at_random_moments_leave_a_whole_root
      ;;
    load) run load reliability_load --ignored --exact soak_load ;;
    fuzz)
      run fuzz-corpus reliability_fuzz_corpus --exact the_fuzz_seed_corpus_replays_without_a_panic
      if [ "$SOAK_FUZZ_SECS" -gt 0 ]; then
        for target in import append_jsonl; do
          fuzz_run "$target"
        done
      fi
      ;;
    *)
      echo "unknown step $step (crash, contention, disk, corrupt, input, model, operations, load, fuzz)" >&2
      exit 2
      ;;
  esac
done

echo "=== summary"
printf '%s\n' "${summary[@]}"
exit $failed
