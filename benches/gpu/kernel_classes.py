"""Device time of one training step by class of kernel — convolutions and products, attention,
normalisation, element-wise, reductions, optimizer, loss, layout copies and casts, ordering
fences — from an Nsight Compute raw CSV (burn-vision under ncu) or from the `NCU label: ...`
lines of benches/pytorch_profile.py run with N = 0 (every kernel).
Usage: kernel_classes.py FILE LABEL [STEPS] [MINUS_FILE]   (STEPS: how many steps the file holds,
default 1; MINUS_FILE: a run one step shorter, subtracted class by class, so that a whole run
under ncu yields one step without a profiler range)"""
import os, re, sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_summary import kernel_rows  # noqa: E402  (the CSV reader, one for both scripts)

CLASSES = [  # first match wins
    ("attention", r"sdpa|fmha|flash|attn|dot_do_o|convert_dq"),
    ("optimizer", r"sgd|adam|multi_tensor|foreach"),
    ("loss", r"softmax|cross_entropy|ce_rows|ce_mean|nll_loss"),
    ("normalisation", r"norm|bn_|_bn|welford|batchnorm|layer_norm|fold_|stats|input_grad|grad_partials|grad_finalize"),
    ("pooling", r"pool"),
    ("convolution / product", r"conv|xmma|gemm|cutlass|nvjet|wgrad|dgrad|fprop|cublas|splitKreduce|sm90_|sm80_"),
    ("layout copy / cast", r"nchwToNhwc|nhwcToNchw|copy|transpose|permute|cast|convert|slice|cat_|bucket"),
    ("ordering fences", r"fence|store_flag|wait_flag"),
    ("reduction", r"reduce|triton_red|triton_per|sum_|mean"),
    ("element-wise", r"elemwise|elementwise|vectorized|unrolled|binop|triton_poi|fill|relu|gelu|add|mul|where|prng|random"),
]


def kernels(path):
    """(name, count, ms) of every kernel in the file."""
    text = open(path, errors="replace").read()
    if "NCU " in text and "Kernel Name" not in text:
        for m in re.finditer(r"^NCU [^:]+:\s+([0-9.]+) ms\s+[0-9.]+%\s+(\d+)x\s+(.*)$", text, re.M):
            yield m.group(3), int(m.group(2)), float(m.group(1))
        return
    for name, _stream, ms in kernel_rows(path):
        yield name, 1, ms


def classify(name):
    return next((c for c, pattern in CLASSES if re.search(pattern, name, re.I)), "other")


def main():
    path, label = sys.argv[1], sys.argv[2]
    steps = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
    by = defaultdict(lambda: [0, 0.0])
    for name, count, ms in kernels(path):
        c = classify(name)
        by[c][0] += count
        by[c][1] += ms
    if len(sys.argv) > 4:
        for name, count, ms in kernels(sys.argv[4]):
            c = classify(name)
            by[c][0] -= count
            by[c][1] -= ms
    total = sum(v[1] for v in by.values())
    print(f"CLASSES {label}: {total / steps:.2f} ms of device time per step")
    for c, (n, ms) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"CLASSES {label}: {c:24s} {ms / steps:8.2f} ms {100 * ms / max(total, 1e-9):5.1f}% {n / steps:7.0f} kernels")


if __name__ == "__main__":
    main()
