"""Triton kernels of the generalized recurrence (imported lazily: ``import linrnn`` never imports Triton)."""
