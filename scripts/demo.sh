#!/usr/bin/env bash
# Builds fusekit and runs the main demo: on the GPU when one is usable, else on the
# CPU (FK_DEVICE_AUTO). Needs cargo and a C compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
mkdir -p target/examples
cc -std=c99 -O2 -Iinclude examples/elementwise_demo.c -Ltarget/release -lfusekit \
   -Wl,-rpath,"$PWD/target/release" -o target/examples/elementwise_demo -lm
exec target/examples/elementwise_demo "$@"
