"""Step ``compare``: the guide's §6 report (versions, curves, time ratios) and a precision-parity verdict.

    mlflow run . --env-manager local -e compare -P baseline=<h20 run> -P candidate=<a3 run>
    verlflow compare --baseline "tags.device.type = 'gpu'" --candidate "tags.device.type = 'npu'"
"""

from __future__ import annotations

from verlflow.step_requests import CompareRequest


def run_compare(request: CompareRequest):
    """Compare the request's baseline and candidate runs (:func:`verlflow.compare.comparison.compare_runs`)."""
    from verlflow.compare.comparison import compare_runs

    return compare_runs(request.baseline, request.candidate, request.output_dir, threshold=request.threshold,
                        prices=request.prices)
