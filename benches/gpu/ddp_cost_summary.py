"""The summary table of benches/gpu/ddp_cost.sh: DDP over a one-rank NCCL group against the same
run without it, ours and PyTorch's, pair by pair (each DDP run against the plain run before it).

usage: python3 benches/gpu/ddp_cost_summary.py LOG
"""
import json
import re
import sys


def sections(path):
    """{step name: [lines]} in the order the steps ran."""
    out, name = {}, None
    for line in open(path, errors="replace"):
        m = re.match(r"=== (\S+): ", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif re.match(r"=== \S+ rc=", line):
            name = None
        elif name:
            out[name].append(line.rstrip("\n"))
    metrics = {}
    for line in open(path, errors="replace"):
        m = re.match(r"METRICS (\S+) (\{.*\})$", line.strip())
        if m:
            metrics.setdefault(m.group(1), []).append(json.loads(m.group(2)))
    return out, metrics


def result(lines):
    """The run's JSON result: burn-vision bench's line, or PyTorch's RESULT line."""
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("RESULT {"):
            return json.loads(line[len("RESULT "):])
        if line.startswith("{") and '"img_per_s"' in line:
            return json.loads(line)
    return None


def tutorial_epochs(lines):
    """PyTorch's tutorial job: its per-epoch RESULT records."""
    out = [json.loads(line.strip()[len("RESULT "):]) for line in lines if line.strip().startswith("RESULT {")]
    return [r for r in out if r.get("mode") == "tutorial"]


def steady(records, skip_first=True):
    """Mean steady img/s over the epochs (the first epoch's warm-up left out when there are more)."""
    vals = [r.get("steady_img_per_s") for r in records if r.get("steady_img_per_s")]
    if skip_first and len(vals) > 1:
        vals = vals[1:]
    return sum(vals) / len(vals) if vals else None


def host(r):
    """The training thread's forward / backward / optimizer seconds over the timed steps."""
    h = r.get("host") or {}
    return "/".join(f"{h.get(k, 0):.3f}" for k in ("forward_s", "backward_s", "optimizer_s"))


def f(v, fmt="{:.0f}"):
    return "n/a" if v is None else fmt.format(v)


def backend_spans(cost):
    """DDP's spans on burn-fusion's and cubecl's device thread, ms per step (newer builds)."""
    spans = cost.get("backend_thread_spans") or {}
    parts = cost.get("collective_parts") or {}
    text = ", ".join(f"{k.removeprefix('ddp: ')} {v:.3f}" for k, v in sorted(spans.items())) or "not recorded"
    if parts:  # builds from 2026-12-05 on: the NCCL enqueue's own parts
        text += "; collective: " + ", ".join(f"{k.removeprefix('ddp: ')} {v:.3f}" for k, v in sorted(parts.items()))
    return text


def phase_split(inter):
    """The training thread's ms per step by phase, plain steps against DDP steps (builds from
    2026-12-06 on)."""
    if "plain_host_ms" not in inter:
        return ""
    ms = lambda v: "/".join(f"{x:.2f}" for x in v)
    return f"; per step fwd/bwd/opt ms plain {ms(inter['plain_host_ms'])}, DDP {ms(inter['ddp_host_ms'])}"


def main(path):
    runs, metrics = sections(path)
    for name, lines in runs.items():
        if name.startswith("check"):
            for line in lines:
                if line.startswith("RESULT "):
                    print(f"{name}: {line}")
    rows = []
    ratios = {}
    for base in ["r50", "vitb16", "r18s", "r18s_pinned"]:
        for i in range(1, 13):
            plain, ddp = result(runs.get(f"{base}_plain_{i}", [])), result(runs.get(f"{base}_ddp_{i}", []))
            no_overlap = result(runs.get(f"{base}_ddp_no_overlap_{i}", []))
            if plain and no_overlap:
                cost = no_overlap.get("ddp") or {}
                rows.append((f"{base} ours pair {i}, DDP without overlap", plain["img_per_s"], no_overlap["img_per_s"],
                             f"host fwd/bwd/opt s {host(plain)} / {host(no_overlap)}; DDP host {f(cost.get('host_ms'), '{:.2f}')} ms/step, {f(cost.get('operations'), '{:.0f}')} ops/step"))
            if plain and ddp:
                ratios.setdefault(base, []).append(ddp["img_per_s"] / plain["img_per_s"])
                cost = ddp.get("ddp") or {}
                rows.append((f"{base} ours pair {i}", plain["img_per_s"], ddp["img_per_s"],
                             f"mem {f(plain.get('device_used_gib'), '{:.2f}')} / {f(ddp.get('device_used_gib'), '{:.2f}')} GiB; "
                             f"first step {f(plain['first_step']['total_s'], '{:.1f}')} / {f(ddp['first_step']['total_s'], '{:.1f}')} s; "
                             f"DDP host {f(cost.get('host_ms'), '{:.2f}')} ms/step, {f(cost.get('operations'), '{:.0f}')} ops/step, "
                             f"backend threads {f(cost.get('backend_threads_ms'), '{:.2f}')} ms/step, "
                             f"{f(cost.get('buckets'), '{:.0f}')} buckets ({f(cost.get('on_device'), '{:.0f}')} on device, "
                             f"{f(cost.get('started_in_backward'), '{:.0f}')} in backward), exposed {f(cost.get('exposed_ms'), '{:.2f}')} ms; "
                             f"kernel cache {ddp.get('kernel_cache')}; host fwd/bwd/opt s {host(plain)} / {host(ddp)}"))
            tp, td = result(runs.get(f"{base}_torch_{i}", [])), result(runs.get(f"{base}_torch_ddp_{i}", []))
            if tp and td:
                rows.append((f"{base} PyTorch pair {i}", tp["img_per_s"], td["img_per_s"],
                             f"peak {tp['peak_mem_gib']:.2f} / {td['peak_mem_gib']:.2f} GiB allocated, device {tp['device_used_gib']:.2f} / {td['device_used_gib']:.2f} GiB"))
    for base in ["r18", "tut", "old_r18"]:
        for i in range(1, 4):
            p, d = metrics.get(f"{base}_plain_{i}"), metrics.get(f"{base}_ddp_{i}")
            if p and d:
                rows.append((f"{base} train pair {i}", steady(p), steady(d),
                             "val top-1 by epoch " + " ".join(f"{a['val_acc']:.4f}/{b['val_acc']:.4f}" for a, b in zip(p, d))
                             + "; train loss " + " ".join(f"{a['train_loss']:.4f}/{b['train_loss']:.4f}" for a, b in zip(p, d))))
    # PyTorch's tutorial job plain and under DDP (benches/pytorch_baseline.py tutorial ... [ddp]).
    for i in range(1, 4):
        p, d = (tutorial_epochs(runs.get(f"tut_torch_{way}_{i}", [])) for way in ("plain", "ddp"))
        if p and d:
            rows.append((f"tut PyTorch pair {i}", steady(p), steady(d),
                         "val top-1 by epoch " + " ".join(f"{a['val_acc']:.4f}/{b['val_acc']:.4f}" for a, b in zip(p, d))))
    # `bench --ddp --ddp-interleave N`: plain and DDP blocks of one process.
    for name, lines in runs.items():
        r = result(lines) if "interleaved" in name else None
        inter = (r or {}).get("interleaved")
        if inter:
            cost = r.get("ddp") or {}
            pairs = " ".join(f"{x:.3f}" for x in inter["pair_ratios"])
            rows.append((f"{name}: {r['config']['steps']} steps in blocks of {inter['block_steps']}, one process",
                         inter["plain_img_per_s"], inter["ddp_img_per_s"],
                         f"median pair {inter['median_pair_ratio']:.3f}; pairs {pairs}; DDP host {f(cost.get('host_ms'), '{:.2f}')} ms/step, "
                         f"backend threads {f(cost.get('backend_threads_ms'), '{:.2f}')} ms/step ({backend_spans(cost)}), "
                         f"enqueue thread {f(cost.get('enqueue_thread_ms'), '{:.2f}')} ms/step, "
                         f"exposed {f(cost.get('exposed_ms'), '{:.2f}')} ms; host fwd/bwd/opt s {host(r)}"
                         + phase_split(inter)))
    comp = result(runs.get("r50_ddp_bf16", []))
    if comp:
        rows.append(("r50 ours --ddp --grad-compression bf16 (vs pair 3's DDP)", (result(runs.get("r50_ddp_3", [])) or {}).get("img_per_s"), comp["img_per_s"], ""))
    for base, r in ratios.items():
        if len(r) > 2:
            r = sorted(r)
            rows.append((f"{base}: the median of {len(r)} pairs' DDP / plain (range {r[0]:.3f}-{r[-1]:.3f})", None, None,
                         f"median {r[len(r) // 2] if len(r) % 2 else (r[len(r) // 2 - 1] + r[len(r) // 2]) / 2:.3f}"))
    print()
    print("| run | plain img/s | DDP img/s | DDP / plain | notes |")
    print("|---|---:|---:|---:|---|")
    for name, a, b, note in rows:
        ratio = f"{b / a:.3f}" if a and b else "n/a"
        print(f"| {name} | {f(a)} | {f(b)} | {ratio} | {note} |")


if __name__ == "__main__":
    main(sys.argv[1])
