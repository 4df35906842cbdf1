"""Decoding: sampling, plain AR, the one speculative loop and its drafting kinds (chains, trees, Jacobi windows),
their batched rounds, compiled steps and per-image stats."""
