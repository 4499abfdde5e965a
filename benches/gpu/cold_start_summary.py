"""Summary table of benches/gpu/cold_start.sh's log: one row per step that printed a result."""
import sys

from bench_log import results

for name, framework, r in results(sys.argv[1]):
    f = r.get("first_step", {})
    if framework == "pytorch":
        print(f"{name:18} pytorch {r['img_per_s']:8.1f} img/s  first step {f.get('total_s', 0):6.1f} s (step {f.get('step_s', 0):5.1f} s)"
              f"  device {r['device_used_gib']:5.1f} GiB  reserved {r['reserved_gib']:5.1f}  allocated {r['peak_mem_gib']:5.1f}")
    else:
        print(f"{name:18} burn    {r['img_per_s']:8.1f} img/s  first step {f['total_s']:6.1f} s (step {f['step_s']:5.1f} s, cuDNN {f['cudnn_s']:4.1f} s,"
              f" setup {f['setup_s']:4.1f} s)  device {r['device_used_gib'] or 0:5.1f} GiB")
