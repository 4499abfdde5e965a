//! The list of checks, in the order they run: each with a name (what `burn-ddp-gpu-checks NAME`
//! selects), what it compares, and the function that does it.

use crate::checks::{
    activations, attention, batch_norm, convolution, decode, layer_norm, loss, memory, nccl, optimizer, ordering,
    products, stream_probe, sync_batch_norm,
};
use burn_cuda::CudaDevice;

/// One check.
pub(crate) struct Check {
    /// Its name on the command line and in the summary.
    pub(crate) name: &'static str,
    /// What it compares with what.
    pub(crate) what: &'static str,
    /// Runs it; true when every comparison passed.
    pub(crate) run: fn(&CudaDevice) -> bool,
}

/// Every check, in the order they run (`cudnn-ordering` last: it judges the calls before it).
pub(crate) const CHECKS: &[Check] = &[
    Check {
        name: "convolution",
        what: "cuDNN convolutions, every direction and option, f32/TF32/bf16/f16, NCHW and NHWC, against f64",
        run: convolution::check,
    },
    Check {
        name: "convolution-accumulate",
        what: "input gradients of several convolutions accumulated by cuDNN in place, against f64",
        run: convolution::check_accumulate,
    },
    Check {
        name: "batch-norm",
        what: "cuDNN batch norm (+ ReLU): outputs, gradients, running statistics, inference, against burn on the CPU",
        run: batch_norm::check_bn,
    },
    Check {
        name: "conv-bn-relu",
        what: "convolution + batch norm + ReLU as one cuDNN operation against the separate operations",
        run: batch_norm::check_fused,
    },
    Check {
        name: "bn-add-relu",
        what: "relu(batch norm + residual) on the channels-last kernels: outputs, four gradients, statistics, against burn on the CPU",
        run: batch_norm::check_bn_add_relu,
    },
    Check {
        name: "warp-fold",
        what: "batch-norm, bn-add-relu and sync-batch-norm again with the sums folded one warp per channel (the coalesced fold off)",
        run: batch_norm::check_warp_fold,
    },
    Check { name: "upload", what: "page-locked image uploads arrive exactly", run: memory::check_upload },
    Check {
        name: "crop-resize",
        what: "the crop-and-resize kernel of device-decoded batches against its f64 host twin",
        run: decode::check_crop_resize,
    },
    Check {
        name: "pixel-ops",
        what: "RandAugment, colour jitter and random erasing on device-decoded batches against their host twin",
        run: decode::check_pixel_ops,
    },
    Check {
        name: "jpeg-decode",
        what: "nvJPEG's decode and random crops against the image crate's decode: PSNR >= 40 dB",
        run: decode::check_jpeg_decode,
    },
    Check {
        name: "decode-ahead",
        what: "batches started by another thread ahead of their use (one dropped unread) against the host twin",
        run: decode::check_decode_ahead,
    },
    Check {
        name: "decode-behind-busy-stream",
        what: "decode-ahead with every crop kernel queued behind ~60 ms of products: no batch holds another's images",
        run: decode::check_decode_behind_busy_stream,
    },
    Check {
        name: "products",
        what: "cuBLAS matmul and linear, values and gradients, against f64",
        run: products::check_gemm,
    },
    Check {
        name: "linear-epilogue",
        what: "nn::linear with the bias and its gradient in cuBLASLt's epilogues and without, values and gradients, against f64",
        run: products::check_linear_epilogue,
    },
    Check {
        name: "patch-embed",
        what: "a patch embedding (ViT's) as one cuBLAS product, values and gradients, against the f64 convolution",
        run: products::check_patch_embed,
    },
    Check {
        name: "attention",
        what: "cuDNN fused attention, values and gradients, against f64",
        run: attention::check_sdpa,
    },
    Check {
        name: "layer-norm",
        what: "layer norm (cuDNN; our forward kernel with cuDNN's backward), values and gradients, against f64",
        run: layer_norm::check_ln,
    },
    Check { name: "relu", what: "burn-ddp's ReLU against burn's, bit for bit", run: activations::check_relu },
    Check {
        name: "cast-packed",
        what: "burn-ddp's packed cast of a channels-last RGB view against the host's cast, bit for bit",
        run: activations::check_cast_packed,
    },
    Check {
        name: "bias-gelu",
        what: "the fused bias + GELU kernel, values and gradients, f32/bf16/f16, against f64",
        run: activations::check_bias_gelu,
    },
    Check {
        name: "max-pool",
        what: "burn-ddp's max-pool against f64 (f32) and burn's (bf16)",
        run: activations::check_max_pool,
    },
    Check { name: "sgd", what: "FusedSgd against burn's Sgd, four settings", run: optimizer::check_sgd },
    Check { name: "adamw", what: "FusedAdamW against burn's AdamW, three settings", run: optimizer::check_adamw },
    Check {
        name: "cross-entropy",
        what: "burn-ddp's fused cross-entropy, with and without label smoothing, against f64",
        run: loss::check_cross_entropy,
    },
    Check {
        name: "mean-over",
        what: "the global average pool on cuBLAS (`mean_over`), both axes, against f64",
        run: loss::check_mean_over,
    },
    Check {
        name: "sync-batch-norm",
        what: "SyncBatchNorm on 2 ranks against BatchNorm over the whole batch: values, gradients, statistics",
        run: sync_batch_norm::check_sync_bn,
    },
    Check {
        name: "nccl",
        what: "NCCL ordered on the device; DDP over a one-rank NCCL group against plain training (needs libnccl)",
        run: nccl::check_nccl,
    },
    Check {
        name: "burn-stream",
        what: "burn-cuda's stream found through CUPTI (needs libcupti), and ordered after burn's work",
        run: stream_probe::check_stream_probe,
    },
    Check {
        name: "same-stream",
        what: "a transformer block and a convolution trained on burn's own stream (same_stream) against behind fences",
        run: stream_probe::check_same_stream,
    },
    Check {
        name: "cudnn-ordering",
        what: "every cuDNN call above was ordered on the device, none waited for on the host",
        run: ordering::check_cudnn_ordering,
    },
];
