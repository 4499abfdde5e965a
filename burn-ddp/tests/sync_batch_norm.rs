//! Proof by equivalence: SyncBatchNorm over N ranks equals BatchNorm over the concatenated
//! batch — outputs, input gradients, γ/β gradients (summed over ranks) and running statistics —
//! with equal and unequal per-rank batch sizes. Each rank also computes the single-process
//! reference itself (the data are a fixed function of the global row index).

mod common;

use burn::module::AutodiffModule;
use burn::prelude::*;
use burn::tensor::TensorData;
use burn_autodiff::Autodiff;
use burn_ddp::ProcessGroup;
use burn_ddp::params::max_relative_diff;
use burn_ddp::{BatchNormSync, CommBackend, ReduceOp, RendezvousConfig, init_process_group, sync_batch_norm};
use burn_flex::Flex;
use burn_nn::{BatchNorm, BatchNormConfig};
use common::{assert_all_ok, is_worker, spawn};

type B = Autodiff<Flex>;
const C: usize = 3;
const H: usize = 4;
const W: usize = 5;

/// Rows `rows` of the global input, offset by 3 so a naive E[x²]−mean² would lose digits.
fn input(rows: std::ops::Range<usize>, device: &burn::tensor::Device<B>) -> Tensor<B, 4> {
    let n = rows.len();
    let v: Vec<f32> = rows
        .flat_map(|i| {
            (0..C * H * W)
                .map(move |j| 3.0 + (((i * 131 + j * 37) % 101) as f32 - 50.0) / 17.0 * (1.0 + (j / (H * W)) as f32))
        })
        .collect();
    Tensor::from_data(TensorData::new(v, [n, C, H, W]), device)
}

/// The upstream gradient for rows `rows` (loss = Σ y ⊙ G).
fn upstream(rows: std::ops::Range<usize>, device: &burn::tensor::Device<B>) -> Tensor<B, 4> {
    let n = rows.len();
    let v: Vec<f32> =
        rows.flat_map(|i| (0..C * H * W).map(move |j| (((i * 7 + j * 13) % 23) as f32 - 11.0) / 5.0)).collect();
    Tensor::from_data(TensorData::new(v, [n, C, H, W]), device)
}

fn layer(device: &burn::tensor::Device<B>) -> BatchNorm<B> {
    let mut bn = BatchNormConfig::new(C).init::<B>(device);
    bn.gamma = bn.gamma.map(|_| Tensor::from_floats([0.5, 1.5, -2.0], device).require_grad());
    bn.beta = bn.beta.map(|_| Tensor::from_floats([0.1, -0.3, 0.7], device).require_grad());
    bn
}

fn host<BB: Backend, const D: usize>(t: Tensor<BB, D>) -> Vec<f32> {
    t.into_data().to_vec().unwrap()
}

/// Largest absolute difference over the reference's largest magnitude: f32 rounding on outputs
/// that happen to be near zero does not count, a wrong statistic (≥ 1e-3 here) does.
fn check(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
    let d = got.iter().zip(want).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
    assert!(
        d < 1e-5,
        "{what}: max difference {d} of the largest value\n got {:?}\nwant {:?}",
        &got[..got.len().min(6)],
        &want[..want.len().min(6)]
    );
}

fn equivalence(test: &str, sizes: &[usize]) {
    if !is_worker() {
        let world = sizes.len();
        let outs = spawn(test, world, &(0..world).collect::<Vec<_>>(), &[]);
        assert_all_ok(test, &outs);
        for (r, o) in outs.iter().enumerate() {
            let text = String::from_utf8_lossy(&o.stdout);
            assert!(text.contains("SYNC_BN_OK"), "rank {r} did not finish its checks:\n{text}");
        }
        return;
    }
    let device = Default::default();
    let pg = init_process_group(CommBackend::Tcp, &RendezvousConfig::from_env().unwrap()).unwrap();
    let rank = pg.rank();
    let start: usize = sizes[..rank].iter().sum();
    let mine = start..start + sizes[rank];
    let total: usize = sizes.iter().sum();

    // This rank, synchronised.
    let sync = BatchNormSync::new::<B>(pg.clone()).unwrap();
    let bn = burn_ddp::nn::BatchNorm::from(layer(&device));
    let x = input(mine.clone(), &device).require_grad();
    let y = sync_batch_norm(&bn, x.clone(), &sync);
    let grads = (y.clone() * upstream(mine.clone(), &device)).sum().backward();
    let dx = host(x.grad(&grads).unwrap());
    let reduce = |t: Tensor<Flex, 1>| host(burn_ddp::tensor::all_reduce(&*pg, t, ReduceOp::Sum).unwrap());
    let dgamma = reduce(bn.gamma.grad(&grads).unwrap());
    let dbeta = reduce(bn.beta.grad(&grads).unwrap());

    // One process, the concatenated batch, plain BatchNorm.
    let bn_ref = layer(&device);
    let x_ref = input(0..total, &device).require_grad();
    let y_ref = bn_ref.forward(x_ref.clone());
    let grads_ref = (y_ref.clone() * upstream(0..total, &device)).sum().backward();
    let rows = |t: Tensor<B, 4>| host(t.slice([mine.clone()]));
    let dx_ref: Tensor<B, 4> = Tensor::from_inner(x_ref.grad(&grads_ref).unwrap());

    check("output", &host(y), &rows(y_ref));
    check("input gradient", &dx, &rows(dx_ref));
    check("gamma gradient", &dgamma, &host(bn_ref.gamma.grad(&grads_ref).unwrap()));
    check("beta gradient", &dbeta, &host(bn_ref.beta.grad(&grads_ref).unwrap()));
    check("running mean", &host(bn.running_mean.value()), &host(bn_ref.running_mean.value()));
    check("running var", &host(bn.running_var.value()), &host(bn_ref.running_var.value()));
    // Evaluation with these running statistics (before the forward pass below moves them).
    let eval_ref = host(bn_ref.valid().forward(input(mine.clone(), &device).inner()));
    // The statistics really are global: a rank-local BatchNorm differs.
    let local = host(layer(&device).forward(input(mine.clone(), &device)));
    assert!(
        max_relative_diff(&local, &rows(bn_ref.forward(input(0..total, &device))), 1e-3) > 1e-3,
        "rank-local statistics must differ from global ones"
    );
    // Evaluation mode: running statistics, no communication (a lone rank would hang otherwise),
    // as plain BatchNorm's.
    let eval = sync_batch_norm(&bn.valid(), input(mine.clone(), &device).inner(), &sync);
    assert_eq!(eval.dims(), [sizes[rank], C, H, W]);
    check("evaluation", &host(eval), &eval_ref);
    println!("SYNC_BN_OK rank={rank}");
}

#[test]
fn sync_bn_2_ranks_equal_batches() {
    equivalence("sync_bn_2_ranks_equal_batches", &[4, 4]);
}

#[test]
fn sync_bn_2_ranks_unequal_batches() {
    equivalence("sync_bn_2_ranks_unequal_batches", &[3, 6]);
}

#[test]
fn sync_bn_3_ranks_unequal_batches() {
    equivalence("sync_bn_3_ranks_unequal_batches", &[2, 5, 1]);
}

/// In a world of one process SyncBatchNorm is plain BatchNorm (PyTorch's rule), for NCHW and
/// channels-last layers alike (the caller hands NCHW-ordered dims in both): outputs, all
/// gradients and running statistics equal burn-nn's BatchNorm on the same batch.
#[test]
fn sync_bn_in_a_world_of_one_is_batch_norm_in_both_layouts() {
    use burn_ddp::nn::Layout;
    let device = Default::default();
    let pg = init_process_group(CommBackend::Tcp, &RendezvousConfig::single_process(0)).unwrap();
    let sync = BatchNormSync::new::<B>(pg).unwrap();
    for layout in [Layout::Nchw, Layout::Nhwc] {
        let bn = burn_ddp::nn::BatchNorm::from(layer(&device)).with_layout(layout);
        let x = input(0..6, &device).require_grad();
        let y = sync_batch_norm(&bn, x.clone(), &sync);
        let grads = (y.clone() * upstream(0..6, &device)).sum().backward();
        let bn_ref = layer(&device);
        let x_ref = input(0..6, &device).require_grad();
        let y_ref = bn_ref.forward(x_ref.clone());
        let grads_ref = (y_ref.clone() * upstream(0..6, &device)).sum().backward();
        let what = |s: &str| format!("{layout:?} {s}");
        check(&what("output"), &host(y), &host(y_ref));
        check(&what("input gradient"), &host(x.grad(&grads).unwrap()), &host(x_ref.grad(&grads_ref).unwrap()));
        check(
            &what("gamma gradient"),
            &host(bn.gamma.grad(&grads).unwrap()),
            &host(bn_ref.gamma.grad(&grads_ref).unwrap()),
        );
        check(
            &what("beta gradient"),
            &host(bn.beta.grad(&grads).unwrap()),
            &host(bn_ref.beta.grad(&grads_ref).unwrap()),
        );
        check(&what("running mean"), &host(bn.running_mean.value()), &host(bn_ref.running_mean.value()));
        check(&what("running var"), &host(bn.running_var.value()), &host(bn_ref.running_var.value()));
    }
}
