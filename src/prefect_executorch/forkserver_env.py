"""Imported first by the forkserver (``isolation.PRELOAD``): sets ``isolation.FORKSERVER_ENV`` in that process.

Set there, before its other imports, rather than in the caller around the server's start: the caller's
``os.environ`` stays untouched, and another of its threads (concurrent builds of one flow run) may be reading it
at that moment; changing it under them made ``os.environ`` change size while they iterated it.
"""

import os

from prefect_executorch.isolation import FORKSERVER_ENV

os.environ.update(FORKSERVER_ENV)
