//! How burn's buffers reach cuDNN, cuBLAS and our kernels: the launch through cubecl's device
//! thread, the device-side ordering of other streams with burn's (cuDNN's, NCCL's), burn-fusion
//! operations, page-locked uploads and device-decoded batches.

pub mod burn_stream;
pub(crate) mod decode;
pub(crate) mod device_thread;
pub(crate) mod fusion_op;
pub(crate) mod launch;
pub(crate) mod same_stream;
pub(crate) mod side_stream;
pub(crate) mod stream_bridge;
pub(crate) mod upload;
