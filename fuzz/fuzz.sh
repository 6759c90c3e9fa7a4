#!/usr/bin/env bash
# Builds and runs fusekit's libFuzzer targets (fuzz/fuzz_targets/*.rs) with
# AddressSanitizer (LeakSanitizer included) on a stable toolchain: RUSTC_BOOTSTRAP=1
# lets stable rustc take -Zsanitizer=address; the coverage instrumentation flags
# are the ones cargo-fuzz passes. No cargo-fuzz install needed (docs/fuzzing.md).
#
#   fuzz/fuzz.sh build                 build every target (fuzz/target/...)
#   fuzz/fuzz.sh run TARGET [ARGS...]  fuzz TARGET on its corpus; ARGS go to libFuzzer
#   fuzz/fuzz.sh smoke SECONDS         every target for SECONDS/4 seconds each over
#                                      its corpus (scripts/test.sh); fails on a finding
#   fuzz/fuzz.sh merge TARGET DIR...   minimise DIR... into fuzz/corpus/TARGET
#   fuzz/fuzz.sh repro TARGET FILE...  run TARGET on FILE... once each
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
triple="$(rustc -vV | sed -n 's/^host: //p')"
targets=(handles dlpack elementwise ops)
export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="$here/target"
flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
flags+=" -Zsanitizer=address -Cdebug-assertions -Coverflow-checks -Cforce-frame-pointers"
bin() { echo "$CARGO_TARGET_DIR/$triple/release/$1"; }
build() {
    # --target keeps build scripts and proc macros uninstrumented.
    RUSTFLAGS="$flags" cargo build --release --locked --target "$triple" --bins
}
# -rss_limit_mb: fusekit's own large allocations fail at 1 GiB (fuzz/src/lib.rs).
common=(-rss_limit_mb=4096 -timeout=20 -max_len=4096)
cmd="${1:-}"
shift || true
case "$cmd" in
build) build ;;
run)
    t="$1"
    shift
    build
    mkdir -p "corpus/$t" artifacts
    "$(bin "$t")" "${common[@]}" -artifact_prefix="artifacts/$t-" "$@" "corpus/$t"
    ;;
smoke)
    secs="${1:-60}"
    each=$((secs / ${#targets[@]}))
    build
    mkdir -p artifacts
    for t in "${targets[@]}"; do
        # A scratch copy: the short run never rewrites the committed corpus.
        scratch="$(mktemp -d)"
        cp -r "corpus/$t/." "$scratch/" 2>/dev/null || true
        echo "== fuzz $t for ${each}s"
        log="$(mktemp)"
        status=0
        "$(bin "$t")" "${common[@]}" -artifact_prefix="artifacts/$t-" -max_total_time="$each" \
            -print_final_stats=1 "$scratch" >"$log" 2>&1 || status=$?
        grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units)' "$log" || true
        [ "$status" -eq 0 ] || tail -60 "$log"
        rm -f "$log"
        rm -rf "$scratch"
        if [ "$status" -ne 0 ]; then
            echo "fuzz target $t found a failure (exit $status); the input is in fuzz/artifacts/" >&2
            exit 1
        fi
    done
    ;;
merge)
    t="$1"
    shift
    build
    mkdir -p "corpus/$t"
    "$(bin "$t")" "${common[@]}" -merge=1 "corpus/$t" "$@"
    ;;
repro)
    t="$1"
    shift
    build
    "$(bin "$t")" "${common[@]}" "$@"
    ;;
*)
    sed -n '2,13p' "$0"
    exit 2
    ;;
esac
