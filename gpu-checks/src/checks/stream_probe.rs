//! burn-cuda's own CUDA stream: whether it can be found from outside cubecl (which does not
//! expose it) through CUPTI (`burn_ddp::nn::cuda::burn_stream`), and whether cuDNN, cuBLAS and
//! burn-ddp's kernels give the same training on it (`CudnnOptions::same_stream`) as on
//! burn-ddp's stream behind fences.
//!
//! Why it matters: each such call is ordered with burn's kernels by four one-thread fence
//! kernels of about 2 µs of GPU time: 0.83 ms of a ResNet-50 step and 2.0 ms of a ViT-B/16 step
//! on an H200 (Nsight Compute, 2026-12-04). On burn's own stream none is needed.

use crate::checks::optimizer::Materialise;
use crate::util::{Ad, to_f64};
use burn::prelude::*;
use burn::tensor::{Distribution, FloatDType};
use burn_cuda::{Cuda, CudaDevice};
use burn_ddp::nn::cuda::burn_stream;
use burn_ddp::nn::options::{self, CudnnOptions};
use burn_ddp::nn::reference::max_rel_err;
use burn_optim::{GradientsParams, Optimizer};
use cudarc::driver::sys as driver;
use std::time::{Duration, Instant};

/// A few of burn's kernels on the calling thread's stream, waited for.
fn burn_work(device: &CudaDevice) {
    let x = Tensor::<Cuda, 1>::ones([1 << 20], device);
    let _ = ((x + 1.0) * 2.0).sum().into_data();
}

/// Whether an event recorded on `stream` (burn's, as CUPTI reported it) stays pending while
/// burn's long work queued before it runs, and completes once that work is done.
fn orders_after_burn(device: &CudaDevice, stream: usize) -> Result<(bool, bool), String> {
    let ctx = cudarc::driver::CudaContext::new(device.index).map_err(|e| format!("{e:?}"))?;
    ctx.bind_to_thread().map_err(|e| format!("{e:?}"))?;
    let x = Tensor::<Cuda, 2>::ones([8192, 8192], device);
    let _ = x.clone().matmul(x.clone()).sum().into_data(); // tuned and compiled before timing
    let t = Instant::now();
    let _ = x.clone().matmul(x.clone()).sum().into_data();
    // Enough products for about 1.5 s of GPU work, whatever the GPU's speed.
    let products = (1.5 / t.elapsed().as_secs_f64().max(1e-4)).ceil().clamp(20.0, 5000.0) as usize;
    let mut y = x.clone();
    for _ in 0..products {
        y = y.matmul(x.clone()).mul_scalar(1.0 / 8192.0);
    }
    // A read from another thread makes burn launch the products (queued on this thread's
    // stream); this thread records its event meanwhile.
    let sum = y.sum();
    let reader = std::thread::spawn(move || {
        let t = Instant::now();
        let _ = sum.into_data();
        t.elapsed()
    });
    std::thread::sleep(Duration::from_millis(300));
    let mut event = std::ptr::null_mut();
    // SAFETY: the context is bound; a fresh event recorded on a live stream of it.
    let pending = unsafe {
        driver::cuEventCreate(&mut event, 0).result().map_err(|e| format!("{e:?}"))?;
        driver::cuEventRecord(event, stream as driver::CUstream).result().map_err(|e| format!("{e:?}"))?;
        driver::cuEventQuery(event) == driver::CUresult::CUDA_ERROR_NOT_READY
    };
    let took = reader.join().map_err(|_| "the reading thread panicked".to_string())?;
    // SAFETY: as above; the event is destroyed once.
    let done = unsafe {
        let done = driver::cuEventSynchronize(event) == driver::CUresult::CUDA_SUCCESS;
        driver::cuEventDestroy_v2(event);
        done
    };
    println!(
        "  burn's {products} products took {:.0} ms to read back; the event was recorded at 300 ms",
        took.as_secs_f64() * 1e3
    );
    Ok((pending, done))
}

/// The streams burn's launches went to while this thread's work ran (1), then another
/// thread's (2): each burn stream should be one CUDA stream.
pub(crate) fn check_stream_probe(device: &CudaDevice) -> bool {
    burn_work(device); // kernels compiled and streams created before CUPTI watches
    if let Err(e) = burn_stream::ready() {
        println!(
            "RESULT check=burn_stream_probe {e} (BURN_DDP_CUPTI names libcupti; --skip burn-stream where there is none) FAIL"
        );
        return false;
    }
    let name = burn_stream::library().unwrap_or_default();
    let streams = |seen: Vec<(std::thread::ThreadId, usize)>| {
        let mut s: Vec<usize> = seen.into_iter().map(|(_, s)| s).collect();
        s.sort_unstable();
        s.dedup();
        s
    };
    let other = device.clone();
    let seen = burn_stream::capture(|| burn_work(device)).and_then(|((), mine)| {
        burn_stream::capture(|| std::thread::spawn(move || burn_work(&other)).join())
            .map(|(_, theirs)| (streams(mine), streams(theirs)))
    });
    let (mine, theirs) = match seen {
        Ok(s) => s,
        Err(e) => {
            println!("RESULT check=burn_stream_probe cupti={name} error=\"{e}\" FAIL");
            return false;
        }
    };
    let one = mine.len() == 1 && mine[0] != 0;
    let (pending, done) = match one.then(|| orders_after_burn(device, mine[0])) {
        Some(Ok(r)) => r,
        Some(Err(e)) => {
            println!("  ordering test failed: {e}");
            (false, false)
        }
        None => (false, false),
    };
    let pass = one && pending && done;
    // Whether another thread's work has a stream of its own is reported: cubecl may share a
    // pool of streams between threads.
    println!(
        "RESULT check=burn_stream_probe cupti={name} this_thread_streams={mine:x?} other_thread_streams={theirs:x?} per_thread={} event_pending_behind_burn={pending} event_done_after_drain={done} {}",
        theirs.len() == 1 && mine != theirs,
        if pass { "ok" } else { "FAIL" }
    );
    pass
}

/// A transformer block and a convolution: every kind of call the same-stream path takes
/// (cuBLAS products, cuDNN's attention and layer-norm backward, the GELU, layer-norm, loss and
/// optimizer kernels, a cuDNN convolution).
#[derive(burn::module::Module, Debug)]
struct Block<B: Backend> {
    conv: burn_ddp::nn::Conv2d<B>,
    norm: burn_nn::LayerNorm<B>,
    qkv: burn_nn::Linear<B>,
    proj: burn_nn::Linear<B>,
    fc1: burn_nn::Linear<B>,
    head: burn_nn::Linear<B>,
}

impl<B: Backend> Block<B> {
    fn new(device: &B::Device) -> Self {
        B::seed(device, 5);
        Self {
            conv: burn_ddp::nn::Conv2d::from(
                burn_nn::conv::Conv2dConfig::new([3, 64], [4, 4]).with_stride([4, 4]).init(device),
            ),
            norm: burn_nn::LayerNormConfig::new(64).init(device),
            qkv: burn_nn::LinearConfig::new(64, 192).init(device),
            proj: burn_nn::LinearConfig::new(64, 64).init(device),
            fc1: burn_nn::LinearConfig::new(64, 256).init(device),
            head: burn_nn::LinearConfig::new(256, 10).init(device),
        }
    }

    fn loss(&self, x: Tensor<B, 4>, labels: Tensor<B, 1, Int>) -> Tensor<B, 1> {
        use burn_ddp::nn::{cross_entropy, layer_norm, linear, linear_gelu, multi_head_self_attention};
        let f = self.conv.forward(x); // [n, 64, 8, 8]
        let [n, c, h, w] = f.dims();
        let t = f.reshape([n, c, h * w]).swap_dims(1, 2).cast(FloatDType::BF16); // [n, 64 tokens, 64]
        let a = linear(
            &self.proj,
            multi_head_self_attention(linear(&self.qkv, layer_norm(&self.norm, t.clone(), 1e-6)), 2),
        );
        let y = linear_gelu(&self.fc1, t + a).mean_dim(1).reshape([n, 256]).cast(FloatDType::F32);
        cross_entropy(linear(&self.head, y), labels, 0.1)
    }
}

/// `steps` SGD steps (momentum 0.9) of the block from its seeded start with the options in
/// force: the losses and the parameters after. SGD, not AdamW: AdamW's first steps move each
/// weight by about ±lr whatever the gradient's size, so cuDNN's run-to-run rounding flips
/// tiny gradients' signs into differences of 2·lr (8 % of the largest weight between two
/// fenced runs on an H200, 2026-12-05), which would hide a real difference; SGD's step is
/// linear in the gradient. The `adamw` check covers that optimizer on the path in force.
fn train(device: &CudaDevice, steps: usize) -> (Vec<f64>, Vec<f64>) {
    let x = Tensor::<Ad, 4>::random([16, 3, 32, 32], Distribution::Normal(0.0, 1.0), device);
    let labels = Tensor::<Ad, 1, Int>::from_ints([1, 3, 5, 7, 9, 0, 2, 4, 6, 8, 1, 1, 2, 3, 5, 8], device);
    let mut net = Block::<Ad>::new(device).map(&mut Materialise);
    let mut optim = burn_ddp::nn::FusedSgdConfig { momentum: 0.9, ..Default::default() }.init::<Ad, Block<Ad>>();
    let mut losses = Vec::new();
    for _ in 0..steps {
        let loss = net.loss(x.clone(), labels.clone());
        losses.extend(to_f64(loss.clone()));
        let grads = GradientsParams::from_grads(loss.backward(), &net);
        net = optim.step(0.05, net, grads);
    }
    let params = [net.qkv.weight.val(), net.fc1.weight.val(), net.head.weight.val()]
        .into_iter()
        .flat_map(|w| to_f64(w.flatten::<1>(0, 1)))
        .chain(to_f64(net.conv.weight.val().flatten::<1>(0, 3)))
        .collect();
    (losses, params)
}

/// The block trained on burn-ddp's stream behind fences, then on burn's own stream
/// (`same_stream`): the same losses and parameters (within cuDNN's run-to-run variation,
/// measured by training twice with fences), and the second run must have taken the path.
pub(crate) fn check_same_stream(device: &CudaDevice) -> bool {
    if let Err(e) = burn_stream::ready() {
        println!(
            "RESULT check=same_stream {e} (BURN_DDP_CUPTI names libcupti; --skip same-stream where there is none) FAIL"
        );
        return false;
    }
    let base = options::get();
    options::set(CudnnOptions { same_stream: false, ..base.clone() });
    let (fenced_losses, fenced) = train(device, 6);
    let (again_losses, again) = train(device, 6);
    options::set(CudnnOptions { same_stream: true, ..base.clone() });
    let before = burn_ddp::nn::profile::CudnnTimes::now();
    let (same_losses, same) = train(device, 6);
    let took = burn_ddp::nn::profile::CudnnTimes::now().since(&before);
    options::set(base);
    let (noise, err) = (max_rel_err(&again, &fenced), max_rel_err(&same, &fenced));
    let (loss_noise, loss_err) =
        (max_rel_err(&again_losses, &fenced_losses), max_rel_err(&same_losses, &fenced_losses));
    let on_burns = took.on_burns_stream;
    let pass =
        err <= noise.max(1e-5) * 10.0 && loss_err <= loss_noise.max(1e-5) * 10.0 && on_burns > 0 && took.calls > 0;
    println!(
        "RESULT check=same_stream params_rel_err={err:.2e} fenced_run_to_run={noise:.2e} loss_rel_err={loss_err:.2e} loss_run_to_run={loss_noise:.2e} calls={} on_burns_stream={on_burns} {}",
        took.calls,
        if pass { "ok" } else { "FAIL" }
    );
    pass
}
