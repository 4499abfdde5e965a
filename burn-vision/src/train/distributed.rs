//! This process's place in a multi-process run: the DDP wrapper and the rank arithmetic the
//! training loop needs (sharding, reductions of metrics). One process = `None` everywhere.

use crate::error::{Error, Result};
use burn_ddp::{CommBackend as Collectives, DdpConfig, DistributedDataParallel, ProcessGroup, ReduceOp, RendezvousConfig, init_process_groups};
use std::sync::Arc;

/// A joined process group with DDP on top.
pub struct Distributed {
    /// Gradient averaging and broadcasts, on the devices' memory (NCCL between GPUs).
    pub ddp: DistributedDataParallel,
    /// The group DDP uses (for SyncBatchNorm too).
    pub device_group: Arc<dyn ProcessGroup>,
    /// Host-side values (metrics, tallies): TCP.
    host_group: Arc<dyn ProcessGroup>,
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// This rank's index on its node (its GPU).
    pub local_rank: usize,
}

impl Distributed {
    /// Joins the group described by the launcher's environment when `RANK` is set; `None` for a
    /// plain single process. With `gpus`, gradients travel over NCCL on the GPUs (set
    /// `BURN_VISION_COLLECTIVES=tcp` to send them through host memory instead); host values
    /// always use a TCP group beside it. `overlap`: DDP all-reduces gradient buckets while
    /// backward runs (off with SyncBatchNorm, whose backward uses the same group).
    ///
    /// # Errors
    /// Rendezvous failures, NCCL set-up failures, or a WORLD_SIZE that differs from the
    /// configured number of devices.
    pub fn from_env(expected_world: usize, gpus: bool, overlap: bool) -> Result<Option<Self>> {
        if std::env::var("RANK").is_err() {
            return Ok(None);
        }
        let config = RendezvousConfig::from_env()?;
        if config.world_size != expected_world {
            return Err(Error::InvalidConfig {
                name: "WORLD_SIZE",
                value: config.world_size.to_string(),
                reason: format!("the training config asks for {expected_world} processes (--nproc / --gpus)"),
            });
        }
        let nccl = gpus && std::env::var("BURN_VISION_COLLECTIVES").map_or(true, |v| v != "tcp");
        let backends: &[Collectives] = if nccl { &[Collectives::Tcp, Collectives::Nccl] } else { &[Collectives::Tcp] };
        let groups = init_process_groups(backends, &config).map_err(|e| match e {
            burn_ddp::Error::Cuda { op, reason } if nccl => burn_ddp::Error::Cuda { op, reason: format!("{reason} (or set BURN_VISION_COLLECTIVES=tcp to average gradients through host memory)") },
            other => other,
        })?;
        let host_group: Arc<dyn ProcessGroup> = groups[0].clone();
        let device_group: Arc<dyn ProcessGroup> = groups[groups.len() - 1].clone();
        if config.rank == 0 {
            log::info!("gradients over {}, metrics over {}", device_group.backend(), host_group.backend());
        }
        Ok(Some(Self {
            ddp: DistributedDataParallel::new(device_group.clone(), DdpConfig { overlap, ..DdpConfig::default() }),
            device_group,
            host_group,
            rank: config.rank,
            world: config.world_size,
            local_rank: config.local_rank,
        }))
    }

    /// The host-memory group (metrics and tallies).
    pub fn pg(&self) -> &dyn ProcessGroup {
        &*self.host_group
    }

    /// Sums `values` across ranks in place.
    ///
    /// # Errors
    /// Collective failures.
    pub fn sum(&self, values: &mut [f64]) -> Result<()> {
        Ok(burn_ddp::tensor::all_reduce_f64(self.pg(), values, ReduceOp::Sum)?)
    }

    /// Every rank's `values` side by side (rank-major), on every rank.
    ///
    /// # Errors
    /// Collective failures.
    pub fn gather(&self, values: &[f64]) -> Result<Vec<f64>> {
        let k = values.len();
        let mut all = vec![0.0; k * self.world];
        all[self.rank * k..(self.rank + 1) * k].copy_from_slice(values);
        self.sum(&mut all)?;
        Ok(all)
    }
}

/// Shares `Distributed` by reference where it exists.
pub type Dist<'a> = Option<&'a Distributed>;
