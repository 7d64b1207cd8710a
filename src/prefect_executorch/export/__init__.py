"""Export: the child process that turns a spec into a ``.pte`` (eager run, ``torch.export``, quantizing,
the target's lowering), each stage's failure named, and the facts a bundle records (fingerprint, lineage).
"""
