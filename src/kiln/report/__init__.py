"""A run directory -> a self-contained HTML report with matplotlib plots."""

from kiln.report.build import build_report
from kiln.report.metrics_io import read_metrics

__all__ = ["build_report", "read_metrics"]
