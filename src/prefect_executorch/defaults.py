"""Defaults a user can override, in one place: the CLI, the flows and the library read them from here."""

from __future__ import annotations

#: Where bundles go when neither ``--store`` nor the ``store`` setting names a store.
DEFAULT_STORE = "./bundles"
#: Promotion refuses a candidate whose p50 is more than this much slower than the alias's (0.10: 10%).
MAX_LATENCY_REGRESSION = 0.10
#: ``gc`` leaves objects younger than this; it must exceed the longest publish.
GC_GRACE_HOURS = 24.0
