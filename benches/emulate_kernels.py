"""Runs burn-ddp's own CUDA C kernels on the CPU, for a machine without a GPU: each source (the
storage-type helpers of burn-ddp/src/nn/cuda/kernels/nvrtc.rs, then a kernel file's source) is
compiled by g++ with the few CUDA built-ins it uses emulated — each GPU thread a host thread (or
one turn of a loop), a warp's shuffles exchanges between barriers, bit casts, vector structs,
f16 conversions through GCC's _Float16 in place of the PTX `cvt` instructions — and every path
is compared with f64:
  - the fused bias + GELU (nn/cuda/ops/gelu.rs): f32/bf16/f16, with and without a bias, forward
    and backward, four elements per thread or one, a grid-stride loop of several rounds;
  - the layer-norm forward (nn/cuda/ops/layer_norm.rs): bf16/f16, widths 96 to 1024 and a
    partial chunk, more rows than one pass of the grid; y, each row's mean and 1/sigma.
Bytes past each output must stay untouched. It checks the kernels' indexing and arithmetic,
not the GPU's (`burn-ddp-gpu-checks bias-gelu layer-norm` does that on a GPU).

usage: python3 benches/emulate_kernels.py [GELU_RS [LAYER_NORM_RS]]   (g++ 12 or later, x86-64;
       the arguments: other copies of those files, e.g. deliberately broken ones, to see a
       check fail)
"""
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRELUDE = r'''
#include <cstdio>
#include <cmath>
#include <cstring>
#include <vector>
#include <random>
#include <thread>
#include <barrier>
#include <functional>
#define __device__
#define __forceinline__ inline
#define __global__
struct dim3 { unsigned x, y, z; };
static dim3 blockIdx, blockDim, gridDim;
static thread_local dim3 threadIdx;  // each emulated GPU thread is a host thread (or the loop of one)
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }

inline float rsqrtf(float v) { return 1.0f / sqrtf(v); }
// A warp's 32 lanes run as 32 host threads; a shuffle is an exchange between two barriers.
static float shfl_slot[32];
static std::barrier<>* warp_barrier;
inline float __shfl_xor_sync(unsigned, float v, int o) {
    const int lane = threadIdx.x & 31;
    shfl_slot[lane] = v;
    warp_barrier->arrive_and_wait();
    const float r = shfl_slot[lane ^ o];
    warp_barrier->arrive_and_wait();
    return r;
}
// Runs `body` as every thread of a grid of `grid` blocks of `threads`, a warp at a time.
static void run_grid(unsigned grid, unsigned threads, const std::function<void()>& body) {
    gridDim.x = grid; blockDim.x = threads;
    std::barrier<> b(32);
    warp_barrier = &b;
    for (unsigned bx = 0; bx < grid; bx++) {
        blockIdx.x = bx;
        for (unsigned w = 0; w < threads / 32; w++) {
            std::vector<std::thread> lanes;
            for (unsigned l = 0; l < 32; l++) lanes.emplace_back([&, w, l] { threadIdx.x = w * 32 + l; body(); });
            for (auto& t : lanes) t.join();
        }
    }
}
'''
GELU_HARNESS = r'''static double gelu_d(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static double gelu_grad_d(double x) { return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI); }
// store / load as the kernel's types, through its own helpers
static void put(std::vector<unsigned char>& buf, int t, long long i, float v) { st(buf.data(), i, t, v); }
static double get(const std::vector<unsigned char>& buf, int t, long long i) { return ld(buf.data(), i, t); }
static int run(int t, long long rows, int cols, bool bias, bool back, int vec, unsigned grid) {
    long long len = rows * cols; int es = t == 0 ? 4 : 2;
    std::vector<unsigned char> y(len * es + 16), b(cols * es + 16), dh(len * es + 16), out(len * es + 16, 0xAB);
    std::mt19937 rng(7); std::uniform_real_distribution<float> u(-4.f, 4.f);
    for (long long i = 0; i < len; i++) { put(y, t, i, u(rng)); put(dh, t, i, u(rng) * 0.25f); }
    for (int c = 0; c < cols; c++) put(b, t, c, u(rng) * 0.5f);
    gridDim.x = grid; blockDim.x = 256;
    for (unsigned bx = 0; bx < grid; bx++) for (unsigned tx = 0; tx < 256; tx++) {
        blockIdx.x = bx; threadIdx.x = tx;
        bias_gelu(y.data(), bias ? b.data() : nullptr, back ? dh.data() : nullptr, out.data(), len, cols, t, vec);
    }
    double worst = 0;
    // Half an ulp is at most 2^-8 of a bf16 value, 2^-11 of an f16 one (taken twice); 1 % for
    // f32's own arithmetic.
    double unit = t == 0 ? 1e-6 : (t == 1 ? 1.01 / 256 : 1.01 / 1024);
    for (long long i = 0; i < len; i++) {
        double x = get(y, t, i) + (bias ? get(b, t, i % cols) : 0.0);
        double want = back ? get(dh, t, i) * gelu_grad_d((float)x) : gelu_d((float)x);
        double got = get(out, t, i);
        double e = fabs(got - want) / (unit * fabs(want) + 1e-6);
        if (!(e <= worst)) worst = e;
    }
    // nothing written past the end
    bool tail = true; for (size_t k = len * es; k < out.size(); k++) tail &= out[k] == 0xAB;
    printf("t=%d rows=%lld cols=%d bias=%d back=%d vec=%d grid=%u err/bound=%.3f tail_untouched=%d %s\n", t, rows, cols, bias, back, vec, grid, worst, tail, worst <= 1.0 && tail ? "ok" : "FAIL");
    return worst <= 1.0 && tail;
}
static int gelu_main() {
    int ok = 1;
    for (int t = 0; t < 3; t++) for (int bias = 0; bias < 2; bias++) for (int back = 0; back < 2; back++) {
        ok &= run(t, 37, 3072 / 16, bias, back, 8, 3);     // eight a thread, grid-stride over several rounds
        ok &= run(t, 37, 3072 / 16, bias, back, 4, 3);     // four a thread, the same
        ok &= run(t, 33, 10, bias, back, 0, 2);            // one element per thread, cols not a multiple of 4
        ok &= run(t, 5, 12, bias, back, 4, 1);
    }
    // bf16 rounding: ties to even, NaN stays NaN, inf stays inf
    unsigned short r1 = to16(__uint_as_float(0x3f808000u), 1), r2 = to16(__uint_as_float(0x3f818000u), 1);
    unsigned short rn = to16(NAN, 1), ri = to16(INFINITY, 1);
    bool rounding = r1 == 0x3f80 && r2 == 0x3f82 && (rn & 0x7fff) > 0x7f80 && ri == 0x7f80;
    printf("bf16 rounding ties-to-even/NaN/inf %s\n", rounding ? "ok" : "FAIL");
    ok &= rounding;
    return ok;
}
'''
LN_HARNESS = r'''
// ln_forward against f64: y, mean and 1/σ, bf16 and f16, several widths (a partial last chunk
// of 128), more rows than one pass of the grid.
static int ln_case(int t, long long rows, int d, unsigned grid) {
    const int es = 2;
    std::vector<unsigned char> x(rows * d * es + 16), y(rows * d * es + 16, 0xAB);
    std::vector<float> g(d), b(d), mean(rows + 4, -7.f), rstd(rows + 4, -7.f);
    std::mt19937 rng(5); std::uniform_real_distribution<float> u(-3.f, 3.f);
    for (long long i = 0; i < rows * d; i++) st(x.data(), i, t, u(rng) + 1.5f);
    for (int i = 0; i < d; i++) { g[i] = u(rng); b[i] = u(rng) * 0.3f; }
    const float eps = 1e-6f;
    run_grid(grid, 256, [&] { ln_forward(x.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, d, eps, t); });
    double worst = 0, worst_stats = 0;
    const double unit = t == 1 ? 1.01 / 256 : 1.01 / 1024;
    for (long long r = 0; r < rows; r++) {
        double m = 0, v = 0;
        for (int i = 0; i < d; i++) m += ld(x.data(), r * d + i, t);
        m /= d;
        for (int i = 0; i < d; i++) { double c = ld(x.data(), r * d + i, t) - m; v += c * c; }
        const double rs = 1.0 / sqrt(v / d + eps);
        worst_stats = fmax(worst_stats, fmax(fabs(mean[r] - m) / (1e-5 * (fabs(m) + 1)), fabs(rstd[r] - rs) / (1e-5 * rs)));
        for (int i = 0; i < d; i++) {
            const double want = (ld(x.data(), r * d + i, t) - m) * rs * g[i] + b[i];
            const double e = fabs(ld(y.data(), r * d + i, t) - want) / (unit * fabs(want) + 1e-4);
            if (!(e <= worst)) worst = e;
        }
    }
    bool tail = mean[rows] == -7.f && rstd[rows] == -7.f;
    for (size_t k = rows * d * es; k < y.size(); k++) tail &= y[k] == 0xAB;
    const bool ok = worst <= 1.0 && worst_stats <= 1.0 && tail;
    printf("ln_forward t=%d rows=%lld d=%d grid=%u err/bound y=%.3f stats=%.3f untouched_past_end=%d %s\n", t, rows, d, grid, worst, worst_stats, tail, ok ? "ok" : "FAIL");
    return ok;
}
static int ln_main() {
    int ok = 1;
    for (int t = 1; t < 3; t++) {
        ok &= ln_case(t, 37, 96, 2);     // 16 warps, 37 rows: the grid-stride loop; chunks 0 of 8 only
        ok &= ln_case(t, 9, 768, 1);     // ViT-B's width: 6 full chunks of 128
        ok &= ln_case(t, 5, 1024, 1);    // the widest row
        ok &= ln_case(t, 3, 100, 1);     // a partial chunk (lanes past 100 idle)
    }
    return ok;
}
'''
MAIN = r'''
int main() {
    int ok = gelu_main();
    ok &= ln_main();
    printf(ok ? "ALL OK\n" : "SOME FAILED\n");
    return !ok;
}
'''
# The PTX conversions and their host stand-ins.
SWAPS = [
    ('float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(s)); return f;',
     "_Float16 h; memcpy(&h, &s, 2); return (float)h;"),
    ('unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;',
     "_Float16 h = (_Float16)f; unsigned short r; memcpy(&r, &h, 2); return r;"),
]


def kernel(path):
    """The CUDA C after the storage-type helpers in a kernel file's `concat!`."""
    src = open(path).read()
    m = re.search(r'storage_types!\(\),\s*r#"(.*?)"#', src, re.S)
    if not m:
        sys.exit(f"{path}: no `concat!(...storage_types!(), r#\"...\"#)` source found")
    return m.group(1)


def helpers():
    src = open(os.path.join(ROOT, "burn-ddp/src/nn/cuda/kernels/nvrtc.rs")).read()
    code = re.search(r'macro_rules! storage_types \{\s*\(\) => \{\s*r#"(.*?)"#', src, re.S).group(1)
    for ptx, host in SWAPS:
        if ptx not in code:
            sys.exit(f"the helpers no longer contain {ptx!r}: update this script")
        code = code.replace(ptx, host)
    return code


def main():
    ops = os.path.join(ROOT, "burn-ddp/src/nn/cuda/ops")
    gelu = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ops, "gelu.rs")
    ln = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ops, "layer_norm.rs")
    source = PRELUDE + helpers() + kernel(gelu) + kernel(ln) + GELU_HARNESS + LN_HARNESS + MAIN
    with tempfile.TemporaryDirectory() as d:
        cpp, exe = os.path.join(d, "kernels.cpp"), os.path.join(d, "kernels")
        open(cpp, "w").write(source)
        subprocess.run(["g++", "-O1", "-std=c++20", "-pthread", "-Wno-unknown-pragmas", "-o", exe, cpp, "-lm"], check=True)
        sys.exit(subprocess.run([exe]).returncode)


if __name__ == "__main__":
    main()
