//! Process-wide switches of the cuDNN path (convolutions, batch norm), from the environment or set in code.

use std::sync::{OnceLock, RwLock};

/// How the GPU layers run on burn-cuda: one struct, read once from the environment for the
/// settings users need —
///
/// | variable | field | default |
/// |---|---|---|
/// | `BURN_DDP_CUDNN=0` | [`enabled`](Self::enabled) | on |
/// | `BURN_DDP_CUDNN_TF32=0` | [`allow_tf32`](Self::allow_tf32) | on (PyTorch's default) |
/// | `BURN_DDP_CUDNN_DETERMINISTIC=1` | [`deterministic`](Self::deterministic) | off |
/// | `BURN_DDP_CUDNN_WORKSPACE_MIB=N` | [`workspace_limit`](Self::workspace_limit) | 512 MiB |
/// | `BURN_DDP_CONV_CANDIDATES=N` | [`conv_candidates`](Self::conv_candidates) | 8 |
/// | `BURN_DDP_CUBLAS=0` | [`cublas`](Self::cublas) | on |
/// | `BURN_DDP_SDPA=0` | [`fused_attention`](Self::fused_attention) | on |
/// | `BURN_DDP_CUDNN_LN=0` | [`layer_norm`](Self::layer_norm) | on |
/// | `BURN_DDP_GELU=0` | [`fused_gelu`](Self::fused_gelu) | on |
/// | `BURN_DDP_LN_KERNEL=0` | [`layer_norm_kernel`](Self::layer_norm_kernel) | on |
/// | `BURN_DDP_FUSE_ADD=0` | [`fuse_residual`](Self::fuse_residual) | on |
/// | `BURN_DDP_FUSED_LINEAR=0` | [`fused_linear`](Self::fused_linear) | on |
/// | `BURN_DDP_PATCH_GEMM=0` | [`patch_gemm`](Self::patch_gemm) | on |
/// | `BURN_DDP_LT_EPILOGUE=0` | [`lt_epilogue`](Self::lt_epilogue) | on |
/// | `BURN_DDP_SAME_STREAM=0` | [`same_stream`](Self::same_stream) | on (fences where libcupti is missing) |
/// | `BURN_DDP_COALESCED_FOLD=0` | [`coalesced_fold`](Self::coalesced_fold) | on |
/// | `BURN_DDP_FILTER_KERNEL=0` | [`filter_kernel`](Self::filter_kernel) | on |
/// | `BURN_DDP_DIRECT_FENCES=0` | [`direct_fences`](Self::direct_fences) | on (where `same_stream` owns burn's stream) |
///
/// — and set in code with [`set`] for the rest (each turns one fast path off, for diagnosis
/// and for measuring what it gains: `burn-ddp-gpu-checks` and the GPU scripts do).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct CudnnOptions {
    /// Use cuDNN at all (otherwise burn's own convolution kernels run).
    pub enabled: bool,
    /// Let f32 convolutions run on tensor cores in TF32, as PyTorch allows by default
    /// (`torch.backends.cudnn.allow_tf32`); `false` forces full-precision FMA math.
    pub allow_tf32: bool,
    /// Only algorithms whose results are bit-identical run to run.
    pub deterministic: bool,
    /// The most scratch memory (bytes) one algorithm may use; also the workspace measured with.
    pub workspace_limit: usize,
    /// How many of cuDNN's heuristics' engine configurations a convolution's plan search
    /// times, at most, per shape and direction (PyTorch's `cudnn.benchmark_limit`, 10 there).
    /// Measured on an H100 (2026-12-05, ResNet-50 bf16 b256, with a search that also took
    /// cuDNN's fallback list and the median of three runs): 8, 16 and 32 trained at the same
    /// speed within 0.6 %, and 32 made the first step 6 s longer.
    pub conv_candidates: usize,
    /// Copy pitched activations (burn-cuda pads rows) to a packed layout before forward and
    /// backward-data calls: cuDNN's fast kernels want packed NCHW. Backward-filter always packs
    /// (cuDNN 9 has no algorithm for strided inputs there).
    pub pack_inputs: bool,
    /// Run BatchNorm (and a ReLU right after it) through cuDNN as well
    /// (`false` keeps burn's BatchNorm).
    pub batch_norm: bool,
    /// Order cuDNN's work with burn's by waiting on the host (drain burn's stream before each
    /// call, cuDNN's after it) instead of on the device (the device-side ordering is the default and
    /// lets the host run ahead; the host orders by itself when that cannot be set up).
    pub host_sync: bool,
    /// Run a convolution and the BatchNorm after it as one cuDNN operation
    /// (`false` runs them separately): 106 instead of 264 cuDNN calls per
    /// ResNet-50 step, and the convolution's output never goes back to burn's graph.
    pub fuse_conv_bn: bool,
    /// Run channels-last BatchNorm (+ ReLU) on burn-vision's own CUDA kernels on burn's stream
    /// (`false` builds it from burn's tensor operations instead, as on
    /// every other backend). Not a cuDNN switch: cuDNN's batch norm is slow on NHWC.
    pub nhwc_bn_kernels: bool,
    /// Run convolutions through execution plans of cuDNN's graph API, built once per shape
    /// (`false` uses the legacy `cudnnConvolution*` entry points, which
    /// cost several times the host time per call).
    pub graph_api: bool,
    /// Run matrix products (`nn::matmul`, `nn::linear`, `nn::attention`) on cuBLAS with f32
    /// accumulation (`false` runs burn's own matmul kernels: for f32 tensors split into four
    /// TF32 products to stay f32-accurate).
    pub cublas: bool,
    /// Run bf16/f16 self-attention (`nn::self_attention`) as cuDNN's fused flash-attention
    /// forward and backward (`false`, or [`deterministic`](Self::deterministic): two products
    /// and a softmax, the scores in memory).
    pub fused_attention: bool,
    /// Run bf16/f16 layer norms (`nn::layer_norm`) on cuDNN, one pass each way in the
    /// activations' type with f32 statistics (`false`, or [`deterministic`](Self::deterministic):
    /// burn's operations on an f32 copy).
    pub layer_norm: bool,
    /// Run `nn::bias_gelu` and `nn::linear_gelu`'s bias and GELU as one kernel each way
    /// (`false`: burn's addition, `gelu` and its backward, which keep the sum instead).
    pub fused_gelu: bool,
    /// Run the bf16/f16 layer norms' forward on our kernel (one warp per row; rows of at most
    /// 1024 features) instead of cuDNN's, the backward staying cuDNN's.
    pub layer_norm_kernel: bool,
    /// Fuse a residual block's end, `relu(bn(x) + residual)` on channels-last activations
    /// (`nn::batch_norm_add_relu`), into the batch-norm kernels' normalisation pass and their
    /// backward (`false`: the batch norm, then burn's addition and `nn::relu`).
    pub fuse_residual: bool,
    /// Run `nn::linear` (and `nn::linear_gelu`'s product) on cuBLAS as one operation each way,
    /// the parameters' casts inside it (`false`: a reshape, the casts, the product and the bias
    /// addition as separate operations, as many round trips for the training thread).
    pub fused_linear: bool,
    /// Run a patch embedding (`nn::Conv2d::forward_tokens` of a convolution whose stride is
    /// its kernel: ViT's) as a reshape of the input into patches and one matrix product
    /// (`false`: the convolution, then a reshape into tokens). cuDNN has no fast engine for a
    /// 16×16 stride-16 convolution of 3 channels; a product of `[patches, c·16·16]` by the
    /// filter is cuBLAS's best case. Every backend, not only burn-cuda.
    pub patch_gemm: bool,
    /// Add `nn::linear`'s bias in its product's epilogue, and compute the bias's gradient in
    /// the product that computes the weight's (cuBLASLt's `BIAS` and `BGRADA` epilogues),
    /// where cuBLASLt takes the shapes (`false`,
    /// or a product it has no algorithm for: a separate addition forward and a product by a
    /// row of ones backward). Measured on 2026-12-05: ViT-B/16 bf16 b128 +2.2 % (H200),
    /// ViT-S/16 bf16 b256 with AdamW +3.4 % (H100).
    pub lt_epilogue: bool,
    /// Run cuDNN, cuBLAS and our kernels on burn's own CUDA stream (found through CUPTI:
    /// `cuda::runtime::burn_stream`) instead of on burn-ddp's stream behind four fence kernels
    /// per call — for the first burn stream (thread) of each device that makes such a call;
    /// other streams, and machines without libcupti or under a profiler, keep the fences
    /// (one log line says so). On an H200 (2026-12-05): ResNet-50 bf16 b256 +8.2–8.9 %,
    /// ViT-B/16 bf16 b128 +11.1–11.8 %.
    pub same_stream: bool,
    /// Fold the channels-last batch norm's partial sums (its statistics forward, `dγ`/`dβ`
    /// backward, SyncBatchNorm's moments) with blocks of 32 neighbouring channels whose loads
    /// are coalesced and overlapped (`false`: one warp per channel, each load its own memory
    /// transaction: 9–32 µs a fold on an H200, 2.4 ms of a ResNet-50 bf16 b256 step). On an
    /// H200 (2026-12-05): ResNet-50 bf16 b256 +4.2–5.2 %.
    pub coalesced_fold: bool,
    /// Reorder and cast a channels-last convolution's filter (forward: f32 KCRS to the
    /// activations' KRSC; backward: its gradient back) in one kernel each way (`false`: burn's
    /// cast, then a copy of the permuted view: four passes per convolution and step instead of
    /// two). On an H200 (2026-12-05): ResNet-50 bf16 b256 +0.6–1.3 % alone, GPU memory 0.06
    /// GiB lower.
    pub filter_kernel: bool,
    /// Where [`same_stream`](Self::same_stream) owns burn's CUDA stream, order a DDP bucket's or
    /// a SyncBatchNorm exchange's collective with burn's stream by CUDA events recorded and
    /// waited for on the two streams (PyTorch's way), instead of a flag stored on burn's stream
    /// and one-thread fence kernels, launched through cubecl (`false`): no multiprocessor is
    /// held by a spinning wait, and no cubecl launch (about 42 µs each on an H100, 2026-12-05)
    /// is paid on burn's device thread.
    pub direct_fences: bool,
}

impl Default for CudnnOptions {
    fn default() -> Self {
        Self {
            enabled: true,
            allow_tf32: true,
            deterministic: false,
            workspace_limit: 512 << 20,
            conv_candidates: 8,
            pack_inputs: true,
            batch_norm: true,
            host_sync: false,
            fuse_conv_bn: true,
            nhwc_bn_kernels: true,
            graph_api: true,
            cublas: true,
            fused_attention: true,
            layer_norm: true,
            fused_gelu: true,
            layer_norm_kernel: true,
            fuse_residual: true,
            fused_linear: true,
            patch_gemm: true,
            lt_epilogue: true,
            same_stream: true,
            coalesced_fold: true,
            filter_kernel: true,
            direct_fences: true,
        }
    }
}

impl CudnnOptions {
    /// The defaults, overridden by the `BURN_DDP_CUDNN*` environment variables (see the table
    /// above; a value of `0`, `false`, `off` or empty means off).
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let mut o = Self::default();
        let flag = |name: &str| var(name).map(|v| !matches!(v.trim(), "0" | "false" | "off" | ""));
        for (name, field) in [
            ("BURN_DDP_CUDNN", &mut o.enabled),
            ("BURN_DDP_CUDNN_TF32", &mut o.allow_tf32),
            ("BURN_DDP_CUDNN_DETERMINISTIC", &mut o.deterministic),
            ("BURN_DDP_CUBLAS", &mut o.cublas),
            ("BURN_DDP_SDPA", &mut o.fused_attention),
            ("BURN_DDP_CUDNN_LN", &mut o.layer_norm),
            ("BURN_DDP_GELU", &mut o.fused_gelu),
            ("BURN_DDP_LN_KERNEL", &mut o.layer_norm_kernel),
            ("BURN_DDP_FUSE_ADD", &mut o.fuse_residual),
            ("BURN_DDP_FUSED_LINEAR", &mut o.fused_linear),
            ("BURN_DDP_PATCH_GEMM", &mut o.patch_gemm),
            ("BURN_DDP_LT_EPILOGUE", &mut o.lt_epilogue),
            ("BURN_DDP_SAME_STREAM", &mut o.same_stream),
            ("BURN_DDP_COALESCED_FOLD", &mut o.coalesced_fold),
            ("BURN_DDP_FILTER_KERNEL", &mut o.filter_kernel),
            ("BURN_DDP_DIRECT_FENCES", &mut o.direct_fences),
        ] {
            if let Some(v) = flag(name) {
                *field = v;
            }
        }
        match var("BURN_DDP_CUDNN_WORKSPACE_MIB").map(|v| v.trim().parse::<usize>()) {
            Some(Ok(mib)) => o.workspace_limit = mib << 20,
            Some(Err(_)) => log::warn!(
                "BURN_DDP_CUDNN_WORKSPACE_MIB is not a whole number of MiB; keeping {} MiB",
                o.workspace_limit >> 20
            ),
            None => {}
        }
        match var("BURN_DDP_CONV_CANDIDATES").map(|v| v.trim().parse::<usize>()) {
            Some(Ok(n)) if n > 0 => o.conv_candidates = n,
            Some(_) => {
                log::warn!("BURN_DDP_CONV_CANDIDATES is not a positive whole number; keeping {}", o.conv_candidates)
            }
            None => {}
        }
        o
    }
}

fn cell() -> &'static RwLock<CudnnOptions> {
    static OPTIONS: OnceLock<RwLock<CudnnOptions>> = OnceLock::new();
    OPTIONS.get_or_init(|| RwLock::new(CudnnOptions::from_env()))
}

/// The options in force.
pub fn get() -> CudnnOptions {
    cell().read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Replaces the options for the convolutions that follow (algorithm choices are cached per
/// setting of `allow_tf32` and `deterministic`, so switching measures afresh once).
pub fn set(options: CudnnOptions) {
    *cell().write().unwrap_or_else(|p| p.into_inner()) = options;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_pytorch() {
        let o = CudnnOptions::default();
        assert!(o.enabled && o.allow_tf32 && !o.deterministic && o.same_stream && o.lt_epilogue);
        assert!(o.coalesced_fold && o.filter_kernel && o.direct_fences);
        assert_eq!(o.workspace_limit, 512 << 20);
    }

    #[test]
    fn environment_sets_the_user_settings_only() {
        let vars = [
            ("BURN_DDP_CUDNN", "0"),
            ("BURN_DDP_CUDNN_TF32", "off"),
            ("BURN_DDP_CUDNN_DETERMINISTIC", "1"),
            ("BURN_DDP_CUDNN_WORKSPACE_MIB", "64"),
            ("BURN_DDP_CONV_CANDIDATES", "24"),
            ("BURN_DDP_CUBLAS", "off"),
            ("BURN_DDP_SDPA", "0"),
            ("BURN_DDP_CUDNN_LN", "0"),
            ("BURN_DDP_GELU", "0"),
            ("BURN_DDP_LN_KERNEL", "off"),
            ("BURN_DDP_FUSE_ADD", "0"),
            ("BURN_DDP_FUSED_LINEAR", "0"),
            ("BURN_DDP_PATCH_GEMM", "off"),
            ("BURN_DDP_LT_EPILOGUE", "0"),
            ("BURN_DDP_SAME_STREAM", "0"),
            ("BURN_DDP_COALESCED_FOLD", "off"),
            ("BURN_DDP_FILTER_KERNEL", "0"),
            ("BURN_DDP_DIRECT_FENCES", "0"),
            ("BURN_VISION_CUDNN_GRAPH", "0"),
        ];
        let o = CudnnOptions::from_vars(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()));
        assert!(
            !o.enabled
                && !o.allow_tf32
                && o.deterministic
                && o.graph_api
                && !o.cublas
                && !o.fused_attention
                && !o.layer_norm
                && !o.fused_gelu
                && !o.layer_norm_kernel
                && !o.fuse_residual
                && !o.fused_linear
                && !o.patch_gemm
                && !o.lt_epilogue
                && !o.same_stream
                && !o.coalesced_fold
                && !o.filter_kernel
                && !o.direct_fences
        );
        assert_eq!(o.workspace_limit, 64 << 20);
        assert_eq!(o.conv_candidates, 24);
        assert!(CudnnOptions::default().cublas && CudnnOptions::default().fused_attention);
    }
}
