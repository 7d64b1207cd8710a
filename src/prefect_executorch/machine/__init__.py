"""What this machine is: the probe of its libraries, GPUs and ExecuTorch runtime (cached), version
comparisons, and the compat keys that say which machines a bundle runs on.
"""
