//! SyncBatchNorm on the GPU against BatchNorm over the concatenated batch.

use crate::checks::batch_norm::{Bn, BnRun, bn_case};
use crate::util::{Ad, round, to_f64, values};
use burn::prelude::*;
use burn::tensor::FloatDType;
use burn_autodiff::Autodiff;
use burn_cuda::CudaDevice;
use burn_ddp::nn::Layout;
use burn_ddp::nn::reference::max_rel_err;
use burn_nn::BatchNormConfig;

/// One rank of [`check_sync_bn`]: its half of the batch through SyncBatchNorm (channels-last,
/// activations in `dtype`) over a TCP group of 2 on the same GPU, after a first training
/// forward on half the values (running statistics move twice): `[y, dx, dγ, dβ]` and the
/// running statistics.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sync_bn_rank(
    device: &CudaDevice,
    port: u16,
    rank: usize,
    dims: [usize; 4],
    x: &[f32],
    g: &[f32],
    gamma: &[f32],
    beta: &[f32],
    relu: bool,
    dtype: FloatDType,
) -> BnRun {
    let config = burn_ddp::RendezvousConfig {
        master_addr: "127.0.0.1".into(),
        master_port: port,
        rank,
        world_size: 2,
        local_rank: 0,
        local_world_size: 2,
        timeout: std::time::Duration::from_secs(60),
        token: None,
        source: burn_ddp::launch_env::EnvSource::Torchrun,
    };
    let pg = burn_ddp::init_process_group(burn_ddp::CommBackend::Tcp, &config).expect("a TCP group of 2");
    let sync = burn_ddp::BatchNormSync::new::<Ad>(pg).expect("SyncBatchNorm on Autodiff<Cuda>");
    let c = dims[1];
    let mut bn = burn_ddp::nn::BatchNorm::from(BatchNormConfig::new(c).init::<Ad>(device)).with_layout(Layout::Nhwc);
    bn.gamma = burn::module::Param::from_tensor(Tensor::from_data(TensorData::new(gamma.to_vec(), [c]), device));
    bn.beta = burn::module::Param::from_tensor(Tensor::from_data(TensorData::new(beta.to_vec(), [c]), device));
    let xt = Tensor::<Ad, 4>::from_data(TensorData::new(x.to_vec(), dims), device).require_grad();
    // NCHW-ordered dims over channels-last memory, as a channels-last model hands it over.
    let bn_in = |t: Tensor<Ad, 4>| Layout::Nhwc.view_nchw(Layout::Nhwc.view_from_nchw(t).cast(dtype));
    let run = |t| {
        if relu {
            burn_ddp::sync_batch_norm_relu(&bn, bn_in(t), &sync)
        } else {
            burn_ddp::sync_batch_norm(&bn, bn_in(t), &sync)
        }
    };
    let _ = run(xt.clone() * 0.5);
    let y = run(xt.clone());
    assert_eq!(y.dtype(), dtype.into(), "SyncBatchNorm keeps its input's type");
    let grads = (y.clone().cast(FloatDType::F32)
        * Tensor::<Ad, 4>::from_data(TensorData::new(g.to_vec(), dims), device))
    .sum()
    .backward();
    let out = [
        to_f64(y),
        to_f64(xt.grad(&grads).expect("dx")),
        to_f64(bn.gamma.val().grad(&grads).expect("dgamma")),
        to_f64(bn.beta.val().grad(&grads).expect("dbeta")),
    ];
    (out, [to_f64(bn.running_mean.value_sync()), to_f64(bn.running_var.value_sync())], Vec::new())
}

/// SyncBatchNorm on the channels-last kernels, 2 ranks (threads with a TCP group, one GPU) each
/// with half the batch, against burn's BatchNorm over the whole batch on the CPU (burn-flex,
/// f32): outputs and input gradients (each rank's half), γ and β gradients (summed over the
/// ranks, as the whole batch's loss sums them), running statistics on both ranks.
pub(crate) fn check_sync_bn(device: &CudaDevice) -> bool {
    let mut ok = true;
    for (dims, relu, dtype, bound) in [
        ([8, 24, 6, 5], true, FloatDType::F32, 1e-4),
        ([6, 100, 7, 9], false, FloatDType::F32, 1e-4),
        ([8, 64, 14, 14], true, FloatDType::BF16, 1e-2),
    ] {
        let n: usize = dims.iter().product();
        let x: Vec<f32> = round(&values(11, n, 4.0, 0.7).into_iter().map(f64::from).collect::<Vec<_>>(), dtype)
            .into_iter()
            .map(|v| v as f32)
            .collect();
        let g: Vec<f32> = round(&values(12, n, 2.0, 0.1).into_iter().map(f64::from).collect::<Vec<_>>(), dtype)
            .into_iter()
            .map(|v| v as f32)
            .collect();
        let (gamma, beta) = (values(13, dims[1], 1.0, 1.0), values(14, dims[1], 1.0, 0.0));
        let (ref_out, ref_running, _) = bn_case::<Autodiff<burn_flex::Flex>>(
            (&Default::default(), Bn::BurnNn),
            dims,
            &x,
            &g,
            &gamma,
            &beta,
            relu,
            FloatDType::F32,
            Layout::Nchw,
        );
        let half = [dims[0] / 2, dims[1], dims[2], dims[3]];
        let per_rank = n / 2;
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let kernels_before = burn_ddp::nn::nhwc_bn_kernel_calls();
        let ranks: Vec<BnRun> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|r| {
                    let (x, g, gamma, beta) =
                        (&x[r * per_rank..(r + 1) * per_rank], &g[r * per_rank..(r + 1) * per_rank], &gamma, &beta);
                    s.spawn(move || sync_bn_rank(device, port, r, half, x, g, gamma, beta, relu, dtype))
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
        });
        let kernels = burn_ddp::nn::nhwc_bn_kernel_calls() - kernels_before;
        let joined = |k: usize| [ranks[0].0[k].clone(), ranks[1].0[k].clone()].concat();
        let summed = |k: usize| ranks[0].0[k].iter().zip(&ranks[1].0[k]).map(|(a, b)| a + b).collect::<Vec<f64>>();
        let mut errs = vec![
            max_rel_err(&joined(0), &ref_out[0]),
            max_rel_err(&joined(1), &ref_out[1]),
            max_rel_err(&summed(2), &ref_out[2]),
            max_rel_err(&summed(3), &ref_out[3]),
        ];
        errs.extend(ranks.iter().flat_map(|r| r.1.iter().zip(&ref_running).map(|(a, b)| max_rel_err(a, b))));
        // Per rank: two training forwards (moments) and one backward (input gradient).
        let pass = kernels == 6 && errs.iter().all(|&e| e < bound);
        ok &= pass;
        println!(
            "RESULT check=sync_batch_norm_nhwc ranks=2 dtype={dtype:?} dims={dims:?} relu={relu} y={:.2e} dx={:.2e} dgamma={:.2e} dbeta={:.2e} running(max over ranks)={:.2e} bound={bound:.0e} nhwc_kernel_calls={kernels} {}",
            errs[0],
            errs[1],
            errs[2],
            errs[3],
            errs[4..].iter().cloned().fold(0.0, f64::max),
            if pass { "ok" } else { "FAIL" }
        );
    }
    ok
}
