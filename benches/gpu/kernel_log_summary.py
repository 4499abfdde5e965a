#!/usr/bin/env python3
"""Summarises a BURN_DDP_KERNEL_LOG file (cubecl's compilation and autotune logs): how many
kernels were compiled, grouped by name (count, CUDA source lines), and how many operations were
autotuned with how many candidates each. Usage: kernel_log_summary.py FILE"""
import collections, re, sys

def main(path):
    text = open(path, errors="replace").read()
    blocks = re.findall(r"\[START_KERNEL_COMPILATION\](.*?)\[END_KERNEL_COMPILATION\]", text, re.S)
    by_name = collections.defaultdict(lambda: [0, 0])
    for b in blocks:
        m = re.search(r"^name: (.*)$", b, re.M)
        name = (m.group(1) if m else "?").split("<")[0].strip()[:70]
        src = b.split("source:", 1)[-1]
        by_name[name][0] += 1
        by_name[name][1] += src.count("\n")
    print(f"kernels compiled: {len(blocks)}, CUDA source lines: {sum(v[1] for v in by_name.values())}")
    print(f"{'kernel':70} {'n':>4} {'lines':>7}")
    for name, (n, lines) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:70} {n:4} {lines:7}")
    tunes = text.split("Fastest result ")[1:]
    per_op = collections.Counter()
    candidates = 0
    for t in tunes:
        head = t.split("\n", 1)[0]
        op = re.split(r"[-:]", head, 1)[0][:60]
        per_op[op] += 1
        candidates += len(re.findall(r"^\s*(?:AutotuneOutcome|Skip|Unknown|Launch|name)", t.split("Fastest result ")[0], re.M))
    print(f"autotuned keys: {len(tunes)}; result lines listed: {candidates}")
    for op, n in per_op.most_common(20):
        print(f"  {n:4} x {op}")

if __name__ == "__main__":
    main(sys.argv[1])
