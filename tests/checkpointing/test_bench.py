"""``bench --checkpointing``'s measurement of one configuration (``measure``, which the bench
runs in a fresh process per row): what the tape held, NumPy's peak during the run and its
gradient (tracemalloc), the process's resident peak.  Timings are the bench's business."""

from __future__ import annotations

import sys

from tapegrad.bench.checkpointing import measure


def test_measure_reports_what_the_tape_held_and_the_peaks():
    n, steps = 32, 30
    state = 2 * n * n * 8
    got = measure(n, steps, 4)
    assert got["chosen"] == "s=4"
    # (the snapshots, the last step recorded; at the peak a few states more, and the result)
    assert 4 * state <= got["held_bytes"] <= 7 * state
    assert got["held_bytes"] < got["peak_bytes"]
    if sys.platform.startswith("linux"):
        assert got["process_peak_bytes"] >= got["process_before_bytes"] > 0
    plain = measure(n, steps, "default")     # (every state fits: the plain tape's records)
    assert plain["chosen"] == "every step"
    assert plain["held_bytes"] > steps * state / 2
    assert abs(plain["d_feed"] - got["d_feed"]) <= 1e-12 * abs(got["d_feed"])
