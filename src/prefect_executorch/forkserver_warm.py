"""Imported last by the forkserver (``isolation.PRELOAD``): one tiny export, lowered for XNNPACK, in that process.

torch.export, TorchDynamo and ExecuTorch's lowering build much on first use (decomposition tables, the XNNPACK
partitioner's patterns, lazy imports), and a forked child used to build it all again in every export. Children
of a server that did it once start with it built. Measured on a 2-core machine (torch 2.13, ExecuTorch 1.5.1):
an MLP's export child 9.9 s of CPU cold, 2.7 s warm; a one-layer Llama's 32.7 s, 22.0 s; the warm-up costs the
server ~9 s once, while the caller starts Prefect. It writes nothing and loads no ExecuTorch runtime; it does not run
where a GPU is visible (see below), and should it fail, the children only start cold (``WARMED`` says which).
"""

import logging
import warnings

#: Whether the warm-up ran to its end in this process (children forked from it inherit the value).
WARMED = False


def _gpu_visible() -> bool:
    """Whether torch sees a GPU, asked of NVML (``isolation.FORKSERVER_ENV``), which leaves forked children CUDA."""
    import torch

    return torch.cuda.is_available()


def _warm_up() -> None:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    example = (torch.zeros(1, 4),)
    # One thread: an OpenMP parallel region here would start libgomp's pool, which a forked child inherits without
    # its threads, and the child's first parallel region would then hang (seen: a matmul after a fork). Restored,
    # the setting starts no thread; each child starts its own pool.
    # No tqdm monitor either (the lowering shows progress bars): a thread holding tqdm's lock at a fork would leave
    # it held in the child.
    from tqdm import tqdm

    threads, monitor_interval = torch.get_num_threads(), tqdm.monitor_interval
    torch.set_num_threads(1)
    tqdm.monitor_interval = 0
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.export.export(model, example)  # non-strict, as a tensor model's methods are exported
            strict = torch.export.export(model, example, strict=True)  # TorchDynamo: decoder LMs and speech models
            to_edge_transform_and_lower(strict, partitioner=[XnnpackPartitioner()])
    finally:
        torch.set_num_threads(threads)
        tqdm.monitor_interval = monitor_interval


# Not where a GPU is visible: TorchDynamo and the lowering then save CUDA's RNG state, which initialises CUDA, and
# no child forked after that could use the GPU ("Cannot re-initialize CUDA in forked subprocess"; seen on an H100).
try:
    if not _gpu_visible():
        _warm_up()
        WARMED = True
except Exception as exc:  # noqa: BLE001 - a cold child is slower, never wrong
    logging.getLogger(__name__).debug("forkserver warm-up failed, children start cold: %s", exc)
