"""Validation: the exported program run by ExecuTorch's runtime beside eager PyTorch on the same inputs,
compared against the spec's gates (in a child), the reports, the bundled cases, triage of a failed case
and the side-by-side of a candidate with the bundle an alias points at.
"""
