"""Where a fresh machine's kernel compilation time goes (the cold start): NVRTC on a
small bf16 elementwise kernel of the shape cubecl generates, with the headers cubecl's CUDA
dialect includes (cuda_runtime.h, cuda_bf16.h, cuda_fp16.h) and with fewer, then the driver's
PTX -> SASS step (cuModuleLoadData with the compute cache off). Prints one RESULT line per
variant: seconds per compilation (median of REPEAT) and whether it compiled.

python3 benches/gpu/nvrtc_headers.py [REPEAT]"""
import ctypes, os, sys, time, statistics
os.environ["CUDA_CACHE_DISABLE"] = "1"
nv = ctypes.CDLL(os.environ.get("NVRTC_LIB", "/usr/local/cuda/lib64/libnvrtc.so"))
cu = ctypes.CDLL("libcuda.so.1")
P = ctypes.c_void_p

def ok(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} returned {rc}")

BODY = r"""
typedef unsigned int uint;
extern "C" __global__ void kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out, uint n) {
    uint i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float x = __bfloat162float(a[i]);
        float y = __bfloat162float(b[i]);
        float4 v = make_float4(x, y, x * y, x + y);
        out[i] = __float2bfloat16(fmaxf(v.z + v.w, 0.0f));
    }
}
"""
VARIANTS = {
    "runtime+bf16+fp16 (cubecl today)": "#include <cuda_runtime.h>\n#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n",
    "bf16+fp16 only": "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n",
    "bf16 only": "#include <cuda_bf16.h>\n",
    "runtime only (f32 kernel)": "#include <cuda_runtime.h>\n",
    "no header (f32 kernel)": "",
}
F32_BODY = BODY.replace("__nv_bfloat16", "float").replace("__bfloat162float", "").replace("__float2bfloat16", "")

def compile_once(src, arch):
    t = time.perf_counter()
    prog = P()
    ok(nv.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"k.cu", 0, None, None), "nvrtcCreateProgram")
    opts = [f"--gpu-architecture=sm_{arch}a".encode(), b"--include-path=/usr/local/cuda/include", b"-lineinfo"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    compiled = nv.nvrtcCompileProgram(prog, len(opts), arr) == 0
    size = ctypes.c_size_t()
    if compiled:
        ok(nv.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
        ptx = ctypes.create_string_buffer(size.value)
        ok(nv.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
    else:
        ok(nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "log size")
        log = ctypes.create_string_buffer(size.value)
        nv.nvrtcGetProgramLog(prog, log)
        print(log.value.decode(errors="replace")[:600])
        ptx = None
    nv.nvrtcDestroyProgram(ctypes.byref(prog))
    return time.perf_counter() - t, ptx

def main():
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    ok(cu.cuInit(0), "cuInit")
    dev, major, minor, ctx = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), P()
    ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ok(cu.cuDeviceGetAttribute(ctypes.byref(major), 75, dev), "major")
    ok(cu.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev), "minor")
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "ctx")
    ok(cu.cuCtxSetCurrent(ctx), "set ctx")
    arch = f"{major.value}{minor.value}"
    vmaj, vmin = ctypes.c_int(), ctypes.c_int()
    nv.nvrtcVersion(ctypes.byref(vmaj), ctypes.byref(vmin))
    print(f"RESULT nvrtc_version={vmaj.value}.{vmin.value} arch=sm_{arch}")
    for name, headers in VARIANTS.items():
        body = F32_BODY if "f32" in name else BODY
        times, loads, ptx = [], [], None
        for _ in range(repeat):
            s, ptx = compile_once(headers + body, arch)
            times.append(s)
            if ptx is not None:
                mod = P()
                t = time.perf_counter()
                ok(cu.cuModuleLoadData(ctypes.byref(mod), ptx), "cuModuleLoadData")
                loads.append(time.perf_counter() - t)
                cu.cuModuleUnload(mod)
        load = f"{statistics.median(loads):.4f}" if loads else "-"
        print(f"RESULT variant={name!r} compiled={ptx is not None} nvrtc_s={statistics.median(times):.4f} first_s={times[0]:.4f} ptx_to_sass_s={load}")

main()
