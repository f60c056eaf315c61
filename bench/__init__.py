"""Benchmarks: load generator, pytest-benchmark suites, run_all (make bench)."""
