"""Whether the convolution engines a profiled run chose were the fastest it measured: reads an
Nsight Compute raw CSV of `burn-vision bench` (--metrics gpu__time_duration.sum) whose first
steps ran under the profiler, finds each cuDNN plan search in it (every candidate engine runs
once untimed and twice timed, between the fence kernels that order burn-ddp's stream), and
compares the engine kept (the run right after the candidates) with the fastest candidate by
the profiler's own kernel times. A search timed under the profiler measures its overhead
per kernel, not the engines, so what it keeps is no longer the fastest; a profile whose
range starts after the warm-up (BURN_DDP_CUDA_PROFILER=1, ncu --profile-from-start off)
holds no search, and this says so.
Usage: plan_choices.py FILE [TOP]"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_summary import kernel_rows  # noqa: E402


def launches(path):
    """The kernels between each opening and closing fence of burn-ddp's stream: (name, ms)."""
    out, cur = [], None
    for name, _stream, ms in kernel_rows(path):
        if name.startswith("fence_wait"):
            cur = []
        elif name.startswith("fence_store"):
            if cur is not None:
                out.append(cur)
            cur = None
        elif cur is not None:
            cur.append((name[:110], ms))
    return out


def repeats(run, i):
    """k when run[i:i+k] comes three times in a row (a candidate: untimed, then timed twice)."""
    names = [n for n, _ in run]
    for k in range(1, 7):
        if i + 3 * k <= len(run) and names[i:i + k] == names[i + k:i + 2 * k] == names[i + 2 * k:i + 3 * k]:
            return k
    return 0


def searches(run):
    """[(candidates, kept)]: candidates as (kernel names, ms of one run), kept as (name, ms) rows."""
    out, cands, kept, i = [], [], [], 0
    while i < len(run):
        k = repeats(run, i)
        if k:
            if kept:
                out.append((cands, kept))
                cands, kept = [], []
            cands.append((tuple(n for n, _ in run[i:i + k]), sum(ms for _, ms in run[i + k:i + 3 * k]) / 2))
            i += 3 * k
        else:
            kept.append(run[i])
            i += 1
    if cands and kept:
        out.append((cands, kept))
    return out


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10
    found = [s for run in launches(path) if len(run) > 6 for s in searches(run)]
    if not found:
        print(f"PLANS {path}: no plan search in this profile")
        return
    rows = []
    for cands, kept in found:
        kept_ms = sum(ms for _, ms in kept)
        best = min(cands, key=lambda c: c[1])
        rows.append((kept_ms - best[1], kept_ms, best[1], kept[-1][0], best[0][-1]))
    slower = [r for r in rows if r[1] > 1.02 * r[2]]
    print(f"PLANS {path}: {len(rows)} searches; {len(slower)} kept an engine over 2 % slower than the fastest "
          f"candidate; one run of each kept engine {sum(r[1] for r in rows):.2f} ms, of each fastest "
          f"{sum(r[2] for r in rows):.2f} ms (lost: {sum(max(r[0], 0) for r in rows):.2f} ms, at least that per step)")
    for lost, kept_ms, best_ms, kept_name, best_name in sorted(rows, reverse=True)[:top]:
        print(f"PLANS   lost {lost:.3f} ms: kept {kept_ms:.3f} ms ({kept_name[:60]}), fastest {best_ms:.3f} ms ({best_name[:60]})")


if __name__ == "__main__":
    main()
