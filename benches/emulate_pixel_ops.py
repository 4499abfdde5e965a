"""Runs burn-ddp's pixel-operations kernel (burn-ddp/src/nn/cuda/kernels/pixel_ops.rs: RandAugment,
colour jitter and random erasing on GPU-decoded crops) on the CPU: g++ compiles its CUDA C source
with the built-ins it uses emulated — each GPU thread of a block a host thread, `__syncthreads` a
barrier, `__shared__` variables shared by the block's threads, atomics under a lock, the
round-to-nearest intrinsics plain IEEE operations (compiled without contraction) — and runs it
on the batch in IN, writing the normalised batch to OUT. burn-ddp's unit test
`nn::pixel_ops::tests::the_kernel_gives_the_hosts_bytes` writes IN and compares OUT with
`apply_on_host`.

    python3 benches/emulate_pixel_ops.py IN OUT [KERNEL_RS]

IN, little-endian: u32 n, h, w, threads; f32 mean[3], inv_std[3]; n crops of h·w·3 bytes; n
programs as `kernel_programs` writes them. OUT: n·3·h·w f32. KERNEL_RS: another copy of the
kernel file (e.g. a deliberately broken one, to see the test fail). Needs g++ with C++20.
"""
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRELUDE = r'''
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <vector>
#include <thread>
#include <barrier>
#include <mutex>
#define __device__
#define __forceinline__ inline
#define __global__
#define __shared__ static
struct dim3 { unsigned x, y, z; };
static dim3 blockIdx, blockDim, gridDim;
static thread_local dim3 threadIdx;
static std::barrier<>* block_barrier;
static std::mutex atomic_lock;
inline void __syncthreads() { block_barrier->arrive_and_wait(); }
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) { std::lock_guard<std::mutex> g(atomic_lock); auto o = *a; *a += v; return o; }
inline unsigned atomicAdd(unsigned* a, unsigned v) { std::lock_guard<std::mutex> g(atomic_lock); auto o = *a; *a += v; return o; }
inline unsigned atomicMin(unsigned* a, unsigned v) { std::lock_guard<std::mutex> g(atomic_lock); auto o = *a; if (v < o) *a = v; return o; }
inline unsigned atomicMax(unsigned* a, unsigned v) { std::lock_guard<std::mutex> g(atomic_lock); auto o = *a; if (v > o) *a = v; return o; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
'''
MAIN = r'''
int main(int argc, char** argv) {
    FILE* in = fopen(argv[1], "rb");
    if (!in) { perror(argv[1]); return 2; }
    unsigned hdr[4]; Norm n;
    if (fread(hdr, 4, 4, in) != 4 || fread(&n, sizeof n, 1, in) != 1) { fprintf(stderr, "short header\n"); return 2; }
    const unsigned count = hdr[0], h = hdr[1], w = hdr[2], threads = hdr[3];
    const size_t bytes = (size_t)count * h * w * 3;
    std::vector<unsigned char> a(bytes), b(bytes, 0xEE);
    std::vector<Prog> progs(count);
    if (fread(a.data(), 1, bytes, in) != bytes || fread(progs.data(), sizeof(Prog), count, in) != count) { fprintf(stderr, "short input\n"); return 2; }
    std::vector<float> out((size_t)count * 3 * h * w + 4, -99.f);
    gridDim.x = count; blockDim.x = threads;
    std::barrier<> bar(threads);
    block_barrier = &bar;
    for (unsigned bx = 0; bx < count; ++bx) {
        blockIdx.x = bx;
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < threads; ++t)
            ts.emplace_back([&, t] { threadIdx.x = t; pixel_ops(progs.data(), a.data(), b.data(), out.data(), h, w, n); });
        for (auto& t : ts) t.join();
    }
    for (int k = 0; k < 4; ++k) if (out[(size_t)count * 3 * h * w + k] != -99.f) { fprintf(stderr, "wrote past the batch\n"); return 3; }
    FILE* o = fopen(argv[2], "wb");
    fwrite(out.data(), 4, (size_t)count * 3 * h * w, o);
    fclose(o);
    printf("emulated %u images of %ux%u, %u threads a block\n", count, w, h, threads);
    return 0;
}
'''


def kernel(path):
    src = open(path).read()
    m = re.search(r'const KERNEL: &str = r#"(.*?)"#;', src, re.S)
    if not m:
        sys.exit(f"{path}: no `const KERNEL: &str = r#\"...\"#;` source found")
    return m.group(1).replace('extern "C" ', "")


def run(name, kernel_rs, main_src, prelude="", flags=()):
    """Compiles kernel file `kernel_rs`'s source (argv[3] instead, when given) with the prelude,
    `prelude` and `main_src`, and runs it on argv[1] and argv[2], exiting with its status."""
    if len(sys.argv) < 3:
        sys.exit(sys.modules["__main__"].__doc__)
    path = sys.argv[3] if len(sys.argv) > 3 else os.path.join(ROOT, kernel_rs)
    with tempfile.TemporaryDirectory() as d:
        cpp, exe = os.path.join(d, name + ".cpp"), os.path.join(d, name)
        open(cpp, "w").write(PRELUDE + prelude + kernel(path) + main_src)
        subprocess.run(["g++", "-O1", "-std=c++20", "-pthread", *flags, "-o", exe, cpp, "-lm"], check=True)
        sys.exit(subprocess.run([exe, sys.argv[1], sys.argv[2]]).returncode)


def main():
    run("pixel_ops", "burn-ddp/src/nn/cuda/kernels/pixel_ops.rs", MAIN, flags=["-ffp-contract=off"])


if __name__ == "__main__":
    main()
