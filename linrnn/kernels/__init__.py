"""The shared math: one generalized recurrence (reference loop, chunked torch) behind ``ops``."""
