//! This process's place in a multi-process run: the DDP wrapper and the rank arithmetic the
//! training loop needs (sharding, reductions of metrics). One process = `None` everywhere.

use crate::error::{Error, Result};
use burn_ddp::{Backend as Collectives, DdpConfig, DistributedDataParallel, ProcessGroup, ReduceOp, RendezvousConfig, init_process_group};

/// A joined process group with DDP on top.
pub struct Distributed {
    /// Gradient averaging and broadcasts.
    pub ddp: DistributedDataParallel,
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// This rank's index on its node (its GPU).
    pub local_rank: usize,
}

impl Distributed {
    /// Joins the group described by the launcher's environment when `RANK` is set; `None` for a
    /// plain single process.
    ///
    /// # Errors
    /// Rendezvous failures, or a WORLD_SIZE that differs from the configured number of devices.
    pub fn from_env(expected_world: usize) -> Result<Option<Self>> {
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
        // Gradients travel through host memory over TCP for now, on CPUs and GPUs alike.
        let pg = init_process_group(Collectives::Tcp, &config)?;
        Ok(Some(Self { ddp: DistributedDataParallel::new(pg, DdpConfig::default()), rank: config.rank, world: config.world_size, local_rank: config.local_rank }))
    }

    /// The process group.
    pub fn pg(&self) -> &dyn ProcessGroup {
        self.ddp.process_group()
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
