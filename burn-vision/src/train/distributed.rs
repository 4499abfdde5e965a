//! This process's place in a multi-process run: the DDP wrapper and the rank arithmetic the
//! training loop needs (sharding, reductions of metrics). One process = `None` everywhere.

use crate::error::{Error, Result};
use burn_ddp::{
    CommBackend as Collectives, DdpConfig, DistributedDataParallel, ProcessGroup, ReduceOp, RendezvousConfig,
    init_process_groups_on,
};
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
    /// Joins the group described by the launcher's environment (torchrun / `burn-ddp launch`,
    /// Slurm, OpenMPI: the world comes from there, not from `--nproc`); `None` for a plain
    /// single process. `gpus`: the GPUs `--gpus` names on this node; local rank i trains on
    /// `gpus[i]`, and its NCCL group lives there too. With them, gradients travel over NCCL (set
    /// `BURN_VISION_COLLECTIVES=tcp` to send them through host memory instead); host values
    /// always use a TCP group beside it. `ddp`: DDP's settings; its `overlap` (gradient buckets
    /// all-reduced while backward runs) — pass it off with SyncBatchNorm, whose backward uses
    /// the same group; on NCCL it stays on regardless (collectives are enqueued on the device
    /// in program order, so SyncBatchNorm's and DDP's interleave alike on every rank).
    /// `timeout_s` replaces `BURN_DDP_TIMEOUT_S` for the rendezvous and every collective.
    ///
    /// # Errors
    /// Rendezvous failures, NCCL set-up failures, or a local rank without a GPU in `--gpus`.
    pub fn from_env(gpus: Option<&[usize]>, timeout_s: Option<f64>, ddp: DdpConfig) -> Result<Option<Self>> {
        if !burn_ddp::launch_env::launched(&|k| std::env::var(k).ok()) {
            return Ok(None);
        }
        let mut config = RendezvousConfig::from_env()?;
        if let Some(t) = timeout_s {
            config.timeout = std::time::Duration::from_secs_f64(t);
        }
        if let Some(n) = gpus.map(<[usize]>::len).filter(|&n| config.local_rank >= n) {
            return Err(Error::InvalidConfig {
                name: "--gpus",
                value: format!("{n} GPU(s)"),
                reason: format!(
                    "this process is local rank {} of {} on its node: list one GPU per local rank (each node names its own GPUs)",
                    config.local_rank, config.local_world_size
                ),
            });
        }
        // This rank's GPU: the local rank's entry of --gpus (NCCL's group lives on it too).
        let device = gpus.map(|ids| ids[config.local_rank]);
        Self::join(&config, device, ddp).map(Some)
    }

    /// A world of this process alone: a one-rank group of its own on a free loopback port, so
    /// DDP runs its whole path — every bucket through the group (NCCL on `gpu`, TCP on the CPU
    /// when `None`) — with no peer to wait for: what `bench --ddp` times against plain steps.
    /// `ddp`: DDP's settings, its `overlap` exactly as given.
    ///
    /// # Errors
    /// As [`Distributed::from_env`].
    pub fn alone(gpu: Option<usize>, ddp: DdpConfig) -> Result<Self> {
        let d = Self::join(&RendezvousConfig::single_process(gpu.unwrap_or(0)), gpu, ddp)?;
        // `overlap` exactly as asked (the training loop keeps it on over NCCL).
        Ok(Self { ddp: DistributedDataParallel::new(d.device_group.clone(), ddp), ..d })
    }

    /// The groups of the world `config` describes, DDP over the device group: NCCL on `gpu` when
    /// the rank trains on one, TCP otherwise.
    fn join(config: &RendezvousConfig, gpu: Option<usize>, ddp: DdpConfig) -> Result<Self> {
        let nccl = gpu.is_some() && std::env::var("BURN_VISION_COLLECTIVES").map_or(true, |v| v != "tcp");
        let backends: &[Collectives] = if nccl { &[Collectives::Tcp, Collectives::Nccl] } else { &[Collectives::Tcp] };
        let groups =
            init_process_groups_on(backends, config, gpu.unwrap_or(config.local_rank)).map_err(|e| match e {
                burn_ddp::Error::Cuda { op, reason } if nccl => burn_ddp::Error::Cuda {
                    op,
                    reason: format!(
                        "{reason} (or set BURN_VISION_COLLECTIVES=tcp to average gradients through host memory)"
                    ),
                },
                other => other,
            })?;
        let host_group: Arc<dyn ProcessGroup> = groups[0].clone();
        let device_group: Arc<dyn ProcessGroup> = groups[groups.len() - 1].clone();
        if config.rank == 0 {
            log::info!(
                "{} ranks from {}; gradients over {}, metrics over {}",
                config.world_size,
                config.source,
                device_group.backend(),
                host_group.backend()
            );
        }
        Ok(Self {
            ddp: DistributedDataParallel::new(device_group.clone(), DdpConfig { overlap: ddp.overlap || nccl, ..ddp }),
            device_group,
            host_group,
            rank: config.rank,
            world: config.world_size,
            local_rank: config.local_rank,
        })
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
