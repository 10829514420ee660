"""Modular addition (Nanda et al. 2023): the Fourier basis, key frequencies, neurons and W_L in that basis, progress
measures and phases of grokking, and exhaustive evaluation under ablation; ``suite`` wires them into
``interp analyze`` / ``interp report``."""
