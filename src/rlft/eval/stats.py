"""Constants of the confidence intervals the evaluations report (no heavy imports, so any evaluation can use them)."""

Z_95 = 1.959963984540054
"""Two-sided 95% standard-normal quantile."""
