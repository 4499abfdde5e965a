//! Who this process is in the job, from whichever launcher started it — detected in this order:
//!
//! 1. torchrun, `burn-ddp launch`, or by hand: `RANK`, `WORLD_SIZE` (`LOCAL_RANK`,
//!    `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`);
//! 2. Slurm's `srun`: `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NTASKS_PER_NODE`,
//!    `SLURM_NODEID`; `MASTER_ADDR` defaults to the first host of `SLURM_JOB_NODELIST`
//!    (compressed lists such as `gpu[01-04,07]` included);
//! 3. OpenMPI's `mpirun`: `OMPI_COMM_WORLD_RANK` (or PMIx's `PMIX_RANK`),
//!    `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_SIZE`;
//!    `MASTER_ADDR` defaults to 127.0.0.1 only when every rank is on this node.
//!
//! `MASTER_ADDR` and `MASTER_PORT` set by the user always win; under Slurm and MPI the port
//! defaults to 29500 (torchrun's). Under torchrun's agent store (`TORCHELASTIC_USE_AGENT_STORE=True`,
//! as `torchrun --standalone` and its c10d rendezvous set it) PyTorch's own TCPStore already
//! listens on `MASTER_PORT`, so our store takes the port after it (seen on the GPU machine:
//! rank 0 found `MASTER_PORT` busy). Environment variables only: no sockets, no processes.

use crate::error::{Error, Result};

/// The launcher whose variables named this process's place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvSource {
    /// `RANK`/`WORLD_SIZE`: torchrun, `burn-ddp launch`, or set by hand.
    Torchrun,
    /// Slurm's `srun`.
    Slurm,
    /// OpenMPI's `mpirun` (or another PMIx launcher that sets OpenMPI's sizes).
    OpenMpi,
    /// No launcher: a world of this process alone (`RendezvousConfig::single_process`).
    SingleProcess,
}

impl std::fmt::Display for EnvSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EnvSource::Torchrun => "RANK/WORLD_SIZE (torchrun or burn-ddp launch)",
            EnvSource::Slurm => "Slurm (SLURM_PROCID/SLURM_NTASKS)",
            EnvSource::OpenMpi => "OpenMPI (OMPI_COMM_WORLD_RANK/SIZE)",
            EnvSource::SingleProcess => "this process alone (no launcher)",
        })
    }
}

/// This process's place in the job, as the launcher described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobPlace {
    /// Which launcher's variables were read.
    pub source: EnvSource,
    /// Global rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Rank on this node (the GPU to use, by convention).
    pub local_rank: usize,
    /// Ranks on this node.
    pub local_world_size: usize,
    /// Host of rank 0's store.
    pub master_addr: String,
    /// Port of rank 0's store.
    pub master_port: u16,
}

/// Whether any known launcher started this process (a plain run is alone).
pub fn launched(var: &dyn Fn(&str) -> Option<String>) -> bool {
    ["RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"].iter().any(|v| var(v).is_some())
}

/// Which restart of the job this process belongs to (0: the first start): `burn-ddp launch`'s
/// `BURN_DDP_RESTART_COUNT`, torchrun's `TORCHELASTIC_RESTART_COUNT`, or Slurm's
/// `SLURM_RESTART_COUNT` (a requeued job), the first one set; malformed values count as 0.
pub fn restart_count(var: &dyn Fn(&str) -> Option<String>) -> u64 {
    ["BURN_DDP_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"]
        .iter()
        .find_map(|v| var(v))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn parse<T: std::str::FromStr>(var: &dyn Fn(&str) -> Option<String>, name: &'static str) -> Result<Option<T>> {
    match var(name) {
        Some(v) => {
            v.trim().parse().map(Some).map_err(|_| Error::Env { name, reason: format!("`{v}` is not a valid value") })
        }
        None => Ok(None),
    }
}

fn required<T: std::str::FromStr>(var: &dyn Fn(&str) -> Option<String>, name: &'static str, hint: &str) -> Result<T> {
    parse(var, name)?.ok_or_else(|| Error::Env { name, reason: format!("not set; {hint}") })
}

/// Reads the place from the first launcher found (see the module's order).
///
/// # Errors
/// [`Error::Env`] naming a missing or malformed variable; `Ok(None)` when no launcher did.
pub fn detect(var: &dyn Fn(&str) -> Option<String>) -> Result<Option<JobPlace>> {
    let port = |default: Option<u16>| -> Result<u16> {
        match parse::<u16>(var, "MASTER_PORT")? {
            Some(p) => Ok(p),
            None => default.ok_or(Error::Env {
                name: "MASTER_PORT",
                reason: "not set; start the program with `burn-ddp launch` or torchrun, or set it yourself".into(),
            }),
        }
    };
    if var("RANK").is_some() {
        let rank: usize = required(var, "RANK", "")?;
        let world_size: usize = required(var, "WORLD_SIZE", "RANK is set, so WORLD_SIZE must be too")?;
        let master_addr = var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
        let (local_rank, local_world_size) =
            (parse(var, "LOCAL_RANK")?.unwrap_or(rank), parse(var, "LOCAL_WORLD_SIZE")?.unwrap_or(world_size));
        let master_port = beside_agent_store(var, port(None)?)?;
        return Ok(Some(JobPlace {
            source: EnvSource::Torchrun,
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
        }));
    }
    if var("SLURM_PROCID").is_some() {
        return slurm(var, port(Some(29500))?).map(Some);
    }
    if var("OMPI_COMM_WORLD_RANK").is_some() || var("PMIX_RANK").is_some() {
        return open_mpi(var, port(Some(29500))?).map(Some);
    }
    Ok(None)
}

/// `port`, or the port after it when torchrun's agent hosts its TCPStore on `port`.
fn beside_agent_store(var: &dyn Fn(&str) -> Option<String>, port: u16) -> Result<u16> {
    if !var("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(port);
    }
    port.checked_add(1).ok_or(Error::Env {
        name: "MASTER_PORT",
        reason: "65535 is torchrun's store; our store needs the port after it: give torchrun a lower --master-port"
            .into(),
    })
}

fn slurm(var: &dyn Fn(&str) -> Option<String>, master_port: u16) -> Result<JobPlace> {
    let rank: usize = required(var, "SLURM_PROCID", "")?;
    let world_size: usize = required(var, "SLURM_NTASKS", "start the job with srun (it sets SLURM_NTASKS)")?;
    let local_rank: usize = required(var, "SLURM_LOCALID", "start the job with srun (it sets SLURM_LOCALID)")?;
    // "4" or "4(x2),2": the tasks on the first nodes; the count for this node is not needed
    // beyond checking LOCAL ranks, so the largest per-node count bounds it.
    let per_node = var("SLURM_NTASKS_PER_NODE").or_else(|| var("SLURM_TASKS_PER_NODE"));
    let local_world_size = per_node
        .as_deref()
        .and_then(|s| s.split(',').filter_map(|p| p.split('(').next()?.trim().parse::<usize>().ok()).max())
        .unwrap_or(world_size);
    let master_addr = match var("MASTER_ADDR") {
        Some(a) => a,
        None => {
            let list = var("SLURM_JOB_NODELIST").or_else(|| var("SLURM_NODELIST")).ok_or(Error::Env {
                name: "MASTER_ADDR",
                reason: "not set, and no SLURM_JOB_NODELIST to take the first host from".into(),
            })?;
            first_host(&list)?
        }
    };
    Ok(JobPlace { source: EnvSource::Slurm, rank, world_size, local_rank, local_world_size, master_addr, master_port })
}

fn open_mpi(var: &dyn Fn(&str) -> Option<String>, master_port: u16) -> Result<JobPlace> {
    let rank: usize = match parse(var, "OMPI_COMM_WORLD_RANK")? {
        Some(r) => r,
        None => required(var, "PMIX_RANK", "")?,
    };
    let world_size: usize = required(
        var,
        "OMPI_COMM_WORLD_SIZE",
        "the MPI launcher must set OMPI_COMM_WORLD_SIZE (or set RANK/WORLD_SIZE yourself)",
    )?;
    let local_rank: usize = parse(var, "OMPI_COMM_WORLD_LOCAL_RANK")?.unwrap_or(rank);
    let local_world_size: usize = parse(var, "OMPI_COMM_WORLD_LOCAL_SIZE")?.unwrap_or(world_size);
    let master_addr = match var("MASTER_ADDR") {
        Some(a) => a,
        None if local_world_size == world_size => "127.0.0.1".into(),
        None => {
            return Err(Error::Env {
                name: "MASTER_ADDR",
                reason: format!(
                    "not set, and the {world_size} MPI ranks span several nodes; export MASTER_ADDR=<rank 0's host> (e.g. mpirun -x MASTER_ADDR=...)"
                ),
            });
        }
    };
    Ok(JobPlace {
        source: EnvSource::OpenMpi,
        rank,
        world_size,
        local_rank,
        local_world_size,
        master_addr,
        master_port,
    })
}

/// The first host of a Slurm node list: `gpu[01-04,07],cpu3` → `gpu01`, `a,b` → `a`.
///
/// # Errors
/// [`Error::Env`] for an empty or malformed list.
pub fn first_host(list: &str) -> Result<String> {
    let bad = |why: &str| Error::Env { name: "SLURM_JOB_NODELIST", reason: format!("`{list}`: {why}") };
    let list = list.trim();
    let head_end = list.find([',', '[']).unwrap_or(list.len());
    let prefix = &list[..head_end];
    if prefix.is_empty() {
        return Err(bad("no host name"));
    }
    if list[head_end..].starts_with('[') {
        let close = list.find(']').ok_or_else(|| bad("a `[` without its `]`"))?;
        let first = list[head_end + 1..close].split([',', '-']).next().unwrap_or("").trim();
        if first.is_empty() || !first.chars().all(|c| c.is_ascii_digit()) {
            return Err(bad("the first range does not start with a number"));
        }
        let suffix: String = list[close + 1..].chars().take_while(|&c| c != ',').collect();
        return Ok(format!("{prefix}{first}{suffix}"));
    }
    Ok(prefix.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn restart_counts_come_from_any_launcher() {
        assert_eq!(restart_count(&env(&[])), 0);
        assert_eq!(restart_count(&env(&[("BURN_DDP_RESTART_COUNT", "2"), ("TORCHELASTIC_RESTART_COUNT", "5")])), 2);
        assert_eq!(restart_count(&env(&[("TORCHELASTIC_RESTART_COUNT", "1")])), 1);
        assert_eq!(restart_count(&env(&[("SLURM_RESTART_COUNT", "3")])), 3);
        assert_eq!(restart_count(&env(&[("SLURM_RESTART_COUNT", "x")])), 0);
    }

    #[test]
    fn slurm_node_lists() {
        for (list, first) in [
            ("gpu[01-04,07]", "gpu01"),
            ("gpu07", "gpu07"),
            ("a,b,c", "a"),
            ("node[3,5-6],other[1-2]", "node3"),
            ("rack[2-3]-gpu", "rack2-gpu"),
            ("n[010-012]", "n010"),
        ] {
            assert_eq!(first_host(list).unwrap(), first, "{list}");
        }
        for bad in ["", "gpu[01-04", "gpu[]", "[1-2]x"] {
            assert!(first_host(bad).is_err(), "{bad} must be refused");
        }
    }

    #[test]
    fn torchrun_variables_come_first() {
        let e = env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h0"),
            ("MASTER_PORT", "29400"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "9"),
        ]);
        let p = detect(&e).unwrap().unwrap();
        assert_eq!(
            (p.source, p.rank, p.world_size, p.local_rank, p.local_world_size, p.master_addr.as_str(), p.master_port),
            (EnvSource::Torchrun, 3, 4, 1, 2, "h0", 29400)
        );
        let missing_port = detect(&env(&[("RANK", "0"), ("WORLD_SIZE", "1")])).unwrap_err().to_string();
        assert!(missing_port.contains("MASTER_PORT"), "{missing_port}");
    }

    #[test]
    fn under_torchruns_agent_store_our_store_takes_the_next_port() {
        let base = [("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "36039")];
        let with = |extra: (&'static str, &'static str)| {
            detect(&env(&[base[0], base[1], base[2], extra])).map(|p| p.unwrap().master_port)
        };
        assert_eq!(with(("TORCHELASTIC_USE_AGENT_STORE", "True")).unwrap(), 36040);
        assert_eq!(with(("TORCHELASTIC_USE_AGENT_STORE", "False")).unwrap(), 36039);
        assert_eq!(with(("LOCAL_RANK", "0")).unwrap(), 36039);
        let top = detect(&env(&[base[0], base[1], ("MASTER_PORT", "65535"), ("TORCHELASTIC_USE_AGENT_STORE", "True")]))
            .unwrap_err()
            .to_string();
        assert!(top.contains("--master-port"), "{top}");
    }

    #[test]
    fn srun_gives_the_world_and_the_first_node() {
        let e = env(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS_PER_NODE", "4(x2)"),
            ("SLURM_NODEID", "1"),
            ("SLURM_JOB_NODELIST", "gpu[01-02]"),
        ]);
        let p = detect(&e).unwrap().unwrap();
        assert_eq!(
            (p.source, p.rank, p.world_size, p.local_rank, p.local_world_size, p.master_addr.as_str(), p.master_port),
            (EnvSource::Slurm, 5, 8, 1, 4, "gpu01", 29500)
        );
        let without_list = detect(&env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_LOCALID", "0")]))
            .unwrap_err()
            .to_string();
        assert!(without_list.contains("MASTER_ADDR") && without_list.contains("SLURM_JOB_NODELIST"), "{without_list}");
    }

    #[test]
    fn mpirun_on_one_node_and_on_several() {
        let one = env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]);
        let p = detect(&one).unwrap().unwrap();
        assert_eq!((p.source, p.rank, p.world_size, p.master_addr.as_str()), (EnvSource::OpenMpi, 1, 2, "127.0.0.1"));
        let pmix = detect(&env(&[("PMIX_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "1")])).unwrap().unwrap();
        assert_eq!(pmix.rank, 0);
        let spread =
            env(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "4"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "2")]);
        let err = detect(&spread).unwrap_err().to_string();
        assert!(err.contains("MASTER_ADDR") && err.contains("span several nodes"), "{err}");
        assert!(detect(&env(&[])).unwrap().is_none() && !launched(&env(&[])));
        assert!(launched(&env(&[("PMIX_RANK", "0")])));
    }
}
