"""Runs the fused bias + GELU kernel's CUDA C source (burn-ddp/src/nn/cuda/ops/gelu.rs) on the
CPU, for a machine without a GPU: the source is compiled by g++ with the few CUDA built-ins it
uses emulated (thread and block indices looped over, bit casts, vector structs, and f16
conversions through GCC's _Float16 in place of the PTX `cvt` instructions), and every path —
f32/bf16/f16, with and without a bias, forward and backward, four elements per thread or one,
a grid-stride loop of several rounds — is compared with f64 GELU and its derivative; bytes past
the output must stay untouched. It checks the kernel's indexing and arithmetic, not the GPU's
(`burn-ddp-gpu-checks bias-gelu` does that on a GPU).

usage: python3 benches/emulate_gelu_kernel.py [RUST_FILE]   (needs g++ 12 or later on x86-64; RUST_FILE:
       another copy of gelu.rs, e.g. a deliberately broken one, to see the check fail)
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
#define __device__
#define __forceinline__ inline
#define __global__
struct dim3 { unsigned x, y, z; };
static dim3 blockIdx, threadIdx, blockDim, gridDim;
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }

'''
HARNESS = r'''static double gelu_d(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
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
int main() {
    int ok = 1;
    for (int t = 0; t < 3; t++) for (int bias = 0; bias < 2; bias++) for (int back = 0; back < 2; back++) {
        ok &= run(t, 37, 3072 / 16, bias, back, 1, 3);     // vector path, grid-stride over several rounds
        ok &= run(t, 33, 10, bias, back, 0, 2);            // one element per thread, cols not a multiple of 4
        ok &= run(t, 5, 12, bias, back, 1, 1);
    }
    // bf16 rounding: ties to even, NaN stays NaN, inf stays inf
    unsigned short r1 = to16(__uint_as_float(0x3f808000u), 1), r2 = to16(__uint_as_float(0x3f818000u), 1);
    unsigned short rn = to16(NAN, 1), ri = to16(INFINITY, 1);
    bool rounding = r1 == 0x3f80 && r2 == 0x3f82 && (rn & 0x7fff) > 0x7f80 && ri == 0x7f80;
    printf("bf16 rounding ties-to-even/NaN/inf %s\n", rounding ? "ok" : "FAIL");
    ok &= rounding;
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


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "burn-ddp/src/nn/cuda/ops/gelu.rs")
    rust = open(path).read()
    kernel = re.search(r'const KERNEL: &str = r#"(.*?)"#;', rust, re.S).group(1)
    for ptx, host in SWAPS:
        if ptx not in kernel:
            sys.exit(f"the kernel no longer contains {ptx!r}: update this script")
        kernel = kernel.replace(ptx, host)
    with tempfile.TemporaryDirectory() as d:
        cpp, exe = os.path.join(d, "kernel.cpp"), os.path.join(d, "kernel")
        open(cpp, "w").write(PRELUDE + kernel + HARNESS)
        subprocess.run(["g++", "-O1", "-std=c++17", "-o", exe, cpp, "-lm"], check=True)
        sys.exit(subprocess.run([exe]).returncode)


if __name__ == "__main__":
    main()
