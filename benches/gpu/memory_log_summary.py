"""Where cubecl's exact-size blocks go, from a `BURN_DDP_MEMORY_LOG` file (cubecl's memory log
at its fullest): the blocks of each size at the end (≥ 1 MB; MB = 10^6 bytes, as cubecl prints),
and, after the last explicit clean-up (`bench` hands the warm-up's blocks back), the sequence in
which blocks of ≥ 10 MB were added (`N<MB>`) or reused (`r<MB>`) — one training step's
allocation order, read against the model's layers.

    python3 benches/gpu/memory_log_summary.py mem-r50.log[.xz]
"""
import lzma
import re
import sys

UNITS = {"B": 1e-6, "KB": 1e-3, "MB": 1.0, "GB": 1e3}
NEW = "[Main GPU Memory] Allocated a new memory page using persistent"
REUSE = re.compile(r"\[Main GPU Memory\] Reserved memory (\d+) using persistent memory")
SLICES = re.compile(r"\s*- Slices ([\d.]+) (\w+) =>\s+(\d+) free - (\d+) full - (\d+) total")


def tables(lines):
    """(line index, kind, {size MB: blocks}) for each new block, reuse and clean-up."""
    out = []
    for i, line in enumerate(lines):
        if line.startswith(NEW):
            table = {}
            for row in lines[i + 1:]:
                if row.startswith("["):
                    break
                m = SLICES.match(row)
                if m:
                    table[float(m.group(1)) * UNITS[m.group(2)]] = int(m.group(5))
            out.append((i, "new", table))
        elif "Manual memory cleanup" in line:
            out.append((i, "cleanup", {}))
        else:
            m = REUSE.match(line)
            if m:
                out.append((i, "reuse", int(m.group(1)) / 1e6))
    return out


def main(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        lines = f.read().split("\n")
    events = tables(lines)
    last = next((t for _, kind, t in reversed(events) if kind == "new"), {})
    print("blocks by size at the end (>= 1 MB):")
    for size, n in sorted(last.items(), reverse=True):
        if size >= 1:
            print(f"  {size:9.2f} MB x {n:3d} = {size * n * 1e6 / 2**30:7.3f} GiB")
    print(f"  all sizes: {sum(s * n for s, n in last.items()) * 1e6 / 2**30:.3f} GiB")
    start = max((k for k, (_, kind, _) in enumerate(events) if kind == "cleanup"), default=-1) + 1
    seq, prev = [], {}
    for _, kind, t in events[start:]:
        if kind == "reuse" and t >= 10:
            seq.append(f"r{t:.0f}")
        elif kind == "new":
            grown = [s for s in t if t[s] != prev.get(s, 0) and s >= 10]
            seq.extend(f"N{s:.0f}" for s in grown)
            prev = t
    print("after the last clean-up, blocks of >= 10 MB added (N) or reused (r), in order:")
    print(" ".join(seq))


if __name__ == "__main__":
    main(sys.argv[1])
