"""Test helpers that start real services (SeaweedFS) for the test suite and the benchmarks."""
