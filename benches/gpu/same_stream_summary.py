"""Summary of `benches/gpu/same_stream.sh`'s log: the checks, each run's speed, and per model
and round the same-stream / fenced ratio (and each against torch.compile)."""
import sys

from bench_log import results, verdict


def main(path):
    checks, step = [0, 0], None
    for line in open(path, errors="replace"):
        if line.startswith("=== ") and ":" in line:
            step = line[4:].split(":")[0]
        elif step == "checks" and line.startswith("RESULT check="):
            line = line.strip()
            if verdict(line):
                checks[0 if verdict(line) == "ok" else 1] += 1
            if any(k in line for k in ("stream", "patch_embed")) or not line.endswith(" ok"):
                print(line)
    print(f"checks: {checks[0]} ok, {checks[1]} failed")
    runs = {name: r for name, _, r in results(path)}
    for name, r in runs.items():
        mem = r.get("device_used_gib") or r.get("peak_mem_gib") or 0.0
        first = (r.get("first_step") or {}).get("total_s")
        print(f"{name}: {r['img_per_s']:.0f} img/s, GPU memory {mem:.2f} GiB"
              + (f", first step done {first:.1f} s after start" if first else ""))
    for model in ("r50", "vitb16"):
        comp = runs.get(f"{model}_compile", {}).get("img_per_s")
        for i in (1, 2):
            same, fenced = (runs.get(f"{model}_{v}_{i}", {}).get("img_per_s") for v in ("same", "fenced"))
            if same and fenced:
                extra = f", same / torch.compile {same / comp:.3f}, fenced / torch.compile {fenced / comp:.3f}" if comp else ""
                print(f"{model} round {i}: same stream / fenced {same / fenced:.3f}{extra}")


if __name__ == "__main__":
    main(sys.argv[1])
