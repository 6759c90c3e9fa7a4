#!/usr/bin/env bash
# Builds fusekit and runs the flagship demo, examples/gaussian_fit.c: a field of 3-D
# Gaussians fitted to a synthetic density entirely through the C ABI (forward,
# backward, Adam from elementwise ops), on the GPU when one is usable, else the CPU
# (FK_DEVICE_AUTO). It prints the loss as it goes and writes gaussian_fit.png (the
# z = 0 slice of the target and of the fit). Arguments go to the demo
# (e.g. --steps 500 --gaussians 256 --out /tmp/fit.png). The elementwise demo is
# built too: target/examples/elementwise_demo. Needs cargo and a C compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
mkdir -p target/examples
for demo in elementwise_demo gaussian_fit; do
  cc -std=c99 -O2 -Iinclude "examples/$demo.c" -Ltarget/release -lfusekit \
     -Wl,-rpath,"$PWD/target/release" -o "target/examples/$demo" -lm
done
exec target/examples/gaussian_fit "$@"
