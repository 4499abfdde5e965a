//! Times every distinct ResNet-50 convolution shape (forward, and forward + backward).

use crate::util::{Ad, dtype_name, time_ms};
use burn::prelude::*;
use burn::tensor::{Distribution, FloatDType};
use burn_cuda::{Cuda, CudaDevice};
use burn_ddp::nn::{CudnnOptions, Layout, conv2d, options};

#[derive(serde::Deserialize)]
pub(crate) struct Shapes {
    shapes: Vec<Shape4>,
}

#[derive(serde::Deserialize)]
pub(crate) struct Shape4 {
    name: String,
    c: usize,
    h: usize,
    w: usize,
    k: usize,
    r: usize,
    s: usize,
    stride: usize,
    pad: usize,
}

/// How a shape is timed: `latency` synchronises after every call (one call's latency, nothing
/// to overlap); `pipelined` queues `iters` calls and synchronises once (what a training step
/// sees when the host runs ahead).
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Mode {
    Latency,
    Pipelined,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Latency => "latency",
            Mode::Pipelined => "pipelined",
        }
    }
}

pub(crate) fn bench(
    device: &CudaDevice,
    batch: usize,
    iters: usize,
    strided: bool,
    dtype: FloatDType,
    mode: Mode,
    layout: Layout,
) {
    let shapes: Shapes =
        serde_json::from_str(include_str!("../../../benches/resnet50_conv_shapes.json")).expect("shape list");
    let base = options::get();
    // Burn-cuda's activations are pitched; `--strided` also times cuDNN on them as they are.
    let plain = if layout == Layout::Nhwc { "burn-cudnn-nhwc" } else { "burn-cudnn" };
    let variants: &[(&str, bool)] =
        if strided { &[(plain, true), ("burn-cudnn-strided", false)] } else { &[(plain, true)] };
    for &(label, pack) in variants {
        options::set(CudnnOptions { pack_inputs: pack, ..base.clone() });
        bench_shapes(device, batch, iters, &shapes, label, dtype, mode, layout);
    }
    options::set(base);
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn bench_shapes(
    device: &CudaDevice,
    batch: usize,
    iters: usize,
    shapes: &Shapes,
    label: &str,
    dtype: FloatDType,
    mode: Mode,
    layout: Layout,
) {
    let sync = || {
        if mode == Mode::Latency {
            let _ = <Cuda as Backend>::sync(device);
        }
    };
    for s in &shapes.shapes {
        let o = burn::tensor::ops::ConvOptions::new([s.stride; 2], [s.pad; 2], [1, 1], 1);
        let normal = Distribution::Normal(0.0, 1.0);
        let x = Tensor::<Cuda, 4>::random(layout.from_nchw([batch, s.c, s.h, s.w]), normal, device).cast(dtype);
        let w = (Tensor::<Cuda, 4>::random([s.k, s.c, s.r, s.s], normal, device) * 0.05).cast(dtype);
        let fwd = time_ms(iters, device, || {
            let y = conv2d(x.clone(), w.clone(), None, o.clone(), layout);
            sync();
            drop(y);
        });
        let xa = Tensor::<Ad, 4>::from_inner(x.clone()).require_grad();
        let wa = Tensor::<Ad, 4>::from_inner(w.clone()).require_grad();
        let y0 = conv2d(xa.clone(), wa.clone(), None, o.clone(), layout);
        let g = Tensor::<Ad, 4>::random(y0.dims(), normal, device).cast(dtype);
        drop(y0);
        let fwdbwd = time_ms(iters, device, || {
            let y = conv2d(xa.clone(), wa.clone(), None, o.clone(), layout);
            let grads = (y * g.clone()).sum().backward();
            let dx = xa.grad(&grads).expect("dx");
            let dw = wa.grad(&grads).expect("dw");
            sync();
            drop((dx, dw));
        });
        println!(
            "RESULT framework={label} dtype={} mode={} shape={} batch={batch} c={} hw={} k={} r={} stride={} fwd_ms={fwd:.3} fwdbwd_ms={fwdbwd:.3}",
            dtype_name(dtype),
            mode.name(),
            s.name,
            s.c,
            s.h,
            s.k,
            s.r,
            s.stride
        );
    }
}
