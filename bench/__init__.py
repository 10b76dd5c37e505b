"""kmq benchmarks: every kmq figure beside its raw kafka-python baseline from the same run.

Run ``python -m bench`` (full, ~15 minutes) or ``python -m bench --quick`` (under 2 minutes).
See bench/README.md.
"""
