//! Training, evaluation and prediction over a [`TrainConfig`], on the CPU or CUDA.

pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod distributed;
mod epoch;
mod fine_tune;
pub mod grad_clip;
pub mod grad_scaler;
pub mod inference;
pub mod instrument;
pub mod metrics;
pub mod mixup;
mod outputs;
pub mod runner;
pub mod schedule;

pub use config::{DeviceSpec, OptimizerKind, Strategy, TrainConfig};
pub use runner::{TrainSummary, train, train_on, train_with};

use crate::error::{Error, Result};
use burn_autodiff::Autodiff;
use burn_flex::Flex;

/// Runs `config` on the device it names.
///
/// # Errors
/// As [`train`], plus [`Error::Device`] for GPU ids that do not exist or a build without CUDA.
pub fn run(config: &TrainConfig) -> Result<TrainSummary> {
    match &config.device {
        // DataParallel over CPU "devices": worker threads of one process sharing the CPU.
        DeviceSpec::Cpu if config.strategy == Strategy::Dp => {
            train_on::<Autodiff<Flex>>(config, vec![Default::default(); config.nproc])
        }
        DeviceSpec::Cpu => train::<Autodiff<Flex>>(config, Default::default()),
        DeviceSpec::Cuda(ids) => run_cuda(config, ids),
    }
}

/// Runs the synthetic throughput benchmark on the device `spec` names.
///
/// # Errors
/// As [`bench::training::synthetic_throughput`], plus device errors.
pub fn run_bench(config: &bench::config::BenchConfig, spec: &DeviceSpec) -> Result<bench::report::BenchResult> {
    match spec {
        DeviceSpec::Cpu => {
            let (dist, _) = bench_world(config, None)?;
            bench::training::synthetic_throughput::<Autodiff<Flex>>(config, &Default::default(), dist.as_ref())
        }
        DeviceSpec::Cuda(ids) => bench_cuda(config, ids),
    }
}

/// The DDP world `bench --ddp` steps in, and this process's GPU of `gpus` (the CPU: `None`):
/// the launcher's world when there is one (the GPU of its local rank), else one of this
/// process alone on the only GPU named; no world without `--ddp`.
///
/// # Errors
/// As [`distributed::Distributed::from_env`]; several GPUs without a launcher.
fn bench_world(
    config: &bench::config::BenchConfig,
    gpus: Option<&[usize]>,
) -> Result<(Option<distributed::Distributed>, Option<usize>)> {
    let launched = burn_ddp::launch_env::launched(&|k| std::env::var(k).ok());
    let ddp = config::ddp_config(!config.no_overlap, config.grad_compression, config.bucket_cap_mb);
    if config.ddp && launched {
        let d = distributed::Distributed::from_env(gpus, None, ddp)?.expect("a launcher's world");
        let gpu = gpus.map(|ids| ids[d.local_rank]);
        return Ok((Some(d), gpu));
    }
    let gpu = gpus.map(cuda_device).transpose()?;
    let dist = config.ddp.then(|| distributed::Distributed::alone(gpu, ddp)).transpose()?;
    Ok((dist, gpu))
}

/// GPU `id` as burn-cuda's device, with burn-ddp's persistent kernel caches set up before its
/// first use, and exact-size memory blocks (an image pipeline's shapes repeat: a fixed batch
/// and image size; the training loop hands blocks back when the batch size changes).
#[cfg(feature = "cuda")]
pub(crate) fn gpu(id: usize) -> burn_cuda::CudaDevice {
    let _ =
        burn_ddp::nn::runtime::kernel_cache::configure_with(burn_ddp::nn::runtime::kernel_cache::Allocator::ExactSizes);
    burn_cuda::CudaDevice::new(id)
}

#[cfg(feature = "cuda")]
fn bench_cuda(config: &bench::config::BenchConfig, ids: &[usize]) -> Result<bench::report::BenchResult> {
    check_gpus(ids)?;
    let (dist, id) = bench_world(config, Some(ids))?;
    let id = id.expect("a GPU");
    let config = bench::config::BenchConfig { gpu: Some(id), ..config.clone() };
    bench::training::synthetic_throughput::<Autodiff<burn_cuda::Cuda>>(&config, &gpu(id), dist.as_ref())
}

#[cfg(not(feature = "cuda"))]
fn bench_cuda(_config: &bench::config::BenchConfig, ids: &[usize]) -> Result<bench::report::BenchResult> {
    cuda_device(ids).map(|_| unreachable!("check_gpu_ids fails without the cuda feature"))
}

/// Resolves `--gpus` for the benchmark (one device), checking it exists.
///
/// # Errors
/// [`Error::Device`] with what exists.
pub fn cuda_device(ids: &[usize]) -> Result<usize> {
    check_gpus(ids)?;
    match ids {
        [id] => Ok(*id),
        _ => Err(Error::Device { reason: format!("--gpus {ids:?}: the benchmark runs on one GPU; pass a single id") }),
    }
}

/// Checks that every id in `--gpus` names a visible GPU in a CUDA build.
///
/// # Errors
/// [`Error::Device`] saying what exists, or how to get a CUDA build.
pub fn check_gpus(ids: &[usize]) -> Result<()> {
    burn_ddp::check_gpu_ids(ids).map_err(|e| Error::Device { reason: device_message(e) })
}

fn device_message(e: burn_ddp::Error) -> String {
    match e {
        burn_ddp::Error::CudaNotCompiled => {
            "--gpus needs CUDA, and this binary was built without it (--no-default-features): build it with the default features (cargo run --release -p burn-vision -- train --gpus 0), or drop --gpus to run on the CPU".into()
        }
        other => other.to_string(),
    }
}

#[cfg(feature = "cuda")]
fn run_cuda(config: &TrainConfig, ids: &[usize]) -> Result<TrainSummary> {
    check_gpus(ids)?;
    if config.strategy == Strategy::Dp {
        return train_on::<Autodiff<burn_cuda::Cuda>>(config, ids.iter().map(|&i| gpu(i)).collect());
    }
    let local_rank = burn_ddp::launch_env::detect(&|k| std::env::var(k).ok())?.map_or(0, |p| p.local_rank);
    let id = *ids
        .get(local_rank)
        .ok_or_else(|| Error::Device { reason: format!("LOCAL_RANK {local_rank} has no GPU in --gpus {ids:?}") })?;
    train::<Autodiff<burn_cuda::Cuda>>(config, gpu(id))
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(_config: &TrainConfig, ids: &[usize]) -> Result<TrainSummary> {
    check_gpus(ids)?;
    unreachable!("check_gpu_ids fails without the cuda feature")
}
