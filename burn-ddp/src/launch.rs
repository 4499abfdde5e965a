//! The launcher (torchrun's job): start one process per local rank with the rendezvous
//! environment, prefix their output with the rank, stop everyone when one fails (exiting with
//! its code), restart the group up to `max_restarts` times, and stop every rank on Ctrl-C. With
//! several nodes, the launchers agree through [`crate::launch_agent`]: a failure anywhere ends
//! the round everywhere, and the next round starts on every node together.

use crate::error::{Error, Result};
use crate::launch_agent::NodeLink;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How to start the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Processes on this node.
    pub nproc_per_node: usize,
    /// Nodes in the job.
    pub nnodes: usize,
    /// This node's index.
    pub node_rank: usize,
    /// Rank 0's host.
    pub master_addr: String,
    /// Rank 0's store port; 0 picks a free one (single node only).
    pub master_port: u16,
    /// Whole-group restarts after a failure.
    pub max_restarts: usize,
    /// The program and its arguments.
    pub program: Vec<String>,
    /// How long ranks get to exit after the others are told to stop.
    pub grace: Duration,
    /// Time-out of the ranks' rendezvous and collectives (`BURN_DDP_TIMEOUT_S` for them);
    /// `None` leaves the environment's value or the default (300 s).
    pub timeout: Option<Duration>,
}

impl Default for LaunchConfig {
    fn default() -> Self {
        Self {
            nproc_per_node: 1,
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            max_restarts: 0,
            program: Vec::new(),
            grace: Duration::from_secs(3),
            timeout: None,
        }
    }
}

/// A free TCP port on the loopback interface (for `--standalone`).
///
/// # Errors
/// When no socket can be bound.
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("finding a free port", e))?;
    Ok(l.local_addr().map_err(|e| Error::io("finding a free port", e))?.port())
}

/// A port P with P and P + 1 both free, for several `--nnodes` launchers on one machine
/// (`--master-port P`; node 0's launcher store takes P + 1). It is drawn below the system's
/// range of ephemeral ports, so the ports the system hands out meanwhile (to [`free_port`], to
/// any outgoing connection) cannot take P + 1 before the launchers bind it.
///
/// # Errors
/// When no such pair is found in 200 tries.
pub fn free_port_pair() -> Result<u16> {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse::<u16>().ok()))
        .unwrap_or(32768);
    let (low, high) = (10_000u16, ephemeral_low.max(10_100) - 2);
    let mut x = std::process::id() as u64
        ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    for _ in 0..200 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let port = low + ((x >> 33) % u64::from(high - low)) as u16;
        let free = |p: u16| std::net::TcpListener::bind(("0.0.0.0", p)).is_ok();
        if free(port) && free(port + 1) {
            return Ok(port);
        }
    }
    Err(Error::io("finding two adjacent free ports", std::io::Error::other("200 candidates were taken")))
}

/// How long the launcher waits for the last output of exited ranks before it returns.
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

fn pump(source: impl Read + Send + 'static, rank: usize, to_stderr: bool) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(source).lines() {
            let Ok(line) = line else { break };
            if to_stderr {
                let _ = writeln!(std::io::stderr().lock(), "[rank {rank}] {line}");
            } else {
                let _ = writeln!(std::io::stdout().lock(), "[rank {rank}] {line}");
            }
        }
    })
}

/// Waits (boundedly: a grandchild may still hold a pipe open) until the output threads have
/// printed everything the ranks wrote.
fn drain(pumps: Vec<std::thread::JoinHandle<()>>) {
    let deadline = Instant::now() + OUTPUT_DRAIN;
    while Instant::now() < deadline && !pumps.iter().all(|p| p.is_finished()) {
        std::thread::sleep(Duration::from_millis(5));
    }
    for p in pumps.into_iter().filter(|p| p.is_finished()) {
        let _ = p.join();
    }
}

type Ranks = (Vec<(usize, Child)>, Vec<std::thread::JoinHandle<()>>);

fn spawn_group(config: &LaunchConfig, port: u16, attempt: usize) -> Result<Ranks> {
    let world = config.nproc_per_node * config.nnodes;
    let mut children = Vec::new();
    let mut pumps = Vec::new();
    for local in 0..config.nproc_per_node {
        let rank = config.node_rank * config.nproc_per_node + local;
        let mut cmd = Command::new(&config.program[0]);
        cmd.args(&config.program[1..])
            .env("MASTER_ADDR", &config.master_addr)
            .env("MASTER_PORT", port.to_string())
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("LOCAL_WORLD_SIZE", config.nproc_per_node.to_string())
            .env("GROUP_RANK", config.node_rank.to_string())
            .env("TORCHELASTIC_RESTART_COUNT", attempt.to_string())
            .env("BURN_DDP_RESTART_COUNT", attempt.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(t) = config.timeout {
            cmd.env("BURN_DDP_TIMEOUT_S", t.as_secs_f64().to_string());
        }
        #[cfg(unix)]
        {
            // Each rank leads its own process group, so stopping it stops what it started too.
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        die_with_launcher(&mut cmd);
        let mut child =
            cmd.spawn().map_err(|e| Error::io(format!("starting `{}` for rank {rank}", config.program[0]), e))?;
        pumps.push(pump(child.stdout.take().expect("piped"), rank, false));
        pumps.push(pump(child.stderr.take().expect("piped"), rank, true));
        children.push((rank, child));
    }
    Ok((children, pumps))
}

/// On Linux the rank gets SIGTERM when the launcher dies, however it dies (`kill -9`
/// included): no rank trains on as an orphan whose output nobody reads. The signal follows the
/// thread that started the rank, which is the one that supervises it to its end.
#[cfg(target_os = "linux")]
fn die_with_launcher(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let launcher = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec this calls only prctl and getppid, which are
    // async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher may have died before the request took effect.
            if libc::getppid() != launcher {
                return Err(std::io::Error::other("the launcher exited while starting the rank"));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_launcher(_: &mut Command) {}

/// Sends `signal` to the process group each rank leads.
fn signal_groups(children: &[(usize, Child)], signal: &str) {
    #[cfg(unix)]
    for (_, c) in children {
        let _ = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg("--")
            .arg(format!("-{}", c.id()))
            .stderr(Stdio::null())
            .status();
    }
}

fn stop_all(children: &mut [(usize, Child)], grace: Duration) {
    // SIGTERM first so ranks can clean up; SIGKILL after the grace period.
    signal_groups(children, "TERM");
    let deadline = Instant::now() + grace;
    for (_, c) in children.iter_mut() {
        while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    signal_groups(children, "KILL");
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// What ended one attempt.
enum Outcome {
    Success,
    Failed { rank: usize, code: i32 },
    Interrupted,
}

/// Another node's failure in this round, checked every few polls.
fn remote_failure(link: Option<(&NodeLink, usize)>, poll: usize) -> Option<(usize, i32, usize)> {
    link.filter(|_| poll.is_multiple_of(5)).and_then(|(l, round)| l.failure(round))
}

fn supervise(
    children: &mut [(usize, Child)],
    interrupted: &AtomicBool,
    grace: Duration,
    link: Option<(&NodeLink, usize)>,
) -> Outcome {
    let mut done = vec![false; children.len()];
    for poll in 0.. {
        if interrupted.load(Ordering::SeqCst) {
            stop_all(children, grace);
            return Outcome::Interrupted;
        }
        if let Some((rank, code, node)) = remote_failure(link, poll) {
            log::error!("rank {rank} on node {node} exited with code {code}; stopping this node's ranks");
            stop_all(children, grace);
            return Outcome::Failed { rank, code };
        }
        for (i, (rank, c)) in children.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            if let Ok(Some(status)) = c.try_wait() {
                done[i] = true;
                if !status.success() {
                    let code = status.code().unwrap_or(128 + 9);
                    let rank = *rank;
                    log::error!("rank {rank} exited with {status}; stopping the other ranks");
                    if let Some((l, round)) = link {
                        l.report_failure(round, rank, code);
                    }
                    stop_all(children, grace);
                    return Outcome::Failed { rank, code };
                }
            }
        }
        if done.iter().all(|d| *d) {
            return Outcome::Success;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    unreachable!("polls until an outcome")
}

/// How long the launchers wait for each other: `--timeout-s`, else `BURN_DDP_TIMEOUT_S` (the
/// ranks' time-out), else 300 s.
fn agent_timeout(config: &LaunchConfig) -> Duration {
    let env = std::env::var("BURN_DDP_TIMEOUT_S")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| *s > 0.0 && s.is_finite());
    config.timeout.unwrap_or_else(|| Duration::from_secs_f64(env.unwrap_or(300.0)))
}

/// Runs the group to completion and returns the exit code the launcher should exit with: 0
/// when every rank succeeded, else the failing rank's code (130 after Ctrl-C).
///
/// # Errors
/// When the program cannot be started or the settings are inconsistent.
pub fn launch(config: &LaunchConfig, interrupted: Arc<AtomicBool>) -> Result<i32> {
    if config.program.is_empty() {
        return Err(Error::Env {
            name: "PROGRAM",
            reason: "no program given; usage: burn-ddp launch --nproc-per-node N -- PROGRAM ARGS...".into(),
        });
    }
    if config.nproc_per_node == 0 || config.nnodes == 0 || config.node_rank >= config.nnodes {
        return Err(Error::Env {
            name: "--nproc-per-node/--nnodes/--node-rank",
            reason: format!("got {}/{}/{}", config.nproc_per_node, config.nnodes, config.node_rank),
        });
    }
    let port = if config.master_port == 0 { free_port()? } else { config.master_port };
    let link = match config.nnodes {
        1 => None,
        n => Some(NodeLink::join(&config.master_addr, port, (n, config.node_rank), agent_timeout(config))?),
    };
    for attempt in 0..=config.max_restarts {
        if let Some(l) = &link {
            l.start_round(attempt)?;
        }
        let (mut children, pumps) = spawn_group(config, port, attempt)?;
        let outcome = supervise(&mut children, &interrupted, config.grace, link.as_ref().map(|l| (l, attempt)));
        drain(pumps);
        match outcome {
            Outcome::Success => {
                if let Some(l) = &link {
                    l.finish(attempt);
                }
                return Ok(0);
            }
            Outcome::Interrupted => return Ok(130),
            Outcome::Failed { rank, code } if attempt == config.max_restarts => {
                log::error!("rank {rank} failed with exit code {code}; no restarts left");
                return Ok(code);
            }
            Outcome::Failed { rank, code } => {
                log::warn!(
                    "rank {rank} failed with exit code {code}; restarting the group ({}/{})",
                    attempt + 1,
                    config.max_restarts
                );
            }
        }
    }
    unreachable!("the loop returns on its last attempt")
}
