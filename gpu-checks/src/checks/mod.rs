//! The checks, one file per family of GPU operations. Each check prints its `RESULT` lines and
//! returns whether every one of them passed.

pub(crate) mod activations;
pub(crate) mod attention;
pub(crate) mod batch_norm;
pub(crate) mod convolution;
pub(crate) mod decode;
pub(crate) mod layer_norm;
pub(crate) mod loss;
pub(crate) mod memory;
pub(crate) mod nccl;
pub(crate) mod optimizer;
pub(crate) mod ordering;
pub(crate) mod products;
pub(crate) mod stream_probe;
pub(crate) mod sync_batch_norm;
