import resource, sys, time
from prefect_executorch import isolation

CODE = '''
import resource, torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
start = cpu()
if KIND == "mlp":
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)).eval(); ex = (torch.randn(2, 64),)
else:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10)).eval(); ex = (torch.randn(1, 3, 32, 32),)
with torch.no_grad():
    ep = torch.export.export(model, ex, strict=STRICT)
    prog = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
print(KIND, "strict" if STRICT else "nonstrict", f"{cpu() - start:.2f}", flush=True)
'''

def run(code):
    exec(code, {})

def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime

if __name__ == "__main__":
    warm = sys.argv[1] == "warm"
    t = time.monotonic()
    import multiprocessing
    multiprocessing.get_context("forkserver").set_forkserver_preload(isolation._preload(warm))
    multiprocessing.forkserver.ensure_running()
    ctx = multiprocessing.get_context("forkserver")
    for kind, strict in (("mlp", False), ("conv", False), ("mlp", True), ("mlp", False)):
        p = ctx.Process(target=run, args=(f"KIND={kind!r}; STRICT={strict}\n" + CODE,)); p.start(); p.join(300); print("exit", p.exitcode, flush=True)
    print("server ready+4 children wall", round(time.monotonic() - t, 1))
