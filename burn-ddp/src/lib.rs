//! Multi-GPU training for Burn: rendezvous store, process groups (TCP, NCCL), launcher,
//! DistributedDataParallel, DataParallel, SyncBatchNorm, the distributed and shard samplers — and [`nn`],
//! layers any Burn model can use in place of burn-nn's to get cuDNN convolutions and fast
//! batch norms on burn-cuda.

mod collective_time;
#[cfg(feature = "cuda")]
pub mod cuda_tensor;
pub mod data_parallel;
pub mod ddp;
pub mod device;
mod diagnose;
pub mod doctor;
pub mod error;
pub mod grad_ready;
pub mod launch;
pub mod launch_agent;
pub mod launch_env;
pub mod nn;
pub mod params;
pub mod process_group;
mod reducer;
pub mod rendezvous;
mod same_type;
pub mod sampler;
pub mod shard_sampler;
pub mod store;
pub mod sync_batch_norm;
mod sync_batch_norm_exchange;
#[cfg(feature = "cuda")]
mod sync_batch_norm_nhwc;
pub mod tensor;
#[cfg(feature = "testing")]
pub mod testing;
pub mod trace;

pub use data_parallel::{DataParallel, DataParallelStep};
pub use ddp::{DdpConfig, DdpStep, DistributedDataParallel, GradCompression, SyncStats};
pub use device::{check_gpu_ids, cuda_device_count, gpu_memory_used};
pub use error::{Error, Result};
pub use process_group::{ProcessGroup, ReduceOp};
pub use rendezvous::{
    CommBackend, Group, RendezvousConfig, init_process_group, init_process_groups, init_process_groups_on, rendezvous,
};
pub use sampler::{DistributedSampler, shard_exact};
pub use shard_sampler::ShardSampler;
pub use sync_batch_norm::{BatchNormSync, sync_batch_norm, sync_batch_norm_relu};
