//! Step time with and without DDP's overlap of the gradient all-reduce with backward, in one
//! run: a model where communication matters (wide 3×3 convolutions on tiny images: many
//! parameters, little arithmetic), steps alternating between the two modes so both see the same
//! machine load.
//!
//! ```sh
//! cargo build --release -p burn-ddp --example overlap_bench
//! target/release/burn-ddp launch --standalone --nproc-per-node 2 -- target/release/examples/overlap_bench
//! ```
//!
//! Options: `--channels 512 --layers 6 --side 4 --batch 4 --steps 12 --bucket-mib 25`. Rank 0
//! prints one `RESULT` line (JSON): mean and median step seconds per mode, the exposed sync
//! (waiting after backward) per mode, buckets per step and how many started during backward,
//! and the ratio of the medians.

use burn::prelude::*;
use burn_autodiff::Autodiff;
use burn_ddp::nn::{BatchNorm, Conv2d, conv_batch_norm};
use burn_ddp::{CommBackend, DdpConfig, DistributedDataParallel, ProcessGroup, RendezvousConfig, init_process_group};
use burn_flex::Flex;
use burn_nn::conv::Conv2dConfig;
use burn_nn::loss::CrossEntropyLossConfig;
use burn_nn::{BatchNormConfig, Linear, LinearConfig, PaddingConfig2d};
use burn_optim::{GradientsParams, Optimizer, SgdConfig};
use std::time::Instant;

type B = Autodiff<Flex>;

#[derive(burn::module::Module, Debug)]
struct Wide<B: Backend> {
    convs: Vec<Conv2d<B>>,
    bns: Vec<BatchNorm<B>>,
    head: Linear<B>,
}

impl<B: Backend> Wide<B> {
    fn new(channels: usize, layers: usize, device: &B::Device) -> Self {
        let conv = |i| {
            Conv2d::from(
                Conv2dConfig::new([i, channels], [3, 3])
                    .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                    .with_bias(false)
                    .init(device),
            )
        };
        let convs = (0..layers).map(|l| conv(if l == 0 { 3 } else { channels })).collect();
        let bns = (0..layers).map(|_| BatchNorm::from(BatchNormConfig::new(channels).init(device))).collect();
        Self { convs, bns, head: LinearConfig::new(channels, 10).init(device) }
    }

    fn forward(&self, mut x: Tensor<B, 4>) -> Tensor<B, 2> {
        for (c, b) in self.convs.iter().zip(&self.bns) {
            x = conv_batch_norm(c, b, x, true);
        }
        let [n, c, h, w] = x.dims();
        self.head.forward(x.reshape([n, c, h * w]).mean_dim(2).reshape([n, c]))
    }
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let (channels, layers, side, batch, steps) =
        (arg("--channels", 512), arg("--layers", 6), arg("--side", 4), arg("--batch", 4), arg("--steps", 12));
    let bucket_bytes = arg("--bucket-mib", 25) << 20;
    let config = RendezvousConfig::from_env().unwrap_or_else(|e| panic!("run under `burn-ddp launch`: {e}"));
    let pg = init_process_group(CommBackend::Tcp, &config).expect("process group");
    let device = Default::default();
    let ddps = [true, false].map(|overlap| {
        DistributedDataParallel::new(pg.clone(), DdpConfig { overlap, bucket_bytes, ..DdpConfig::default() })
    });
    let mut model = ddps[0].broadcast_module(Wide::<B>::new(channels, layers, &device)).expect("broadcast");
    let mut optim = SgdConfig::new().init::<B, Wide<B>>();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let x = Tensor::<B, 4>::random([batch, 3, side, side], burn::tensor::Distribution::Normal(0.0, 1.0), &device);
    let y =
        Tensor::<B, 1, Int>::from_data(TensorData::new((0..batch as i64).map(|i| i % 10).collect(), [batch]), &device);
    let mut times = [Vec::new(), Vec::new()];
    for s in 0..2 * (steps + 2) {
        let mode = s % 2;
        let ddp = &ddps[mode];
        let t = Instant::now();
        let grads = if mode == 0 {
            let step = ddp.step(&model).expect("step");
            step.backward(loss_fn.forward(model.forward(x.clone()), y.clone()), &model).expect("backward")
        } else {
            let loss = loss_fn.forward(model.forward(x.clone()), y.clone());
            ddp.sync_gradients(&model, GradientsParams::from_grads(loss.backward(), &model)).expect("sync")
        };
        model = optim.step(1e-3, model, grads);
        if s >= 4 {
            times[mode].push(t.elapsed().as_secs_f64()); // the first step of each mode warms up
        }
    }
    if pg.rank() == 0 {
        let params: usize = burn::module::Module::num_params(&model);
        let [on, off] = [&ddps[0], &ddps[1]].map(|d| d.stats());
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        println!(
            "RESULT {{\"params\": {params}, \"world\": {}, \"steps_per_mode\": {}, \"overlap_mean_s\": {:.4}, \"overlap_median_s\": {:.4}, \"after_backward_mean_s\": {:.4}, \"after_backward_median_s\": {:.4}, \"overlap_exposed_sync_s\": {:.4}, \"after_backward_sync_s\": {:.4}, \"buckets_per_step\": {:.1}, \"early_buckets_per_step\": {:.1}, \"speedup\": {:.3}}}",
            pg.world_size(),
            times[0].len(),
            mean(&times[0]),
            median(times[0].clone()),
            mean(&times[1]),
            median(times[1].clone()),
            on.seconds / on.steps as f64,
            off.seconds / off.steps as f64,
            on.buckets as f64 / on.steps as f64,
            on.overlapped as f64 / on.steps as f64,
            median(times[1].clone()) / median(times[0].clone())
        );
    }
}
