#!/usr/bin/env python3
"""Where the host time of one small fusekit call from Python goes (cProfile)."""
import cProfile
import pstats
import sys

import torch

import fusekit

dev = "cuda" if torch.cuda.is_available() else "cpu"
a, b = torch.rand(256, device=dev), torch.rand(256, device=dev)
o = torch.empty_like(a)
for _ in range(200):
    fusekit.add(a, b, out=o)
pr = cProfile.Profile()
pr.enable()
for _ in range(2000):
    fusekit.add(a, b, out=o)
pr.disable()
pstats.Stats(pr, stream=sys.stdout).sort_stats("tottime").print_stats(18)
