"""Summary table of benches/gpu/memory.sh's log: device memory of each run, and where burn-cuda's
pools hold it (per stream: live tensors / reserved bytes, after the warm-up and at the end)."""
import sys

from bench_log import results


def pools(m):
    if not m:
        return "-"
    s = " ".join(f"s{p['stream']}:{p['in_use'] / 2**30:.1f}/{p['reserved'] / 2**30:.1f}" for p in m["streams"])
    return f"{m['in_use_gib']:5.2f}/{m['reserved_gib']:5.2f} [{s}]"


for name, framework, r in results(sys.argv[1]):
    if framework == "pytorch":
        print(f"{name:20} pytorch {r['img_per_s']:7.1f} img/s  device {r['device_used_gib']:5.2f} GiB"
              f"  torch reserved {r['reserved_gib']:5.2f}  peak allocated {r['peak_mem_gib']:5.2f}"
              f"  allocated after a forward {r.get('allocated_after_forward_gib') or 0:5.2f}")
    else:
        print(f"{name:20} burn    {r['img_per_s']:7.1f} img/s  device {r['device_used_gib'] or 0:5.2f} GiB"
              f"  pools in use/reserved GiB: after warm-up {pools(r.get('memory_after_warmup'))}  end {pools(r.get('memory'))}"
              f"  live after a forward {r.get('in_use_after_forward_gib') or 0:5.2f} GiB  first step {r['first_step']['total_s']:.1f} s")
