"""Step ``compare``: the guide's §6 report (versions, curves, time ratios) and a precision-parity verdict.

    mlflow run . --env-manager local -e compare -P baseline=<h20 run> -P candidate=<a3 run>
    verlflow compare --baseline "tags.device.type = 'gpu'" --candidate "tags.device.type = 'npu'"
"""

from __future__ import annotations

from verlflow.step_requests import CompareRequest


def run_compare(request: CompareRequest):
    """Compare the request's baseline and candidate runs (:func:`verlflow.compare.comparison.compare_runs`)."""
    from verlflow.compare.comparison import compare_runs
    from verlflow.tracking import tracking, ui_links

    result = compare_runs(request.baseline, request.candidate, request.output_dir, threshold=request.threshold,
                          prices=request.prices)
    compared = [result.baseline, result.candidate]
    report_run = tracking.get_run(result.run_id)
    ui_links.print_links("compare", [
        ("the report (run artifacts)", ui_links.run_route(report_run.info.experiment_id, result.run_id)),
        ("the two runs side by side", ui_links.compare_route([r.experiment_id for r in compared],
                                                             [r.run_id for r in compared])),
    ])
    return result
