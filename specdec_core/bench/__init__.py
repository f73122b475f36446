"""The one measurement stack: workloads, baseline and speculative runs side by side, sweeps, the expected speedup,
forward timings and batch invariance. The CLI's bench, sweep and bench-forward commands and the app's measurement
pages call these; nothing here draws.
"""
