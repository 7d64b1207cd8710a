"""Prefect tasks: thin wrappers over the library functions, one pipeline stage each.

Importing them makes our typed failures read as one line in Prefect's run logs (``tasks.failures``).
"""

from prefect_executorch.tasks.failures import log_failures_in_one_line

log_failures_in_one_line()
