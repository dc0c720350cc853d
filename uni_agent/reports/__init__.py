"""Reports read from a finished run's results on disk (`uni-agent report OUTPUT_DIR`); they run in no cluster process.

    run_report      the data of the page (Avg@N with a confidence interval, pass@k, exit reasons, times) and writing it
    html_parts      the HTML pieces, each from rows run_report prepared; nothing there reads files
"""
