"""The summary of benches/gpu/open_goals.sh's and against_compile.sh's logs: the checks'
verdicts (every FAIL line in full), DDP's interleaved rows (benches/gpu/ddp_cost_summary.py's
table), each run's img/s, host cores busy and GPU memory, ours against PyTorch eager and
torch.compile where a workload has both, and the training runs epoch by epoch (ours and
PyTorch's tutorial).

usage: python3 benches/gpu/open_goals_summary.py LOG
"""
import json
import re
import sys

import ddp_cost_summary
from bench_log import verdict


def steps(path):
    """[(name, rc, wall, lines)] in the order the steps ran."""
    out, cur = [], None
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        if m := re.match(r"=== (\S+) rc=(\d+) wall=([\d.]+)s", line):
            if cur:
                out.append((cur[0], int(m[2]), float(m[3]), cur[1]))
            cur = None
        elif m := re.match(r"=== (\S+): ", line):
            cur = (m[1], [])
        elif cur:
            cur[1].append(line)
    return out


def speed(lines):
    """(img/s, GPU memory GiB) of the step's JSON result, ours or PyTorch's (None where none)."""
    r = ddp_cost_summary.result(lines) or {}
    return r.get("img_per_s"), r.get("device_used_gib") or (r.get("memory") or {}).get("device_used_gib")


def ratios(runs):
    """Per workload that has a `W_compile` step: each of ours (`W_ours*`) against it and `W_eager`."""
    ips = {name: speed(lines)[0] for name, _, _, lines in runs}
    for name, compiled in ips.items():
        if not (name.endswith("_compile") and compiled):
            continue
        w = name.removesuffix("_compile")
        eager = ips.get(f"{w}_eager")
        for ours, v in ((n, v) for n, v in ips.items() if n.startswith(f"{w}_ours") and v):
            vs_eager = f", {v / eager:.3f}x eager ({eager:.0f})" if eager else ""
            print(f"{ours}: {v:.0f} img/s = {v / compiled:.3f}x torch.compile ({compiled:.0f}){vs_eager}")


def main(path):
    ddp_cost_summary.main(path)
    print()
    runs = steps(path)
    _, metrics = ddp_cost_summary.sections(path)
    print("| step | rc | wall s | img/s | GPU GiB | host cores busy | checks ok / FAIL |")
    print("|---|---:|---:|---:|---:|---:|---|")
    fails = []
    for name, rc, wall, lines in runs:
        ips, mem = speed(lines)
        cores = next((m[1] for l in lines if (m := re.match(r"CORES busy ([\d.]+)", l))), "")
        verdicts = [verdict(l) for l in lines if l.startswith("RESULT check=")]
        fails += [f"{name}: {l}" for l in lines if l.startswith("RESULT check=") and verdict(l) == "FAIL"]
        fails += [f"{name}: {l}" for l in lines if l.startswith("FAIL") or "panicked" in l]
        checks = f"{verdicts.count('ok')} / {verdicts.count('FAIL')}" if verdicts else ""
        print(f"| {name} | {rc} | {wall:.1f} | {f'{ips:.0f}' if ips else ''} | "
              f"{f'{mem:.2f}' if mem else ''} | {cores} | {checks} |")
    for line in fails:
        print("FAILED", line[:400])
    print()
    ratios(runs)
    print()
    print("training runs, epoch by epoch: seconds, steady img/s, data wait s, validation top-1")
    for name, rc, wall, lines in runs:
        epochs = [json.loads(l[7:]) for l in lines if l.startswith("RESULT {") and '"mode": "tutorial"' in l]
        for e in epochs + metrics.get(name, []):
            print(f"  {name} epoch {e.get('epoch')}: {e.get('seconds', 0):.1f} s, "
                  f"{e.get('steady_img_per_s') or 0:.0f} img/s, wait {e.get('data_wait_s', 0):.3f} s, "
                  f"val {e.get('val_acc', 0):.4f}")


if __name__ == "__main__":
    main(sys.argv[1])
