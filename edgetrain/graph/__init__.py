"""Passes over the IR that the build side and the device both run (numpy only; imports the core alone): static
shapes and constant folding, re-batching, the memory planner, the frozen-prefix split."""
