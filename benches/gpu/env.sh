# Source this on the GPU machine before running a Rust binary built on the development machine.
# libcuda comes with the driver; NVRTC (used by burn-cuda to compile kernels) is in /usr/local/cuda;
# NCCL ships with the Python package nvidia-nccl (only as libnccl.so.2, while cudarc looks for
# libnccl.so: hence the symlink). cuDNN 9 is in /usr/lib/x86_64-linux-gnu (libcudnn.so).
export NCCL_NVLS_ENABLE=0   # never NVLink multicast on these shared hosts
NCCL_LIB_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))')
mkdir -p /tmp/nccl-link && ln -sf "$NCCL_LIB_DIR/libnccl.so.2" /tmp/nccl-link/libnccl.so
export LD_LIBRARY_PATH=/tmp/nccl-link:$NCCL_LIB_DIR:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# libcupti, which burn-ddp uses to find burn's CUDA stream (CudnnOptions::same_stream; without
# it cuDNN and cuBLAS run behind fences): PyTorch's `nvidia-cuda-cupti` wheel has it.
CUPTI_DIR=$(python3 - <<'PY' 2>/dev/null
import glob, os, site
for base in site.getsitepackages():
    for lib in glob.glob(os.path.join(base, "nvidia", "cu*", "lib", "libcupti.so*")) + glob.glob(os.path.join(base, "nvidia", "cuda_cupti", "lib", "libcupti.so*")):
        print(os.path.dirname(lib)); raise SystemExit
PY
)
[ -n "$CUPTI_DIR" ] && export LD_LIBRARY_PATH="$CUPTI_DIR:$LD_LIBRARY_PATH"
