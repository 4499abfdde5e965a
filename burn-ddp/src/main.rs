//! `burn-ddp launch`: a torchrun-style launcher for any program; `burn-ddp doctor`: its pre-flight checks.

use burn_ddp::launch::{LaunchConfig, launch};
use clap::{Args, Parser, Subcommand};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[derive(Parser)]
#[command(name = "burn-ddp", version, about = "Launch multi-process (multi-GPU) training jobs, and check their set-up")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start PROGRAM once per local rank with MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
    /// LOCAL_RANK and LOCAL_WORLD_SIZE set (LOCAL_RANK is the GPU to use).
    Launch(LaunchArgs),
    /// Check a job's set-up before launching it: MASTER_ADDR and the port, GPUs against
    /// --nproc-per-node, the CUDA driver, NCCL, peer access, the NCCL variables, and a short
    /// all-reduce among local ranks. One line per check; exits 1 when one fails.
    Doctor(DoctorArgs),
}

#[derive(Args)]
struct LaunchArgs {
    /// Processes on this node (one per GPU).
    #[arg(long, default_value_t = 1)]
    nproc_per_node: usize,
    /// Nodes in the job.
    #[arg(long, default_value_t = 1)]
    nnodes: usize,
    /// This node's index in 0..nnodes.
    #[arg(long, default_value_t = 0)]
    node_rank: usize,
    /// Host of rank 0 (the rendezvous store), reachable from every node; 127.0.0.1 on one
    /// node. Required with --nnodes > 1.
    #[arg(long)]
    master_addr: Option<String>,
    /// Port of the rendezvous store (with --nnodes > 1 node 0's launcher also listens on the
    /// next port, where the launchers agree on failures and restarts).
    #[arg(long, default_value_t = 29500)]
    master_port: u16,
    /// Single node on a free loopback port (overrides --master-addr/--master-port).
    #[arg(long)]
    standalone: bool,
    /// Restart the whole group this many times after a rank fails.
    #[arg(long, default_value_t = 0)]
    max_restarts: usize,
    /// Seconds ranks get to exit after being told to stop.
    #[arg(long, default_value_t = 3.0)]
    grace_s: f64,
    /// Time-out of every rank's rendezvous and collectives, in seconds: a dead or stuck
    /// rank is reported after this long (sets BURN_DDP_TIMEOUT_S; default 300).
    #[arg(long)]
    timeout_s: Option<f64>,
    /// The program and its arguments (after `--`).
    #[arg(trailing_var_arg = true, required = true)]
    program: Vec<String>,
}

#[derive(Args)]
struct DoctorArgs {
    /// Nodes in the job.
    #[arg(long, default_value_t = 1)]
    nnodes: usize,
    /// This node's index in 0..nnodes.
    #[arg(long, default_value_t = 0)]
    node_rank: usize,
    /// Processes (GPUs) on this node.
    #[arg(long, default_value_t = 1)]
    nproc_per_node: usize,
    /// Host of rank 0 (default: MASTER_ADDR, else 127.0.0.1).
    #[arg(long)]
    master_addr: Option<String>,
    /// Port of the rendezvous store (default: MASTER_PORT, else 29500).
    #[arg(long)]
    master_port: Option<u16>,
    /// MiB all-reduced by the bandwidth check (0 skips it).
    #[arg(long, default_value_t = 64)]
    all_reduce_mib: usize,
}

fn main() {
    // SAFETY: the first statement of `main`: no other thread exists yet. The launched
    // programs inherit the setting.
    unsafe { burn_ddp::device::use_all_cuda_queues() };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp(None)
        .format_target(false)
        .init();
    match Cli::parse().command {
        Cmd::Launch(a) => cmd_launch(a),
        Cmd::Doctor(a) => cmd_doctor(a),
    }
}

fn cmd_doctor(a: DoctorArgs) {
    let var = |k: &str| std::env::var(k).ok();
    let master_addr = a.master_addr.or_else(|| var("MASTER_ADDR")).unwrap_or_else(|| "127.0.0.1".into());
    let master_port = a.master_port.or_else(|| var("MASTER_PORT").and_then(|p| p.parse().ok())).unwrap_or(29500);
    let config = burn_ddp::doctor::DoctorConfig {
        nnodes: a.nnodes,
        node_rank: a.node_rank,
        nproc_per_node: a.nproc_per_node,
        master_addr,
        master_port,
        all_reduce_mib: a.all_reduce_mib,
    };
    let checks = burn_ddp::doctor::run(&config, &var);
    print!("{}", burn_ddp::doctor::table(&checks));
    std::process::exit(i32::from(checks.iter().any(|c| c.status == burn_ddp::doctor::Status::Fail)));
}

fn cmd_launch(a: LaunchArgs) {
    let LaunchArgs {
        nproc_per_node,
        nnodes,
        node_rank,
        master_addr,
        master_port,
        standalone,
        max_restarts,
        grace_s,
        timeout_s,
        program,
    } = a;
    if let Some(t) = timeout_s.filter(|t| !(*t > 0.0 && t.is_finite())) {
        eprintln!("error: --timeout-s {t}: give a positive number of seconds");
        std::process::exit(2);
    }
    if let Some(problem) = node_problem(nnodes, node_rank, master_addr.as_deref(), standalone) {
        eprintln!("error: {problem}");
        std::process::exit(2);
    }
    let config = LaunchConfig {
        nproc_per_node,
        nnodes,
        node_rank,
        master_addr: if standalone { "127.0.0.1".into() } else { master_addr.unwrap_or_else(|| "127.0.0.1".into()) },
        master_port: if standalone { 0 } else { master_port },
        max_restarts,
        program,
        grace: Duration::from_secs_f64(grace_s),
        timeout: timeout_s.map(Duration::from_secs_f64),
    };
    let interrupted = Arc::new(AtomicBool::new(false));
    let flag = interrupted.clone();
    if let Err(e) = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst)) {
        log::warn!("cannot catch Ctrl-C: {e}");
    }
    match launch(&config, interrupted) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}

/// What is wrong with a multi-node launch before anything starts (the other nodes would wait
/// out the rendezvous time-out otherwise).
fn node_problem(nnodes: usize, node_rank: usize, master_addr: Option<&str>, standalone: bool) -> Option<String> {
    if nnodes == 0 {
        return Some("--nnodes must be at least 1".into());
    }
    if node_rank >= nnodes {
        return Some(format!(
            "--node-rank {node_rank} is outside --nnodes {nnodes}: number the nodes 0..{}",
            nnodes - 1
        ));
    }
    if nnodes > 1 && standalone {
        return Some(
            "--standalone is for one node; with --nnodes > 1 give every node the same --master-addr and --master-port"
                .into(),
        );
    }
    if nnodes > 1 && master_addr.is_none() {
        return Some(format!(
            "--nnodes {nnodes} needs --master-addr: the host of node 0, reachable from every node (127.0.0.1 would make each node wait for itself)"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::node_problem;

    #[test]
    fn multi_node_launches_are_checked_before_starting() {
        assert!(node_problem(1, 0, None, true).is_none());
        assert!(node_problem(2, 1, Some("10.0.0.1"), false).is_none());
        assert!(node_problem(2, 2, Some("h"), false).unwrap().contains("--node-rank 2 is outside --nnodes 2"));
        assert!(node_problem(2, 0, None, false).unwrap().contains("needs --master-addr"));
        assert!(node_problem(2, 0, Some("h"), true).unwrap().contains("--standalone is for one node"));
    }
}
