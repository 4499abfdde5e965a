//! The launcher (torchrun's job): start one process per local rank with the rendezvous
//! environment, prefix their output with the rank, stop everyone when one fails (exiting with
//! its code), restart the group up to `max_restarts` times, and stop every rank on Ctrl-C.

use crate::error::{Error, Result};
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
}

impl Default for LaunchConfig {
    fn default() -> Self {
        Self { nproc_per_node: 1, nnodes: 1, node_rank: 0, master_addr: "127.0.0.1".into(), master_port: 29500, max_restarts: 0, program: Vec::new(), grace: Duration::from_secs(3) }
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

fn pump(source: impl Read + Send + 'static, rank: usize, to_stderr: bool) {
    std::thread::spawn(move || {
        for line in BufReader::new(source).lines() {
            let Ok(line) = line else { break };
            if to_stderr {
                let _ = writeln!(std::io::stderr().lock(), "[rank {rank}] {line}");
            } else {
                let _ = writeln!(std::io::stdout().lock(), "[rank {rank}] {line}");
            }
        }
    });
}

fn spawn_group(config: &LaunchConfig, port: u16, attempt: usize) -> Result<Vec<(usize, Child)>> {
    let world = config.nproc_per_node * config.nnodes;
    let mut children = Vec::new();
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
        let mut child = cmd.spawn().map_err(|e| Error::io(format!("starting `{}` for rank {rank}", config.program[0]), e))?;
        pump(child.stdout.take().expect("piped"), rank, false);
        pump(child.stderr.take().expect("piped"), rank, true);
        children.push((rank, child));
    }
    Ok(children)
}

fn stop_all(children: &mut [(usize, Child)], grace: Duration) {
    for (_, c) in children.iter_mut() {
        #[cfg(unix)]
        {
            // SIGTERM first so ranks can clean up; SIGKILL after the grace period.
            let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).stderr(Stdio::null()).status();
        }
    }
    let deadline = Instant::now() + grace;
    for (_, c) in children.iter_mut() {
        while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
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

fn supervise(children: &mut [(usize, Child)], interrupted: &AtomicBool, grace: Duration) -> Outcome {
    let mut done = vec![false; children.len()];
    loop {
        if interrupted.load(Ordering::SeqCst) {
            stop_all(children, grace);
            return Outcome::Interrupted;
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
}

/// Runs the group to completion and returns the exit code the launcher should exit with: 0
/// when every rank succeeded, else the failing rank's code (130 after Ctrl-C).
///
/// # Errors
/// When the program cannot be started or the settings are inconsistent.
pub fn launch(config: &LaunchConfig, interrupted: Arc<AtomicBool>) -> Result<i32> {
    if config.program.is_empty() {
        return Err(Error::Env { name: "PROGRAM", reason: "no program given; usage: burn-ddp launch --nproc-per-node N -- PROGRAM ARGS...".into() });
    }
    if config.nproc_per_node == 0 || config.nnodes == 0 || config.node_rank >= config.nnodes {
        return Err(Error::Env { name: "--nproc-per-node/--nnodes/--node-rank", reason: format!("got {}/{}/{}", config.nproc_per_node, config.nnodes, config.node_rank) });
    }
    let port = if config.master_port == 0 { free_port()? } else { config.master_port };
    for attempt in 0..=config.max_restarts {
        let mut children = spawn_group(config, port, attempt)?;
        match supervise(&mut children, &interrupted, config.grace) {
            Outcome::Success => return Ok(0),
            Outcome::Interrupted => return Ok(130),
            Outcome::Failed { rank, code } if attempt == config.max_restarts => {
                log::error!("rank {rank} failed with exit code {code}; no restarts left");
                return Ok(code);
            }
            Outcome::Failed { rank, code } => {
                log::warn!("rank {rank} failed with exit code {code}; restarting the group ({}/{})", attempt + 1, config.max_restarts);
            }
        }
    }
    unreachable!("the loop returns on its last attempt")
}
