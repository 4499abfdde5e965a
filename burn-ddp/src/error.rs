//! The error type of burn-ddp: rendezvous, collectives, launch.

use std::time::Duration;

/// Everything that can go wrong in the distributed runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The crate was built without the `cuda` feature but NCCL was asked for.
    #[error("this build has no CUDA support; rebuild with `--features cuda`")]
    CudaNotCompiled,
    /// A socket or file operation failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Waiting for peers took longer than allowed.
    #[error("{op} timed out after {waited:?} on rank {rank}; missing ranks: {missing:?}")]
    Timeout {
        /// The operation.
        op: String,
        /// This rank.
        rank: usize,
        /// How long it waited.
        waited: Duration,
        /// Ranks that never arrived (empty when unknown).
        missing: Vec<usize>,
    },
    /// A peer closed its connection or sent something malformed.
    #[error("{op}: peer rank {peer} failed: {reason}")]
    PeerFailed {
        /// The operation.
        op: String,
        /// The peer's rank.
        peer: usize,
        /// What was seen.
        reason: String,
    },
    /// The rendezvous store refused or broke a request.
    #[error("store: {reason}")]
    Store {
        /// What happened.
        reason: String,
    },
    /// A listening port is taken.
    #[error(
        "port {port} on {addr} is already in use; pick another MASTER_PORT or use --standalone (or another process is rank 0 already: two nodes given the same --node-rank?)"
    )]
    PortInUse {
        /// The address.
        addr: String,
        /// The port.
        port: u16,
    },
    /// A required environment variable is missing or malformed.
    #[error("environment variable {name}: {reason}")]
    Env {
        /// Its name.
        name: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Ranks disagree on a buffer's size or type.
    #[error("{op}: rank {rank} has {got} elements of {dtype}, rank 0 has {expected}")]
    Mismatch {
        /// The collective.
        op: String,
        /// Which rank.
        rank: usize,
        /// Its size.
        got: usize,
        /// Rank 0's size.
        expected: usize,
        /// The data type.
        dtype: String,
    },
    /// A parameter got a gradient on some ranks only (or on none).
    #[error("parameter `{name}` (#{index}, shape {shape:?}) has no gradient {where_}; every rank must use every parameter in the forward pass, or set DdpConfig::find_unused_parameters (missing gradients then count as zero)", where_ = if *everywhere { "on any rank".to_string() } else { format!("on some ranks only (seen from rank {rank})") })]
    UnusedParameter {
        /// Its path in the module, e.g. `layer1.0.conv1.weight`.
        name: String,
        /// Index in registration order.
        index: usize,
        /// Its shape.
        shape: Vec<usize>,
        /// True when no rank has a gradient for it.
        everywhere: bool,
        /// The reporting rank.
        rank: usize,
    },
    /// NCCL or the CUDA driver returned an error.
    #[error("{op}: {reason}")]
    Cuda {
        /// The call.
        op: String,
        /// The library's message.
        reason: String,
    },
    /// cuDNN could not be loaded, refused a computation or failed (the layers in [`crate::nn`]
    /// then run burn's kernels).
    #[error("cuDNN {op}: {reason}")]
    Cudnn {
        /// What was being done.
        op: &'static str,
        /// cuDNN's status or the reason.
        reason: String,
    },
    /// One of burn-ddp's own CUDA kernels cannot take these tensors (the caller falls back
    /// to burn's operations).
    #[error("CUDA kernel {op}: {reason}")]
    Kernel {
        /// What was being done.
        op: &'static str,
        /// Why it cannot run.
        reason: String,
    },
    /// A setting with a value it cannot take.
    #[error("invalid setting {name}={value}: {reason}")]
    InvalidValue {
        /// The setting.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it accepts.
        reason: String,
    },
    /// A feature used with a backend or setting it does not support.
    #[error("unsupported: {what}")]
    Unsupported {
        /// What was asked for, and what would work.
        what: String,
    },
}

impl Error {
    /// An I/O error during `op`.
    pub fn io(op: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { op: op.into(), source }
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
