"""One training step's kernels, grouped by name and launch shape, from two whole-run Nsight
Compute raw CSVs of the same bench run with N and N + 1 timed steps: the longer run's extra
kernels, taken just before the tail the two runs end with, are one step. Prints each group's
total, count and time per kernel, largest first, for every kernel or one class of
kernel_classes.py, and with --short the names cut before their template arguments and types
(`stats_finalize_f_bf16` and `_f_f32` together).
Usage: step_kernels.py SHORTER.csv LONGER.csv [CLASS] [--short] [--top N]"""
import argparse, csv, os, re, sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_classes import classify  # noqa: E402


def rows(path):
    """(name, ns, grid, block) of every kernel of an Nsight Compute raw CSV, in launch order."""
    lines = [l for l in open(path, errors="replace") if not l.startswith("==")]
    table = list(csv.reader(lines))
    head, body = table[0], table[1:]
    name_i, t_i = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
    grid_i, block_i = head.index("Grid Size"), head.index("Block Size")
    scale = 1.0
    if body and not re.match(r"^[0-9.,]+$", body[0][t_i]):
        scale = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(body[0][t_i].strip(), 1.0)
        body = body[1:]
    return [(r[name_i], float(r[t_i].replace(",", "")) * scale, r[grid_i], r[block_i]) for r in body if len(r) > t_i and r[t_i]]


def one_step(shorter, longer):
    """The longer run's kernels that the shorter run lacks, before the tail both end with."""
    tail = 0
    while tail < len(shorter) and shorter[-1 - tail][0] == longer[-1 - tail][0]:
        tail += 1
    extra = len(longer) - len(shorter)
    if extra <= 0:
        sys.exit("the second file must be the run with more steps")
    return longer[len(longer) - tail - extra:len(longer) - tail], tail


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("shorter"); p.add_argument("longer"); p.add_argument("cls", nargs="?")
    p.add_argument("--short", action="store_true"); p.add_argument("--top", type=int, default=40)
    a = p.parse_args()
    step, tail = one_step(rows(a.shorter), rows(a.longer))
    total = sum(k[1] for k in step)
    print(f"STEP: {len(step)} kernels, {total / 1e6:.2f} ms of device time (a common tail of {tail} kernels left out)")
    groups = defaultdict(lambda: [0, 0.0])
    for name, ns, grid, block in step:
        if a.cls and classify(name) != a.cls:
            continue
        short = re.sub(r"\(.*", "", name)[:70]
        key = re.sub(r"_(f|i|o|e|t|c)_(bf16|f16|f32|i64|u32).*|_n_\d+$", "", short) if a.short else f"{short} grid{grid} block{block}"
        groups[key][0] += 1
        groups[key][1] += ns
    shown = sum(v[1] for v in groups.values())
    print(f"STEP: {a.cls or 'all classes'}: {shown / 1e6:.3f} ms in {sum(v[0] for v in groups.values())} kernels")
    for key, (n, ns) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:a.top]:
        print(f"STEP: {ns / 1e3:9.1f} us {n:5d}x {ns / n / 1e3:7.1f} us each  {key}")


if __name__ == "__main__":
    main()
