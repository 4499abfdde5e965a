//! DDP's overlap of the gradient all-reduce with backward changes when the buckets are
//! reduced, not what they hold: on 2 and 3 ranks, k steps with overlap give the parameters of k
//! steps without it (to 1e-6), buckets really start during backward, and a parameter that one
//! rank does not use is still the error naming it.

mod common;

use burn::module::{ModuleVisitor, Param};
use burn::prelude::*;
use burn_autodiff::Autodiff;
use burn_ddp::nn::{BatchNorm, Conv2d, conv_batch_norm};
use burn_ddp::params::max_relative_diff;
use burn_ddp::{CommBackend, DdpConfig, DistributedDataParallel, ProcessGroup, RendezvousConfig, init_process_group};
use burn_flex::Flex;
use burn_nn::conv::Conv2dConfig;
use burn_nn::loss::CrossEntropyLossConfig;
use burn_nn::{BatchNormConfig, Linear, LinearConfig, PaddingConfig2d};
use burn_optim::momentum::MomentumConfig;
use burn_optim::{GradientsParams, Optimizer, SgdConfig};
use common::{assert_all_ok, is_worker, spawn};
use std::sync::Arc;

type B = Autodiff<Flex>;
const STEPS: usize = 3;
const PER_RANK: usize = 4;

/// burn-ddp's layers (their parameters report during backward) and a burn-nn head (reduced
/// after backward).
#[derive(burn::module::Module, Debug)]
struct Net<B: Backend> {
    conv1: Conv2d<B>,
    bn1: BatchNorm<B>,
    conv2: Conv2d<B>,
    bn2: BatchNorm<B>,
    head: Linear<B>,
}

impl<B: Backend> Net<B> {
    fn new(device: &B::Device) -> Self {
        let conv = |i, o| {
            Conv2d::from(
                Conv2dConfig::new([i, o], [3, 3])
                    .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                    .with_bias(false)
                    .init(device),
            )
        };
        let bn = |c| BatchNorm::from(BatchNormConfig::new(c).init(device));
        Self {
            conv1: conv(2, 6),
            bn1: bn(6),
            conv2: conv(6, 8),
            bn2: bn(8),
            head: LinearConfig::new(8, 3).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = conv_batch_norm(&self.conv2, &self.bn2, conv_batch_norm(&self.conv1, &self.bn1, x, true), true);
        let [n, c, h, w] = x.dims();
        self.head.forward(x.reshape([n, c, h * w]).mean_dim(2).reshape([n, c]))
    }
}

/// Trainable parameters only (running statistics are per rank).
struct Trained(Vec<f32>);

impl<BB: Backend> ModuleVisitor<BB> for Trained {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<BB, D>>) {
        if param.val().is_require_grad() {
            self.0.extend(param.val().into_data().convert::<f32>().to_vec::<f32>().unwrap());
        }
    }
}

fn batch(rows: std::ops::Range<usize>, device: &burn::tensor::Device<B>) -> (Tensor<B, 4>, Tensor<B, 1, Int>) {
    let n = rows.len();
    let xs: Vec<f32> = rows
        .clone()
        .flat_map(|i| (0..2 * 5 * 5).map(move |j| (((i * 37 + j * 11) % 31) as f32 - 15.0) / 8.0))
        .collect();
    let ys: Vec<i64> = rows.map(|i| (i % 3) as i64).collect();
    (Tensor::from_data(TensorData::new(xs, [n, 2, 5, 5]), device), Tensor::from_data(TensorData::new(ys, [n]), device))
}

/// Trains `STEPS` steps from rank 0's seed-7 model; returns the trained parameters and how many
/// buckets started during backward.
fn train(pg: Arc<dyn ProcessGroup>, overlap: bool) -> (Vec<f32>, usize) {
    let device = Default::default();
    let (rank, world) = (pg.rank(), pg.world_size());
    B::seed(&device, 7 + rank as u64);
    let ddp = DistributedDataParallel::new(pg, DdpConfig { bucket_bytes: 256, overlap, ..DdpConfig::default() });
    let mut model = ddp.broadcast_module(Net::<B>::new(&device)).unwrap();
    let mut optim = SgdConfig::new().with_momentum(Some(MomentumConfig::new().with_momentum(0.9))).init::<B, Net<B>>();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    for s in 0..STEPS {
        let start = (s * world + rank) * PER_RANK;
        let (x, y) = batch(start..start + PER_RANK, &device);
        let grads = if overlap {
            let step = ddp.step(&model).unwrap();
            step.backward(loss_fn.forward(model.forward(x), y), &model).unwrap()
        } else {
            let loss = loss_fn.forward(model.forward(x), y);
            ddp.sync_gradients(&model, GradientsParams::from_grads(loss.backward(), &model)).unwrap()
        };
        model = optim.step(0.1, model, grads);
    }
    let mut trained = Trained(Vec::new());
    burn::module::Module::visit(&model, &mut trained);
    (trained.0, ddp.stats().overlapped)
}

fn overlap_equals_after_backward(test: &str, world: usize) {
    if !is_worker() {
        let outs = spawn(test, world, &(0..world).collect::<Vec<_>>(), &[]);
        assert_all_ok(test, &outs);
        let texts: Vec<String> = outs.iter().map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).collect();
        let params: Vec<&str> = texts
            .iter()
            .map(|t| {
                t.lines()
                    .find_map(|l| l.split_once("TRAINED ").map(|(_, p)| p))
                    .unwrap_or_else(|| panic!("no TRAINED line: {t}"))
            })
            .collect();
        assert!(params.iter().all(|p| *p == params[0]), "ranks ended with different parameters");
        return;
    }
    let pg = init_process_group(CommBackend::Tcp, &RendezvousConfig::from_env().unwrap()).unwrap();
    let (plain, early_plain) = train(pg.clone(), false);
    let (over, early) = train(pg.clone(), true);
    assert_eq!(early_plain, 0);
    // 256-byte buckets: the convolutions' and batch norms' buckets start during backward.
    assert!(early >= STEPS, "only {early} buckets started during backward in {STEPS} steps");
    let diff = max_relative_diff(&over, &plain, 1e-6);
    assert!(diff <= 1e-6, "overlap moved the parameters: max relative difference {diff}");
    eprintln!(
        "rank {}: {} parameters, overlap vs after-backward max relative difference {diff:e}, {early} buckets early",
        pg.rank(),
        over.len()
    );
    println!("TRAINED {}", serde_json::to_string(&over).unwrap());
}

#[test]
fn overlap_on_2_ranks_equals_reducing_after_backward() {
    overlap_equals_after_backward("overlap_on_2_ranks_equals_reducing_after_backward", 2);
}

#[test]
fn overlap_on_3_ranks_equals_reducing_after_backward() {
    overlap_equals_after_backward("overlap_on_3_ranks_equals_reducing_after_backward", 3);
}

/// Rank 1 skips `conv2`/`bn2` (and feeds the head from conv1's 6 channels padded to 8): their
/// parameters have gradients on rank 0 only. With overlap on, both ranks get the error naming
/// the parameter, as without it — never a hang, never a mismatch.
#[test]
fn overlap_reports_a_parameter_unused_on_one_rank() {
    let test = "overlap_reports_a_parameter_unused_on_one_rank";
    if !is_worker() {
        let outs = spawn(test, 2, &[0, 1], &[]);
        assert_all_ok(test, &outs);
        for (r, o) in outs.iter().enumerate() {
            let text = String::from_utf8_lossy(&o.stdout);
            assert!(
                text.contains("SYNC_ERROR parameter `") && text.contains("has no gradient on some ranks only"),
                "rank {r}: {text}"
            );
        }
        return;
    }
    let device = Default::default();
    let pg = init_process_group(CommBackend::Tcp, &RendezvousConfig::from_env().unwrap()).unwrap();
    let rank = pg.rank();
    B::seed(&device, 7);
    let ddp = DistributedDataParallel::new(pg.clone(), DdpConfig::default());
    let model = ddp.broadcast_module(Net::<B>::new(&device)).unwrap();
    let (x, y) = batch(rank * PER_RANK..(rank + 1) * PER_RANK, &device);
    let step = ddp.step(&model).unwrap();
    let h = conv_batch_norm(&model.conv1, &model.bn1, x, true);
    let h = if rank == 1 {
        Tensor::cat(vec![h.clone(), h.slice([0..PER_RANK, 0..2])], 1)
    } else {
        conv_batch_norm(&model.conv2, &model.bn2, h, true)
    };
    let [n, c, hh, w] = h.dims();
    let logits = model.head.forward(h.reshape([n, c, hh * w]).mean_dim(2).reshape([n, c]));
    match step.backward(CrossEntropyLossConfig::new().init(&device).forward(logits, y), &model) {
        Err(e) => println!("SYNC_ERROR {e}"),
        Ok(_) => println!("SYNCED"),
    }
}
