//! burn-ddp's GPU check suite: every GPU layer of `burn_ddp::nn` (cuDNN convolutions, batch
//! norms, attention and layer norm, cuBLAS products, our kernels, FusedSgd), NCCL and DDP on the
//! device, and SyncBatchNorm, each against an f64 or CPU reference on a real GPU.
//!
//! `burn-ddp-gpu-checks` runs them all; `burn-ddp-gpu-checks attention sgd` runs those two;
//! `--skip nccl` leaves one out (NCCL needs libnccl); `--list` names them. Each check prints
//! its `RESULT` lines, then one line `ok NAME` or `FAIL NAME`; the run ends with `N passed, N
//! failed` and exits 1 when any failed. `--bench KIND` times instead of checking.
//!
//! Build on any machine (`cargo build --release -p burn-ddp-gpu-checks`); it needs CUDA only to
//! run, on GPU 0.

mod bench;
mod checks;
mod registry;
mod util;

use burn::tensor::FloatDType;
use burn_cuda::CudaDevice;
use burn_ddp::nn::Layout;
use burn_ddp::nn::cuda::cudnn::convolution as cudnn;
use clap::{Parser, ValueEnum};
use registry::{CHECKS, Check};
use std::time::Instant;

#[derive(Parser)]
#[command(name = "burn-ddp-gpu-checks", about = "burn-ddp's GPU layers against f64 and CPU references, on GPU 0")]
struct Cli {
    /// Checks to run (all when none is named; `--list` names them).
    checks: Vec<String>,
    /// Leave these checks out, e.g. `--skip nccl` where libnccl is missing.
    #[arg(long, value_name = "NAME")]
    skip: Vec<String>,
    /// Name every check and what it compares, and run nothing.
    #[arg(long)]
    list: bool,
    /// Time instead of checking.
    #[arg(long, value_enum)]
    bench: Option<BenchKind>,
    /// Batch of `--bench convolution` and `batch-norm`.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// Timed iterations of a benchmark.
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// Activation type of `--bench convolution` and `batch-norm`.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: DType,
    /// `--bench convolution`: channels-last activations.
    #[arg(long)]
    nhwc: bool,
    /// `--bench convolution`: queue the iterations and wait once (otherwise wait after each).
    #[arg(long)]
    pipelined: bool,
    /// `--bench convolution`: the strided shapes only.
    #[arg(long)]
    strided: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum BenchKind {
    /// Every distinct ResNet-50 convolution shape, forward and forward + backward.
    Convolution,
    /// burn-ddp's batch norm, NCHW and NHWC.
    BatchNorm,
    /// cuBLAS products against burn's own kernels.
    Products,
    /// cuDNN's fused attention against the unfused path at ViT-B/16's shape.
    Attention,
    /// DDP's host time per step over a one-rank NCCL group.
    Ddp,
    /// nvJPEG's calls with the GPU idle and with burn's stream busy.
    DecodeWait,
}

#[derive(Clone, Copy, ValueEnum)]
enum DType {
    F32,
    Bf16,
    F16,
}

impl From<DType> for FloatDType {
    fn from(d: DType) -> Self {
        match d {
            DType::F32 => FloatDType::F32,
            DType::Bf16 => FloatDType::BF16,
            DType::F16 => FloatDType::F16,
        }
    }
}

fn main() {
    // SAFETY: the first statement of `main`: no other thread exists yet. As burn-vision runs.
    unsafe { burn_ddp::device::use_all_cuda_queues() };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    if cli.list {
        for c in CHECKS {
            println!("{:<24} {}", c.name, c.what);
        }
        return;
    }
    let selected = match select(&cli.checks, &cli.skip) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    // As burn-vision runs: kernel caches, cuDNN's plans on disk, exact-size allocations.
    let _ =
        burn_ddp::nn::runtime::kernel_cache::configure_with(burn_ddp::nn::runtime::kernel_cache::Allocator::ExactSizes);
    let device = CudaDevice::new(0);
    println!("RESULT cudnn_version={:?} available={}", cudnn::version(), cudnn::available());
    if let Some(kind) = cli.bench {
        run_bench(kind, &cli, &device);
        return;
    }
    let failed = run_checks(&selected, &device);
    std::process::exit(i32::from(failed > 0));
}

/// The checks named (all when none), less the skipped ones, in the registry's order.
fn select(names: &[String], skip: &[String]) -> Result<Vec<&'static Check>, String> {
    for name in names.iter().chain(skip) {
        if !CHECKS.iter().any(|c| c.name == name) {
            let all: Vec<&str> = CHECKS.iter().map(|c| c.name).collect();
            return Err(format!("no check named `{name}`; the checks: {}", all.join(", ")));
        }
    }
    let wanted =
        |c: &&Check| (names.is_empty() || names.iter().any(|n| n == c.name)) && !skip.iter().any(|n| n == c.name);
    Ok(CHECKS.iter().filter(wanted).collect())
}

/// Runs each check (a panic is a failure with its message), prints a line per check and the
/// totals; returns the number that failed.
fn run_checks(selected: &[&Check], device: &CudaDevice) -> usize {
    let mut failed = Vec::new();
    for check in selected {
        let start = Instant::now();
        let ok = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (check.run)(device))) {
            Ok(ok) => ok,
            Err(panic) => {
                let text = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
                println!("RESULT check={} panicked: {}", check.name, text.unwrap_or_default());
                false
            }
        };
        println!("{} {} ({:.1} s)", if ok { "ok" } else { "FAIL" }, check.name, start.elapsed().as_secs_f64());
        if !ok {
            failed.push(check.name);
        }
    }
    println!("{} passed, {} failed{}", selected.len() - failed.len(), failed.len(), listed(&failed));
    failed.len()
}

fn listed(names: &[&str]) -> String {
    if names.is_empty() { String::new() } else { format!(": {}", names.join(", ")) }
}

fn run_bench(kind: BenchKind, cli: &Cli, device: &CudaDevice) {
    let dtype = FloatDType::from(cli.dtype);
    match kind {
        BenchKind::Convolution => {
            let mode =
                if cli.pipelined { bench::convolution::Mode::Pipelined } else { bench::convolution::Mode::Latency };
            let layout = if cli.nhwc { Layout::Nhwc } else { Layout::Nchw };
            bench::convolution::bench(device, cli.batch, cli.iters, cli.strided, dtype, mode, layout);
        }
        BenchKind::BatchNorm => {
            for layout in [Layout::Nchw, Layout::Nhwc] {
                bench::batch_norm::bench_bn(device, cli.batch, cli.iters, dtype, layout);
            }
        }
        BenchKind::Products => bench::products::bench_gemm(device, cli.iters),
        BenchKind::Attention => bench::attention::bench_sdpa(device, cli.iters),
        BenchKind::Ddp => bench::ddp::bench_nccl_ddp(device, checks::nccl::nccl_group()),
        BenchKind::DecodeWait => bench::decode_wait::bench_decode_wait(device, cli.iters),
    }
}
