"""``prefect-executorch``: the command line over the flows, on an embedded ephemeral Prefect API by default.
"""
