//! `burn-ddp doctor`: the pre-flight checklist of a multi-process job, run — the rendezvous
//! address and port, the GPUs against `--nproc-per-node`, the driver, NCCL and peer access,
//! the NCCL / rendezvous variables in effect, and a short all-reduce among local ranks with its
//! bandwidth. One line per check: pass, warn or fail, with what to do.

use crate::device;
use crate::process_group::{AllReduceOptions, ProcessGroup, buffer::Buffer};
use crate::rendezvous::{CommBackend, RendezvousConfig, init_process_group};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Fine.
    Pass,
    /// Works, but probably not as meant.
    Warn,
    /// The job will fail or hang.
    Fail,
    /// For information.
    Info,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// The outcome.
    pub status: Status,
    /// What was found, and what to do when it is not a pass.
    pub detail: String,
}

fn check(name: &'static str, status: Status, detail: impl Into<String>) -> Check {
    Check { name, status, detail: detail.into() }
}

/// The job the checks are for (the flags `burn-ddp launch` would get).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoctorConfig {
    /// Nodes in the job.
    pub nnodes: usize,
    /// This node's index.
    pub node_rank: usize,
    /// Processes (GPUs) on this node.
    pub nproc_per_node: usize,
    /// Rank 0's host.
    pub master_addr: String,
    /// Rank 0's store port.
    pub master_port: u16,
    /// Mebibytes all-reduced by the bandwidth check (0 skips it).
    pub all_reduce_mib: usize,
}

/// Runs every check, in order.
pub fn run(config: &DoctorConfig, var: &dyn Fn(&str) -> Option<String>) -> Vec<Check> {
    let mut checks = vec![master_addr(config), master_port(config)];
    checks.extend(gpus(config, var));
    checks.push(variables(var));
    checks.push(firewall(config));
    if config.all_reduce_mib > 0 {
        checks.push(tcp_all_reduce(config.nproc_per_node.max(2), config.all_reduce_mib));
    }
    checks
}

fn master_addr(config: &DoctorConfig) -> Check {
    let addrs: Vec<_> = match (config.master_addr.as_str(), config.master_port).to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => {
            return check(
                "MASTER_ADDR",
                Status::Fail,
                format!("`{}` does not resolve ({e}); give node 0's host name or IP", config.master_addr),
            );
        }
    };
    let loopback = addrs.iter().all(|a| a.ip().is_loopback());
    let shown = addrs.iter().map(|a| a.ip().to_string()).collect::<Vec<_>>().join(", ");
    if config.nnodes > 1 && loopback {
        return check(
            "MASTER_ADDR",
            Status::Fail,
            format!(
                "`{}` is loopback ({shown}) but --nnodes is {}: every node would wait for itself; give node 0's address on the network",
                config.master_addr, config.nnodes
            ),
        );
    }
    check("MASTER_ADDR", Status::Pass, format!("{} resolves to {shown}", config.master_addr))
}

fn master_port(config: &DoctorConfig) -> Check {
    let port = config.master_port;
    if config.node_rank == 0 {
        return match TcpListener::bind(("0.0.0.0", port)) {
            Ok(_) => {
                check("MASTER_PORT", Status::Pass, format!("{port} is free on this node (node 0 runs the store there)"))
            }
            Err(e) => check(
                "MASTER_PORT",
                Status::Fail,
                format!(
                    "{port} cannot be bound here ({e}): another job or a leftover rank holds it; stop it or choose another --master-port"
                ),
            ),
        };
    }
    let addr = (config.master_addr.as_str(), port).to_socket_addrs().ok().and_then(|mut a| a.next());
    match addr.map(|a| TcpStream::connect_timeout(&a, Duration::from_secs(3))) {
        Some(Ok(_)) => check("MASTER_PORT", Status::Pass, format!("{}:{port} accepts connections", config.master_addr)),
        Some(Err(e)) => check(
            "MASTER_PORT",
            Status::Warn,
            format!(
                "{}:{port} does not answer ({e}): start node 0 first; if it runs, a firewall blocks the port",
                config.master_addr
            ),
        ),
        None => check("MASTER_PORT", Status::Fail, format!("{} does not resolve", config.master_addr)),
    }
}

/// GPUs, driver, NCCL and peer access.
fn gpus(config: &DoctorConfig, var: &dyn Fn(&str) -> Option<String>) -> Vec<Check> {
    let visible = var("CUDA_VISIBLE_DEVICES").map_or(String::new(), |v| format!(" (CUDA_VISIBLE_DEVICES={v})"));
    let count = match device::cuda_device_count() {
        Ok(n) => n,
        Err(crate::Error::CudaNotCompiled) => {
            return vec![check(
                "GPUs",
                Status::Info,
                "this build has no CUDA (`--features cuda`): CPU ranks over TCP only",
            )];
        }
        Err(e) => return vec![check("GPUs", Status::Warn, format!("{e}: ranks will train on CPUs"))],
    };
    let names: Vec<String> = (0..count).map(|i| device::gpu_name(i).unwrap_or_else(|e| e.to_string())).collect();
    let mut out = vec![if count < config.nproc_per_node {
        check(
            "GPUs",
            Status::Fail,
            format!(
                "--nproc-per-node {} but {count} GPU(s) visible{visible}: local ranks ≥ {count} would fail with `invalid device ordinal`; lower --nproc-per-node",
                config.nproc_per_node
            ),
        )
    } else {
        check("GPUs", Status::Pass, format!("{count} visible{visible}: {}", names.join(", ")))
    }];
    out.push(match device::driver_version() {
        Ok(v) if v < device::CUDA_BINDING_VERSION => check(
            "CUDA driver",
            Status::Warn,
            format!(
                "{} < the bindings' {}: update the driver if a CUDA call fails",
                cuda(v),
                cuda(device::CUDA_BINDING_VERSION)
            ),
        ),
        Ok(v) => {
            check("CUDA driver", Status::Pass, format!("{} (bindings {})", cuda(v), cuda(device::CUDA_BINDING_VERSION)))
        }
        Err(e) => check("CUDA driver", Status::Fail, e.to_string()),
    });
    out.push(match device::nccl_version() {
        Ok(v) => check("NCCL", Status::Pass, format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)),
        Err(e) => check("NCCL", Status::Fail, format!("{e} (or train with BURN_VISION_COLLECTIVES=tcp)")),
    });
    out.push(peer_access(count.min(config.nproc_per_node)));
    out
}

fn cuda(v: i32) -> String {
    format!("CUDA {}.{}", v / 1000, v % 1000 / 10)
}

fn peer_access(n: usize) -> Check {
    if n < 2 {
        return check("P2P", Status::Info, "fewer than two local GPUs: nothing to check");
    }
    let pairs: Vec<(usize, usize)> =
        (0..n).flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b))).collect();
    let missing: Vec<String> = pairs
        .iter()
        .filter(|&&(a, b)| !device::can_access_peer(a, b).unwrap_or(false))
        .map(|(a, b)| format!("{a}→{b}"))
        .collect();
    if missing.is_empty() {
        check("P2P", Status::Pass, format!("every pair of GPUs 0..{} can access each other directly", n - 1))
    } else {
        check(
            "P2P",
            Status::Warn,
            format!(
                "no direct access {}: NCCL goes through host memory there (slower); check the topology with `nvidia-smi topo -m`",
                missing.join(", ")
            ),
        )
    }
}

/// The variables that steer NCCL and the rendezvous, as set now.
fn variables(var: &dyn Fn(&str) -> Option<String>) -> Check {
    const NAMES: [&str; 13] = [
        "NCCL_DEBUG",
        "NCCL_SOCKET_IFNAME",
        "NCCL_IB_DISABLE",
        "NCCL_P2P_DISABLE",
        "NCCL_SHM_DISABLE",
        "NCCL_NVLS_ENABLE",
        "NCCL_ASYNC_ERROR_HANDLING",
        "MASTER_ADDR",
        "MASTER_PORT",
        "BURN_DDP_TIMEOUT_S",
        "BURN_DDP_TOKEN",
        "CUDA_VISIBLE_DEVICES",
        crate::device::CUDA_QUEUES_VAR,
    ];
    let set: Vec<String> = NAMES
        .iter()
        .filter_map(|n| var(n).map(|v| if *n == "BURN_DDP_TOKEN" { format!("{n}=(set)") } else { format!("{n}={v}") }))
        .collect();
    let mut warnings: Vec<String> = Vec::new();
    if var("NCCL_P2P_DISABLE").is_some_and(|v| v == "1") {
        warnings.push("NCCL_P2P_DISABLE=1 sends GPU-to-GPU traffic through host memory (several times slower): unset it unless a hang needs it".into());
    }
    if var("NCCL_IB_DISABLE").is_some_and(|v| v == "1") {
        warnings.push("NCCL_IB_DISABLE=1: nodes talk over TCP sockets, not InfiniBand".into());
    }
    let queues = var(crate::device::CUDA_QUEUES_VAR).as_deref().and_then(crate::device::parse_queues);
    if queues.is_some_and(|n| n < crate::device::ALL_CUDA_QUEUES) {
        let all = crate::device::ALL_CUDA_QUEUES;
        warnings.push(format!("fewer than {all} CUDA hardware queues: work of other streams (the GPU's JPEG decode, NCCL) may wait behind the training's; unset {} (the launcher then sets {all}) unless your program needs the order", crate::device::CUDA_QUEUES_VAR));
    }
    let shown = if set.is_empty() { "none set (defaults: time-out 300 s)".to_string() } else { set.join(" ") };
    match warnings.is_empty() {
        true => check("variables", Status::Info, shown),
        false => check("variables", Status::Warn, format!("{shown}; {}", warnings.join("; "))),
    }
}

/// `ranks` threads of this process form a TCP group on loopback and all-reduce `mib` MiB of
/// f32 (checked against the expected sum): the ring's bus bandwidth.
pub fn tcp_all_reduce(ranks: usize, mib: usize) -> Check {
    let port = match crate::launch::free_port() {
        Ok(p) => p,
        Err(e) => return check("all-reduce", Status::Fail, e.to_string()),
    };
    let n = mib * (1 << 20) / 4;
    let results: Vec<crate::Result<(f64, bool)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks).map(|rank| s.spawn(move || one_rank(rank, ranks, port, n))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(crate::Error::Env { name: "all-reduce", reason: "a rank panicked".into() }))
            })
            .collect()
    });
    let mut worst = 0.0f64;
    for r in results {
        match r {
            Ok((_, false)) => {
                return check("all-reduce", Status::Fail, "wrong sum: the TCP ring is broken; report this");
            }
            Ok((secs, true)) => worst = worst.max(secs),
            Err(e) => {
                return check("all-reduce", Status::Fail, format!("{e}: local ranks cannot talk over loopback TCP"));
            }
        }
    }
    // Bus bandwidth, as nccl-tests report it: 2 (n − 1) / n of the buffer crosses each link.
    let bus = 2.0 * (ranks - 1) as f64 / ranks as f64 * (n * 4) as f64 / worst / 1e9;
    check(
        "all-reduce",
        Status::Pass,
        format!(
            "TCP ring of {ranks} local ranks, {mib} MiB f32: {:.1} ms, bus bandwidth {bus:.2} GB/s, sum correct",
            worst * 1e3
        ),
    )
}

fn one_rank(rank: usize, world: usize, port: u16, n: usize) -> crate::Result<(f64, bool)> {
    let config = RendezvousConfig {
        master_addr: "127.0.0.1".into(),
        master_port: port,
        rank,
        world_size: world,
        local_rank: rank,
        local_world_size: world,
        timeout: Duration::from_secs(60),
        token: None,
        source: crate::launch_env::EnvSource::Torchrun,
    };
    let group = init_process_group(CommBackend::Tcp, &config)?;
    let mut values = vec![(rank + 1) as f32; n];
    let started = Instant::now();
    group.all_reduce(Buffer::f32(&mut values), &AllReduceOptions::default())?;
    let secs = started.elapsed().as_secs_f64();
    let expected = (world * (world + 1) / 2) as f32;
    Ok((secs, values.iter().all(|&v| v == expected)))
}

/// The report as a table, one line per check.
pub fn table(checks: &[Check]) -> String {
    let mut out = String::new();
    for c in checks {
        let mark = match c.status {
            Status::Pass => "pass",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
            Status::Info => "info",
        };
        out.push_str(&format!("{mark:<5} {:<12} {}\n", c.name, c.detail));
    }
    out
}

/// The ports node 0 must accept: the ranks' store on `--master-port`, and with several nodes
/// the launchers' store on the port after it (under torchrun, torchrun's store and ours).
fn firewall(config: &DoctorConfig) -> Check {
    let port = config.master_port;
    let stores = match (config.nnodes, port.checked_add(1)) {
        (1, _) => format!("TCP {port} (the store)"),
        (_, Some(next)) => format!(
            "TCP {port} (the ranks' store) and {next} (the launchers' store; under torchrun, torchrun's store and ours)"
        ),
        (_, None) => format!(
            "TCP {port} (the store); --master-port 65535 leaves no port for the launchers' store: pick a lower one"
        ),
    };
    check(
        "firewall",
        Status::Info,
        format!("open {stores} on node 0, and the ephemeral ports between all nodes (TCP ring, NCCL's sockets)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_firewall_line_names_every_port_the_launchers_use() {
        let one = firewall(&DoctorConfig { master_port: 29500, ..config() });
        assert!(one.detail.contains("TCP 29500 ") && !one.detail.contains("29501"), "{one:?}");
        let two = firewall(&DoctorConfig { nnodes: 2, master_port: 29500, ..config() });
        assert!(two.detail.contains("29500") && two.detail.contains("29501"), "{two:?}");
    }

    fn config() -> DoctorConfig {
        DoctorConfig {
            nnodes: 1,
            node_rank: 0,
            nproc_per_node: 2,
            master_addr: "127.0.0.1".into(),
            master_port: 0,
            all_reduce_mib: 1,
        }
    }

    #[test]
    fn loopback_is_refused_for_several_nodes() {
        assert_eq!(master_addr(&config()).status, Status::Pass);
        let multi = DoctorConfig { nnodes: 2, ..config() };
        let c = master_addr(&multi);
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("loopback"), "{c:?}");
        assert_eq!(
            master_addr(&DoctorConfig { master_addr: "no-such-host.invalid".into(), ..config() }).status,
            Status::Fail
        );
    }

    #[test]
    fn a_busy_port_fails_and_a_free_one_passes() {
        let held = TcpListener::bind("0.0.0.0:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let busy = master_port(&DoctorConfig { master_port: port, ..config() });
        assert_eq!(busy.status, Status::Fail, "{busy:?}");
        drop(held);
        assert_eq!(master_port(&DoctorConfig { master_port: port, ..config() }).status, Status::Pass);
        // Another node asks whether node 0 listens.
        let listening = TcpListener::bind("127.0.0.1:0").unwrap();
        let other =
            DoctorConfig { node_rank: 1, nnodes: 2, master_port: listening.local_addr().unwrap().port(), ..config() };
        assert_eq!(master_port(&other).status, Status::Pass);
    }

    #[test]
    fn risky_nccl_variables_warn() {
        let env = |k: &str| match k {
            "NCCL_P2P_DISABLE" => Some("1".to_string()),
            "BURN_DDP_TOKEN" => Some("secret".to_string()),
            _ => None,
        };
        let c = variables(&env);
        assert_eq!(c.status, Status::Warn);
        assert!(c.detail.contains("NCCL_P2P_DISABLE=1") && !c.detail.contains("secret"), "{c:?}");
        assert_eq!(variables(&|_| None).status, Status::Info);
        let one_queue = |k: &str| (k == "CUDA_DEVICE_MAX_CONNECTIONS").then(|| "1".to_string());
        let c = variables(&one_queue);
        assert_eq!(c.status, Status::Warn);
        assert!(c.detail.contains("CUDA_DEVICE_MAX_CONNECTIONS=1") && c.detail.contains("32"), "{c:?}");
        let all = |k: &str| (k == "CUDA_DEVICE_MAX_CONNECTIONS").then(|| "32".to_string());
        assert_eq!(variables(&all).status, Status::Info);
    }

    #[test]
    fn the_all_reduce_check_sums_correctly_over_three_ranks() {
        let c = tcp_all_reduce(3, 1);
        assert_eq!(c.status, Status::Pass, "{c:?}");
        assert!(c.detail.contains("GB/s"), "{c:?}");
    }
}
