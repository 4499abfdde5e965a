//! env:// rendezvous: read what the launcher set (torchrun, ours, Slurm, OpenMPI: see
//! `launch_env`), start the store on rank 0,
//! meet every rank with a time-out that names the ranks that never came, and build the
//! process group.

use crate::error::{Error, Result};
use crate::process_group::buffer::MemoryKind;
use crate::process_group::*;
use crate::store::client::Store;
use crate::store::client::TcpStore;
use crate::store::server::StoreServer;
use std::sync::Arc;
use std::time::Duration;

/// How long rank 0 keeps its store up after a failed rendezvous, for the other ranks' sake.
const RENDEZVOUS_GRACE: Duration = Duration::from_secs(3);

/// Where and who this process is in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RendezvousConfig {
    /// Host of rank 0's store (MASTER_ADDR).
    pub master_addr: String,
    /// Port of the store (MASTER_PORT).
    pub master_port: u16,
    /// Global rank (RANK).
    pub rank: usize,
    /// Number of ranks (WORLD_SIZE).
    pub world_size: usize,
    /// Rank on this node (LOCAL_RANK): the GPU ordinal by convention.
    pub local_rank: usize,
    /// Ranks on this node (LOCAL_WORLD_SIZE).
    pub local_world_size: usize,
    /// Time-out of rendezvous and of every collective (BURN_DDP_TIMEOUT_S, default 300 s).
    pub timeout: Duration,
    /// Shared secret peers must present (BURN_DDP_TOKEN).
    pub token: Option<String>,
    /// Which launcher's variables this came from.
    pub source: crate::launch_env::EnvSource,
}

impl RendezvousConfig {
    /// This process's place from its launcher's environment (torchrun / `burn-ddp launch`,
    /// Slurm, OpenMPI: see [`crate::launch_env`] for the order and the variables), plus
    /// BURN_DDP_TIMEOUT_S and BURN_DDP_TOKEN.
    ///
    /// # Errors
    /// [`Error::Env`] naming a missing or malformed variable, a rank outside the world, or no
    /// launcher's variables at all.
    pub fn from_env() -> Result<Self> {
        let var = |name: &str| std::env::var(name).ok();
        let place = crate::launch_env::detect(&var)?.ok_or(Error::Env {
            name: "RANK",
            reason: "not set; start the program with `burn-ddp launch`, torchrun, srun or mpirun, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT yourself".into(),
        })?;
        let timeout_s = match var("BURN_DDP_TIMEOUT_S") {
            Some(v) => v.trim().parse::<f64>().ok().filter(|s| *s > 0.0).ok_or(Error::Env {
                name: "BURN_DDP_TIMEOUT_S",
                reason: format!("`{v}` is not a positive number of seconds"),
            })?,
            None => DEFAULT_TIMEOUT.as_secs_f64(),
        };
        let config = Self {
            master_addr: place.master_addr,
            master_port: place.master_port,
            rank: place.rank,
            world_size: place.world_size,
            local_rank: place.local_rank,
            local_world_size: place.local_world_size,
            timeout: Duration::from_secs_f64(timeout_s),
            token: var("BURN_DDP_TOKEN"),
            source: place.source,
        };
        config.check()?;
        Ok(config)
    }

    /// [`from_env`](Self::from_env) under a launcher; with none of the launchers' rank
    /// variables set, a world of this process alone ([`single_process`](Self::single_process),
    /// logged), so one program runs alone or under any launcher.
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env) when a launcher's variables are set but wrong.
    pub fn from_env_or_single_process() -> Result<Self> {
        let var = |name: &str| std::env::var(name).ok();
        if crate::launch_env::detect(&var)?.is_some() {
            return Self::from_env();
        }
        log::info!("no launcher's variables (RANK, WORLD_SIZE, MASTER_ADDR, ...): running as a world of one process");
        Ok(Self::single_process(0))
    }

    /// A world of this process alone, its store on a free loopback port (`master_port` 0:
    /// the system picks it), its device `device` (`local_rank`; the local world then counts
    /// up to it): the same program runs without a launcher, and every collective still goes
    /// through a real group.
    pub fn single_process(device: usize) -> Self {
        Self {
            master_addr: "127.0.0.1".into(),
            master_port: 0,
            rank: 0,
            world_size: 1,
            local_rank: device,
            local_world_size: device + 1,
            timeout: DEFAULT_TIMEOUT,
            token: None,
            source: crate::launch_env::EnvSource::SingleProcess,
        }
    }

    /// Checks that the rank fits in the world.
    ///
    /// # Errors
    /// [`Error::Env`] otherwise.
    pub fn check(&self) -> Result<()> {
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(Error::Env {
                name: "RANK",
                reason: format!("rank {} is outside WORLD_SIZE={}", self.rank, self.world_size),
            });
        }
        if self.master_port == 0 && self.world_size > 1 {
            return Err(Error::Env {
                name: "MASTER_PORT",
                reason: "0 (a port the system picks) serves a world of one process only; give every rank the same port"
                    .into(),
            });
        }
        if self.local_rank >= self.local_world_size.max(1) {
            return Err(Error::Env {
                name: "LOCAL_RANK",
                reason: format!("{} is outside LOCAL_WORLD_SIZE={}", self.local_rank, self.local_world_size),
            });
        }
        Ok(())
    }
}

/// The meeting: the store client (and on rank 0 the server) that every later step uses.
pub struct Rendezvous {
    /// This rank's settings.
    pub config: RendezvousConfig,
    /// The connection to the store.
    pub store: Arc<TcpStore>,
    _server: Option<StoreServer>,
}

/// Starts the store on rank 0, connects every rank and waits for all of them.
///
/// # Errors
/// [`Error::PortInUse`] on rank 0 when the port is taken; [`Error::Timeout`] naming the ranks
/// that never arrived; [`Error::Env`] when ranks disagree on WORLD_SIZE.
pub fn rendezvous(config: &RendezvousConfig) -> Result<Rendezvous> {
    config.check()?;
    let server = if config.rank == 0 {
        let bind_host = if config.master_addr == "localhost" { "127.0.0.1" } else { config.master_addr.as_str() };
        Some(StoreServer::bind(bind_host, config.master_port, config.token.clone())?)
    } else {
        None
    };
    // Port 0 (a world of one): the port the system gave the store.
    let port = server.as_ref().map_or(config.master_port, |s| s.local_addr().port());
    let store =
        TcpStore::connect(&config.master_addr, port, config.token.as_deref(), config.timeout).map_err(|e| match e {
            Error::Timeout { waited, .. } => Error::Timeout {
                op: format!("connecting to rank 0's store at {}:{}", config.master_addr, config.master_port),
                rank: config.rank,
                waited,
                missing: vec![0],
            },
            other => other,
        })?;
    // Two processes with one rank (two nodes given the same --node-rank, say): the second one
    // to arrive stops at once, naming the cause.
    if store.add(&format!("rdzv/claim/{}", config.rank), 1)? > 1 {
        return Err(Error::Env {
            name: "RANK",
            reason: format!(
                "rank {} joined twice: two processes claim it (two nodes with the same --node-rank?); give every node its own",
                config.rank
            ),
        });
    }
    store.set(&format!("rdzv/world/{}", config.rank), config.world_size.to_string().as_bytes())?;
    let keys: Vec<String> = (0..config.world_size).map(|r| format!("rdzv/world/{r}")).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    if let Err(missing) = store.wait_missing(&key_refs, config.timeout)? {
        let ranks = missing.0.iter().filter_map(|k| k.rsplit('/').next()?.parse().ok()).collect();
        if config.rank == 0 {
            // Ranks that arrived a little later are still waiting on this store: keep serving
            // until their own time-outs have run out, so they too learn which ranks are missing.
            std::thread::sleep(config.timeout.min(RENDEZVOUS_GRACE));
        }
        return Err(Error::Timeout {
            op: "rendezvous".into(),
            rank: config.rank,
            waited: config.timeout,
            missing: ranks,
        });
    }
    for (r, key) in keys.iter().enumerate() {
        let theirs = String::from_utf8_lossy(&store.get(key)?).into_owned();
        if theirs != config.world_size.to_string() {
            return Err(Error::Env {
                name: "WORLD_SIZE",
                reason: format!(
                    "rank {r} has WORLD_SIZE={theirs}, rank {} has {}; start every rank with the same value",
                    config.rank, config.world_size
                ),
            });
        }
    }
    Ok(Rendezvous { config: config.clone(), store: Arc::new(store), _server: server })
}

/// Which collective library to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommBackend {
    /// TCP sockets, host memory.
    Tcp,
    /// NCCL, CUDA memory on GPU `LOCAL_RANK`.
    Nccl,
}

/// A process group together with the rendezvous that keeps rank 0's store alive.
pub struct Group {
    inner: Box<dyn ProcessGroup>,
    rendezvous: Arc<Rendezvous>,
}

impl Group {
    /// The rendezvous (config and store).
    pub fn rendezvous(&self) -> &Rendezvous {
        &self.rendezvous
    }
}

/// Rendezvous, then the process group of `backend`.
///
/// # Errors
/// As [`rendezvous`], plus the backend's set-up errors.
pub fn init_process_group(backend: CommBackend, config: &RendezvousConfig) -> Result<Arc<Group>> {
    Ok(init_process_groups(&[backend], config)?.remove(0))
}

/// One rendezvous, then one process group per entry of `backends` over the same ranks — e.g.
/// NCCL for gradients on the GPUs next to TCP for host-side values (metrics, agreement checks),
/// as PyTorch runs a gloo group beside an NCCL one. At most one group per backend.
///
/// # Errors
/// As [`rendezvous`], plus each backend's set-up errors.
///
/// # Panics
/// If a backend is listed twice (their set-up keys in the store would collide).
pub fn init_process_groups(backends: &[CommBackend], config: &RendezvousConfig) -> Result<Vec<Arc<Group>>> {
    init_process_groups_on(backends, config, config.local_rank)
}

/// As [`init_process_groups`], with NCCL's communicator on CUDA device `device` instead of the
/// local rank's ordinal: for ranks that train on GPUs picked from a list (`--gpus 2,3` makes
/// local rank 0 train on GPU 2, and its NCCL group must live there too).
///
/// # Errors
/// As [`init_process_groups`].
pub fn init_process_groups_on(
    backends: &[CommBackend],
    config: &RendezvousConfig,
    device: usize,
) -> Result<Vec<Arc<Group>>> {
    for (i, b) in backends.iter().enumerate() {
        assert!(!backends[..i].contains(b), "Got backend {b:?} twice in {backends:?}; one group per backend");
    }
    let rdzv = Arc::new(rendezvous(config)?);
    let mut groups = Vec::with_capacity(backends.len());
    for &backend in backends {
        let inner: Box<dyn ProcessGroup> = match backend {
            CommBackend::Tcp => Box::new(
                TcpProcessGroup::new(
                    &*rdzv.store,
                    rdzv.store.local_ip()?,
                    config.rank,
                    config.world_size,
                    config.timeout,
                )?
                .with_hang_check(rdzv.store.clone()),
            ),
            CommBackend::Nccl => {
                Box::new(NcclProcessGroup::new(&*rdzv.store, config.rank, config.world_size, device, config.timeout)?)
            }
        };
        // Everyone has finished set-up (and used the store) before anyone may leave.
        inner.barrier(&BarrierOptions::default())?;
        groups.push(Arc::new(Group { inner, rendezvous: rdzv.clone() }));
    }
    Ok(groups)
}

impl ProcessGroup for Group {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn memory(&self) -> MemoryKind {
        self.inner.memory()
    }
    fn as_nccl(&self) -> Option<&crate::process_group::nccl::NcclProcessGroup> {
        self.inner.as_nccl()
    }
    fn all_reduce(&self, buf: Buffer<'_>, opts: &AllReduceOptions) -> Result<()> {
        self.inner.all_reduce(buf, opts)
    }
    fn broadcast(&self, buf: Buffer<'_>, opts: &BroadcastOptions) -> Result<()> {
        self.inner.broadcast(buf, opts)
    }
    fn all_gather(&self, input: Buffer<'_>, output: Buffer<'_>, opts: &AllGatherOptions) -> Result<()> {
        self.inner.all_gather(input, output, opts)
    }
    fn reduce_scatter(&self, input: Buffer<'_>, output: Buffer<'_>, opts: &ReduceScatterOptions) -> Result<()> {
        self.inner.reduce_scatter(input, output, opts)
    }
    fn barrier(&self, opts: &BarrierOptions) -> Result<()> {
        self.inner.barrier(opts)
    }
}
