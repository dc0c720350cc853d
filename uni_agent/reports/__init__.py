"""Reports read from a finished run's results on disk (`uni-agent report OUTPUT_DIR`, `uni-agent export-preds
OUTPUT_DIR`); they run in no cluster process.

    run_report            the data of the page (Avg@N with a confidence interval, pass@k, exit reasons, times) and
                          writing it
    html_parts            the HTML pieces, each from rows run_report prepared; nothing there reads files
    swebench_predictions  the run's patches as preds.jsonl for the official SWE-bench harness, and our grades in its
                          report's shape
"""
