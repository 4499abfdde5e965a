"""Summary tables of benches/gpu/first_hour.sh's log: the tutorial's job per run (wall time, each
epoch's seconds, steady img/s, validation top-1) and the bench rows (img/s, first step, memory)."""
import json
import re
import sys

from bench_log import results

log = sys.argv[1]
walls, epochs, name = {}, {}, None
for line in open(log):
    if m := re.match(r"=== (\S+) rc=(\d+) wall=([\d.]+)s", line):
        walls[m[1]] = (int(m[2]), float(m[3]))
    elif line.startswith("=== ") and ":" in line:
        name = line[4:].split(":")[0]
    elif line.startswith("METRICS {"):
        epochs.setdefault(name, []).append(json.loads(line[8:]))
    elif line.startswith("RESULT {") and '"mode": "tutorial"' in line:
        epochs.setdefault(name, []).append(json.loads(line[7:]))

if epochs:
    print("tutorial job: run | rc | wall s | per-epoch seconds | steady img/s per epoch | val top-1 per epoch")
for run, eps in epochs.items():
    rc, wall = walls.get(run, (-1, 0.0))
    secs = " ".join(f"{e['seconds']:.1f}" for e in eps)
    ips = " ".join(f"{e.get('steady_img_per_s') or 0:.0f}" for e in eps)
    acc = " ".join(f"{100 * e['val_acc']:.1f}" for e in eps)
    print(f"{run:18} rc={rc} wall {wall:6.1f} s | {secs} | {ips} | {acc}")

for run, framework, r in results(log):
    if "img_per_s" not in r:  # the tutorial's lines, above
        continue
    f = r.get("first_step", {})
    if framework == "pytorch":
        print(f"{run:18} pytorch {r['img_per_s']:8.1f} img/s  first step {f.get('total_s', 0):6.1f} s (step {f.get('step_s', 0):5.1f} s)"
              f"  device {r['device_used_gib']:5.1f} GiB  reserved {r['reserved_gib']:5.1f}  allocated {r['peak_mem_gib']:5.1f}"
              f"  after forward {r.get('allocated_after_forward_gib') or 0:5.2f}")
    else:
        mem = r.get("memory") or {}
        print(f"{run:18} burn    {r['img_per_s']:8.1f} img/s  first step {f['total_s']:6.1f} s (step {f['step_s']:5.1f} s, cuDNN {f['cudnn_s']:4.1f} s,"
              f" setup {f['setup_s']:4.1f} s)  device {r['device_used_gib'] or 0:5.1f} GiB  reserved {mem.get('reserved_gib', 0):5.1f}"
              f"  after forward {r.get('in_use_after_forward_gib') or 0:5.2f}")
