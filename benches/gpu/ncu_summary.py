"""Sums an Nsight Compute raw CSV (--csv --page raw, metric gpu__time_duration.sum) by kernel:
count, total and share of device time, top N, and the total. Usage: ncu_summary.py FILE [N] [LABEL]"""
import csv, re, sys
from collections import defaultdict


def kernel_rows(path):
    """(kernel name, stream or None, ms) of every kernel in an Nsight Compute raw CSV."""
    lines = [l for l in open(path, errors="replace") if not l.startswith("==")]
    rows = list(csv.reader(lines))
    if not rows:
        sys.exit(f"{path}: no rows")
    head, body = rows[0], rows[1:]
    name_i, t_i = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
    stream_i = head.index("Stream") if "Stream" in head else None
    scale = 1.0
    if body and not re.match(r"^[0-9.,]+$", body[0][t_i]):
        units = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3}
        scale = units.get(body[0][t_i].strip(), 1.0)
        body = body[1:]
    for r in body:
        if len(r) > t_i and r[t_i]:
            yield r[name_i], (r[stream_i] if stream_i is not None else None), float(r[t_i].replace(",", "")) * scale


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30
    label = sys.argv[3] if len(sys.argv) > 3 else path
    by, streams, total, n = defaultdict(lambda: [0, 0.0]), defaultdict(float), 0.0, 0
    for kernel, stream, ms in kernel_rows(path):
        name = re.sub(r"\(.*", "", kernel)[:70]
        by[name][0] += 1
        by[name][1] += ms
        if stream is not None:
            streams[stream] += ms
        total += ms
        n += 1
    print(f"NCU {label}: {n} kernels, {total:.1f} ms of device time")
    for name, (c, ms) in sorted(by.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"NCU {label}: {ms:9.2f} ms {100 * ms / total:5.1f}% {c:5d}x  {name}")
    for s, ms in sorted(streams.items(), key=lambda kv: -kv[1]):
        print(f"NCU {label}: stream {s}: {ms:.1f} ms")


if __name__ == "__main__":
    main()
