//! Process-wide switches of the cuDNN path (convolutions, batch norm), from the environment or set in code.

use std::sync::{OnceLock, RwLock};

/// How convolutions and batch norms on burn-cuda use cuDNN. Read once from the environment
/// (`BURN_VISION_CUDNN=0`, `BURN_VISION_CUDNN_TF32=0`, `BURN_VISION_CUDNN_DETERMINISTIC=1`,
/// `BURN_VISION_CUDNN_WORKSPACE_MIB=N`, `BURN_VISION_CUDNN_PACK=0`,
/// `BURN_VISION_CUDNN_BN=0`, `BURN_VISION_CUDNN_HOST_SYNC=1`,
/// `BURN_VISION_CUDNN_FUSE=0`, `BURN_VISION_BN_KERNELS=0`, `BURN_VISION_CUDNN_GRAPH=0`), or set
/// with [`set`] before the first convolution.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
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
    /// Copy pitched activations (burn-cuda pads rows) to a packed layout before forward and
    /// backward-data calls: cuDNN's fast kernels want packed NCHW. Backward-filter always packs
    /// (cuDNN 9 has no algorithm for strided inputs there).
    pub pack_inputs: bool,
    /// Run BatchNorm (and a ReLU right after it) through cuDNN as well
    /// (`BURN_VISION_CUDNN_BN=0` keeps burn's BatchNorm).
    pub batch_norm: bool,
    /// Order cuDNN's work with burn's by waiting on the host (drain burn's stream before each
    /// call, cuDNN's after it) instead of on the device (`BURN_VISION_CUDNN_HOST_SYNC=1`; the
    /// device-side ordering is the default and lets the host run ahead).
    pub host_sync: bool,
    /// Run a convolution and the BatchNorm after it as one cuDNN operation
    /// (`BURN_VISION_CUDNN_FUSE=0` runs them separately): 106 instead of 264 cuDNN calls per
    /// ResNet-50 step, and the convolution's output never goes back to burn's graph.
    pub fuse_conv_bn: bool,
    /// Run channels-last BatchNorm (+ ReLU) on burn-vision's own CUDA kernels on burn's stream
    /// (`BURN_VISION_BN_KERNELS=0` builds it from burn's tensor operations instead, as on
    /// every other backend). Not a cuDNN switch: cuDNN's batch norm is slow on NHWC.
    pub nhwc_bn_kernels: bool,
    /// Run convolutions through execution plans of cuDNN's graph API, built once per shape
    /// (`BURN_VISION_CUDNN_GRAPH=0` uses the legacy `cudnnConvolution*` entry points, which
    /// cost several times the host time per call).
    pub graph_api: bool,
}

impl Default for CudnnOptions {
    fn default() -> Self {
        Self { enabled: true, allow_tf32: true, deterministic: false, workspace_limit: 512 << 20, pack_inputs: true, batch_norm: true, host_sync: false, fuse_conv_bn: true, nhwc_bn_kernels: true, graph_api: true }
    }
}

impl CudnnOptions {
    /// The defaults, overridden by the `BURN_VISION_CUDNN*` environment variables.
    pub fn from_env() -> Self {
        let mut o = Self::default();
        let flag = |name: &str| std::env::var(name).ok().map(|v| !matches!(v.trim(), "0" | "false" | "off" | ""));
        let switches = [
            ("BURN_VISION_CUDNN", &mut o.enabled),
            ("BURN_VISION_CUDNN_TF32", &mut o.allow_tf32),
            ("BURN_VISION_CUDNN_DETERMINISTIC", &mut o.deterministic),
            ("BURN_VISION_CUDNN_FUSE", &mut o.fuse_conv_bn),
            ("BURN_VISION_CUDNN_HOST_SYNC", &mut o.host_sync),
            ("BURN_VISION_CUDNN_BN", &mut o.batch_norm),
            ("BURN_VISION_CUDNN_PACK", &mut o.pack_inputs),
            ("BURN_VISION_BN_KERNELS", &mut o.nhwc_bn_kernels),
            ("BURN_VISION_CUDNN_GRAPH", &mut o.graph_api),
        ];
        for (name, field) in switches {
            if let Some(v) = flag(name) {
                *field = v;
            }
        }
        if let Some(mib) = std::env::var("BURN_VISION_CUDNN_WORKSPACE_MIB").ok().and_then(|v| v.trim().parse::<usize>().ok()) {
            o.workspace_limit = mib << 20;
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
        assert!(o.enabled && o.allow_tf32 && !o.deterministic);
        assert_eq!(o.workspace_limit, 512 << 20);
    }
}
