//! Multi-process data-parallel training for Burn: rendezvous store, process groups (TCP, NCCL),
//! launcher, DistributedDataParallel, SyncBatchNorm and the distributed sampler.

pub mod device;
pub mod error;
pub mod params;

pub use device::{check_gpu_ids, cuda_device_count};
pub use error::{Error, Result};
