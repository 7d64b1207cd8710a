"""The fleet: work pools per CUDA channel and queues per GPU arch, the ``executorch`` worker that accepts
only the builds its machine can make, one engine build per GPU, deployments, automations and retrain events.
"""
