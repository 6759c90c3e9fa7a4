#!/usr/bin/env bash
# Builds everything the GPU suite needs on a machine without a GPU and copies it to
# .dev/bundle (git-ignored), to be carried to the GPU machine:
#   lib/libfusekit.so, lib/_fusekit_torch.so (the compiled torch ops, built against
#   this machine's torch: the stable ABI lets the same binary load under the GPU
#   machine's torch), bin/<rust test and bench executables>
set -euo pipefail
cd "$(dirname "$0")/.."
out=.dev/bundle
rm -rf "$out" && mkdir -p "$out/lib" "$out/bin"
cargo build --release
cp target/release/libfusekit.so "$out/lib/"
# the compiled torch ops (needs torch >= 2.10 here: .venv-test has it after scripts/test.sh)
PY=python3
[ -x .venv-test/bin/python ] && PY=.venv-test/bin/python
(cd bindings/python && FUSEKIT_REQUIRE_TORCH_EXT=1 "../../$PY" setup.py -q build_ext --inplace)
cp bindings/python/fusekit/_fusekit_torch.so "$out/lib/"
# test and bench executables (release), named by target
cargo test --release --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys, shutil
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        name = m["target"]["name"]
        if m["target"]["kind"] == ["lib"] or "lib" in m["target"]["kind"]: name = "unit"
        shutil.copy(m["executable"], sys.argv[1] + "/" + name)
        print("bundled", name)
' "$out/bin"
cargo bench --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys, shutil
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "bench" in m["target"]["kind"]:
        shutil.copy(m["executable"], sys.argv[1] + "/bench_" + m["target"]["name"])
        print("bundled bench_" + m["target"]["name"])
' "$out/bin"
strip --strip-debug "$out"/bin/* "$out"/lib/*.so
# programs linked against libfusekit.so ask for its SONAME, libfusekit.so.<major> (build.rs):
# a link, not a copy, so that a process loading both names maps one library
for l in target/release/libfusekit.so.[0-9]*; do ln -sf libfusekit.so "$out/lib/${l##*/}"; done
du -sh "$out"
