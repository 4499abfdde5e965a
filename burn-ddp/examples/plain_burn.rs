//! Multi-GPU (or multi-process CPU) training of a plain Burn model with burn-ddp alone: a small
//! CNN written with burn-nn and burn-ddp's layers (`burn_ddp::nn::{Conv2d, BatchNorm}`: cuDNN
//! and our batch-norm kernels on burn-cuda, burn's operations elsewhere), trained with
//! `DistributedDataParallel` on a synthetic four-class task (where is the bright square?).
//!
//! ```sh
//! cargo build --release -p burn-ddp --example plain_burn
//! target/release/burn-ddp launch --standalone --nproc-per-node 2 -- target/release/examples/plain_burn
//! # GPUs (one process per GPU, NCCL): build with --features cuda and pass --gpu
//! target/release/burn-ddp launch --standalone --nproc-per-node 2 -- target/release/examples/plain_burn --gpu
//! ```
//!
//! Without the launcher's variables it trains alone. Every rank ends with a `RESULT` line: the
//! all-reduced loss of the first and last steps and a checksum of its trained parameters, which
//! must be equal on every rank (the CI test `tests/plain_burn_example.rs` checks both).

use burn::module::{ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_ddp::nn::{BatchNorm, Conv2d, Layout, conv_batch_norm, images_to_device};
use burn_ddp::{
    CommBackend, DdpConfig, DistributedDataParallel, DistributedSampler, ReduceOp, RendezvousConfig, init_process_group,
};
use burn_nn::conv::Conv2dConfig;
use burn_nn::loss::CrossEntropyLossConfig;
use burn_nn::{BatchNormConfig, Linear, LinearConfig, PaddingConfig2d};
use burn_optim::{GradientsParams, Optimizer, SgdConfig, momentum::MomentumConfig};
use rand::{Rng, SeedableRng};
use std::sync::Arc;

const SIDE: usize = 16;
const CLASSES: usize = 4;

/// Two conv → batch norm → ReLU stages and a linear head.
#[derive(Module, Debug)]
struct Net<B: Backend> {
    conv1: Conv2d<B>,
    bn1: BatchNorm<B>,
    conv2: Conv2d<B>,
    bn2: BatchNorm<B>,
    fc: Linear<B>,
}

impl<B: Backend> Net<B> {
    fn new(layout: Layout, device: &B::Device) -> Self {
        let conv = |c_in, c_out, stride| {
            Conv2d::from(
                Conv2dConfig::new([c_in, c_out], [3, 3])
                    .with_stride([stride, stride])
                    .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                    .with_bias(false)
                    .init(device),
            )
            .with_layout(layout)
        };
        let bn = |c| BatchNorm::from(BatchNormConfig::new(c).init(device)).with_layout(layout);
        Self {
            conv1: conv(1, 16, 1),
            bn1: bn(16),
            conv2: conv(16, 32, 2),
            bn2: bn(32),
            fc: LinearConfig::new(32 * 4, CLASSES).init(device),
        }
    }

    /// `[n, 1, 16, 16]` (NCHW) → logits `[n, 4]`.
    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let layout = self.conv1.layout;
        let x = layout.view_from_nchw(x);
        let x = conv_batch_norm(&self.conv1, &self.bn1, x, true);
        let x = layout.view_nchw(conv_batch_norm(&self.conv2, &self.bn2, x, true));
        // Where the square is matters: pool each quadrant, not the whole image.
        let x = burn::tensor::module::adaptive_avg_pool2d(x, [2, 2]);
        let [n, c, _, _] = x.dims();
        self.fc.forward(x.reshape([n, c * 4]))
    }
}

/// Sample `i`: noise plus a bright 4×4 square in quadrant `i % 4` (the label), at a position
/// and brightness drawn from the sample's own seed — the same on every rank and every run.
fn sample(i: usize) -> (Vec<f32>, usize) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(i as u64);
    let label = i % CLASSES;
    let mut image: Vec<f32> = (0..SIDE * SIDE).map(|_| rng.random_range(-0.5..0.5)).collect();
    let (qy, qx) = (label / 2 * SIDE / 2, label % 2 * SIDE / 2);
    let (oy, ox) = (qy + rng.random_range(0..4), qx + rng.random_range(0..4));
    let level = rng.random_range(1.0..2.0);
    for y in oy..oy + 4 {
        for x in ox..ox + 4 {
            image[y * SIDE + x] += level;
        }
    }
    (image, label)
}

/// Checksum (FNV-1a over the f32 bits) of the trainable parameters, which DDP keeps equal on
/// every rank (BatchNorm running statistics are per rank unless broadcast, so they are left out).
struct Checksum(u64);

impl<B: Backend> ModuleVisitor<B> for Checksum {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if !param.val().is_require_grad() {
            return;
        }
        for v in param.val().into_data().convert::<f32>().to_vec::<f32>().expect("f32") {
            for b in v.to_bits().to_le_bytes() {
                self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
        }
    }
}

struct Args {
    lr: f64,
    steps: usize,
    batch: usize,
    gpu: bool,
    channels_last: bool,
}

fn parse_args() -> Args {
    let mut a = Args { lr: 0.2, steps: 40, batch: 16, gpu: false, channels_last: false };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut number = |name: &str| {
            it.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| fail(&format!("{name} needs a positive number")))
        };
        match arg.as_str() {
            "--steps" => a.steps = number("--steps"),
            "--lr" => a.lr = it.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| fail("--lr needs a number")),
            "--batch" => a.batch = number("--batch"),
            "--gpu" => a.gpu = true,
            "--channels-last" => a.channels_last = true,
            other => fail(&format!(
                "unknown argument {other}; use --steps N --batch N (per rank) --lr X --gpu --channels-last"
            )),
        }
    }
    a
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(2)
}

/// Trains on `device`, as one rank of `ddp`'s group (or alone).
fn train<B: AutodiffBackend>(
    args: &Args,
    ddp: Option<&DistributedDataParallel>,
    device: &B::Device,
) -> burn_ddp::Result<()> {
    let (rank, world) = ddp.map_or((0, 1), |d| (d.process_group().rank(), d.process_group().world_size()));
    B::seed(device, 7 + rank as u64); // different on purpose: the broadcast makes them equal
    let layout = if args.channels_last { Layout::Nhwc } else { Layout::Nchw };
    let mut model = Net::<B>::new(layout, device);
    if let Some(d) = ddp {
        model = d.broadcast_module(model)?;
    }
    let mut optim = SgdConfig::new().with_momentum(Some(MomentumConfig::new().with_momentum(0.9))).init::<B, Net<B>>();
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let samples = 4096;
    let mut sampler = DistributedSampler::new(samples, world, rank).with_seed(0).with_drop_last(true);
    let per_epoch = sampler.num_samples() / args.batch;
    let (mut first, mut last) = (Vec::new(), Vec::new());
    for step in 0..args.steps {
        sampler.set_epoch((step / per_epoch) as u64);
        let order = sampler.indices();
        let at = step % per_epoch * args.batch;
        let (images, labels): (Vec<Vec<f32>>, Vec<usize>) =
            order[at..at + args.batch].iter().map(|&i| sample(i)).unzip();
        let x = images_to_device::<B>(images.concat(), [args.batch, 1, SIDE, SIDE], device);
        let y = Tensor::<B, 1, Int>::from_data(
            TensorData::new(labels.iter().map(|&l| l as i64).collect(), [args.batch]),
            device,
        );
        // Under DDP, the step opened before the forward pass lets burn-ddp's layers report their
        // gradients during backward, so each bucket's all-reduce starts while backward runs.
        let ddp_step = ddp.map(|d| d.step(&model)).transpose()?;
        let loss = loss_fn.forward(model.forward(x), y);
        let mut mean_loss = loss.clone().inner();
        let grads = match (ddp_step, ddp) {
            (Some(ddp_step), Some(d)) => {
                let grads = ddp_step.backward(loss, &model)?;
                mean_loss =
                    burn_ddp::tensor::all_reduce(d.process_group(), mean_loss, ReduceOp::Sum)?.div_scalar(world as f64);
                grads
            }
            _ => GradientsParams::from_grads(loss.backward(), &model),
        };
        model = optim.step(args.lr, model, grads);
        let value: f32 = mean_loss.into_scalar().elem();
        if rank == 0 && (step % 10 == 0 || step + 1 == args.steps) {
            log::info!("step {step}: loss {value:.4} (mean over {world} rank(s), global batch {})", world * args.batch);
        }
        if step < 5 {
            first.push(value)
        } else if step + 5 >= args.steps {
            last.push(value)
        }
    }
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len().max(1) as f32;
    let mut sum = Checksum(0xcbf2_9ce4_8422_2325);
    model.visit(&mut sum); // the autodiff module: its trained parameters require a gradient
    let overlapped = ddp.map_or(0, |d| d.stats().overlapped);
    println!(
        "RESULT rank={rank} world={world} first_loss={:.4} last_loss={:.4} params={:016x} overlapped_buckets={overlapped}",
        mean(&first),
        mean(&last),
        sum.0
    );
    Ok(())
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).format_timestamp(None).init();
    let args = parse_args();
    if args.gpu {
        // Before burn-cuda's first operation: autotune results and compiled kernels persist.
        let _ = burn_ddp::nn::runtime::kernel_cache::configure();
    }
    if args.steps < 10 || args.batch == 0 {
        fail("--steps must be at least 10 and --batch positive");
    }
    let launched = std::env::var_os("RANK").is_some();
    let group = |backend| -> Arc<DistributedDataParallel> {
        let config = RendezvousConfig::from_env().unwrap_or_else(|e| fail(&e.to_string()));
        let pg = init_process_group(backend, &config).unwrap_or_else(|e| fail(&e.to_string()));
        Arc::new(DistributedDataParallel::new(pg, DdpConfig::default()))
    };
    let result = if args.gpu {
        run_gpu(&args, launched.then(|| group(CommBackend::Nccl)))
    } else {
        let ddp = launched.then(|| group(CommBackend::Tcp));
        train::<burn_autodiff::Autodiff<burn_flex::Flex>>(&args, ddp.as_deref(), &Default::default())
    };
    if let Err(e) = result {
        fail(&e.to_string());
    }
}

#[cfg(feature = "cuda")]
fn run_gpu(args: &Args, ddp: Option<Arc<DistributedDataParallel>>) -> burn_ddp::Result<()> {
    let local_rank = std::env::var("LOCAL_RANK").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    burn_ddp::check_gpu_ids(&[local_rank])?;
    train::<burn_autodiff::Autodiff<burn_cuda::Cuda>>(args, ddp.as_deref(), &burn_cuda::CudaDevice::new(local_rank))
}

#[cfg(not(feature = "cuda"))]
fn run_gpu(_: &Args, _: Option<Arc<DistributedDataParallel>>) -> burn_ddp::Result<()> {
    Err(burn_ddp::Error::CudaNotCompiled)
}
