//! `FusedSgd`'s step (sgd.rs) on burn-cuda, as PyTorch's multi-tensor apply: the f32 parameters of
//! one device are updated by a single burn-fusion operation ([`fusion_op::queue`]), which
//! allocates their new values and hands every parameter's addresses to one CUDA kernel, launched
//! in batches of up to [`SLOTS`] parameters (the addresses travel as the launch's argument, no
//! upload) on cuDNN's stream, ordered with burn's like every cuDNN call
//! ([`launch::launch`]). A step is then one operation for the training thread and a few
//! launches for cubecl's device thread, instead of a kernel launch — with its metadata upload
//! and allocations — per parameter. Momentum buffers are updated in place when the step holds
//! the only reference to them (always, unless a record handed out still holds one).
//!
//! The kernel is CUDA C compiled by NVRTC once per process ([`crate::nn::cuda::kernels::nvrtc`]); when that fails,
//! a warning says so and burn's operations run instead.

use crate::error::{Error, Result};
use crate::nn::cuda::cudnn::convolution as cudnn;
use crate::nn::cuda::kernels::nvrtc::{Kernels, launch_256};
use crate::nn::cuda::runtime::fusion_op::{self, Cube, packed};
use crate::nn::cuda::runtime::launch::{self, Prim, by_device, cast, cuda_backend, empty_f32};
use crate::nn::optim::sgd_rule::{Done, Entry, FusedSgdConfig};
use burn::module::ParamId;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape};
use cudarc::driver::sys as driver;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Parameters per launch: their addresses fill 3 KiB of the 4 KiB kernel-argument space.
const SLOTS: usize = 64;

const KERNEL: &str = r#"
struct Slot { const float* p; const float* g; const float* v; float* p_out; float* v_out; unsigned int n; unsigned int first; };
struct Batch { Slot s[64]; };
// PyTorch's SGD: g = grad + decay*p; v = first ? g : mu*v + keep*g; g = nesterov ? g + mu*v : v;
// p_out = p - lr*g. Block row y is parameter y of the batch; v may alias v_out (in place).
extern "C" __global__ void fused_sgd(const Batch b, float lr, float mu, float keep, float decay, int momentum, int nesterov) {
    const Slot s = b.s[blockIdx.y];
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < s.n; i += gridDim.x * blockDim.x) {
        float p = s.p[i];
        float g = s.g[i] + decay * p;
        if (momentum) {
            float v = s.first ? g : mu * s.v[i] + keep * g;
            s.v_out[i] = v;
            g = nesterov ? g + mu * v : v;
        }
        s.p_out[i] = p - lr * g;
    }
}
"#;

/// One parameter of a launch, as the kernel's `Slot` reads it.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SlotArg {
    p: u64,
    g: u64,
    v: u64,
    p_out: u64,
    v_out: u64,
    n: u32,
    first: u32,
}

/// Parameters updated by the kernel so far (read by `sgd::fused_updates`).
pub(crate) static UPDATES: AtomicUsize = AtomicUsize::new(0);

static KERNELS: Kernels = Kernels::new("fused SGD", KERNEL);

/// What each parameter contributes to the operation's inputs and outputs.
#[derive(Clone)]
struct Slot {
    id: ParamId,
    shape: Shape,
    has_velocity: bool,
}

/// Updates the entries this path takes (burn-cuda, f32 value, gradient and buffer, NVRTC
/// working) as one operation per device; returns their results and the entries left for burn's
/// operations.
pub(crate) fn update<B: Backend>(entries: Vec<Entry<B>>, lr: f64, c: &FusedSgdConfig) -> (Vec<Done<B>>, Vec<Entry<B>>) {
    if cuda_backend::<B>() != Some(false) || entries.is_empty() || KERNELS.ptx().is_none() {
        return (Vec::new(), entries);
    }
    let f32s = |e: &Entry<B>| {
        [Some(&e.param), Some(&e.grad), e.state.as_ref()]
            .into_iter()
            .flatten()
            .all(|t| cast::<FloatTensor<B>, Prim>(t.clone()).dtype == DType::F32)
    };
    let (ours, rest): (Vec<_>, Vec<_>) = entries.into_iter().partition(f32s);
    let done = by_device::<B, _>(ours, |e: &Entry<B>| &e.param)
        .into_iter()
        .flat_map(|list| queue_group(list, lr, c))
        .map(|(id, p, v)| (id, cast(p), v.map(cast)))
        .collect();
    (done, rest)
}

/// One operation for `entries` (one device): inputs value, gradient [, buffer] per parameter;
/// outputs new value [, new buffer].
fn queue_group<B: Backend>(entries: Vec<Entry<B>>, lr: f64, c: &FusedSgdConfig) -> Vec<(ParamId, Prim, Option<Prim>)> {
    let momentum = c.momentum != 0.0;
    let mut inputs: Vec<Prim> = Vec::with_capacity(entries.len() * 3);
    let mut outputs = Vec::with_capacity(entries.len() * 2);
    let mut slots = Vec::with_capacity(entries.len());
    for e in entries {
        let param: Prim = cast(e.param);
        let shape = param.shape.clone();
        outputs.extend(std::iter::repeat_n((shape.clone(), DType::F32), 1 + usize::from(momentum)));
        slots.push(Slot { id: e.id, shape, has_velocity: momentum && e.state.is_some() });
        inputs.extend([param, cast(e.grad)]);
        if momentum && let Some(v) = e.state {
            inputs.push(cast(v));
        }
    }
    let (run_slots, c) = (slots.clone(), *c);
    let out = fusion_op::queue("fused_sgd", inputs, &outputs, move |ins| run(ins, &run_slots, lr, &c));
    let mut out = out.into_iter();
    slots
        .into_iter()
        .map(|s| {
            (
                s.id,
                out.next().expect("a new value per parameter"),
                momentum.then(|| out.next().expect("a new buffer per parameter")),
            )
        })
        .collect()
}

/// On burn-fusion's thread: the new values allocated (buffers reused when only this step holds
/// them), then every parameter's update queued as one ordered computation.
fn run(ins: Vec<Cube>, slots: &[Slot], lr: f64, c: &FusedSgdConfig) -> Vec<Cube> {
    let momentum = c.momentum != 0.0;
    let mut ins = ins.into_iter().map(packed);
    let (mut outs, mut tensors, mut sizes) =
        (Vec::with_capacity(slots.len() * 2), Vec::with_capacity(slots.len() * 5), Vec::with_capacity(slots.len()));
    for slot in slots {
        let (p, g) = (ins.next().expect("a value"), ins.next().expect("a gradient"));
        let v = slot.has_velocity.then(|| ins.next().expect("a momentum buffer"));
        let p_out = empty_f32(&p, slot.shape.as_slice());
        let v_out = momentum.then(|| match &v {
            Some(v) if v.handle.can_mut() => v.clone(),
            _ => empty_f32(&p, slot.shape.as_slice()),
        });
        let v_out_or = v_out.clone().unwrap_or_else(|| p_out.clone());
        tensors.extend([p.clone(), g, v.unwrap_or_else(|| p.clone()), p_out.clone(), v_out_or]);
        sizes.push((slot.shape.num_elements(), !slot.has_velocity));
        outs.push(p_out);
        outs.extend(v_out);
    }
    let device = tensors[0].device.index;
    let factors = [lr as f32, c.momentum as f32, (1.0 - c.dampening) as f32, c.weight_decay as f32];
    let flags = [i32::from(momentum), i32::from(c.nesterov)];
    let refs: Vec<&Cube> = tensors.iter().collect();
    launch::launch(&refs, "fused_sgd", move |addresses, order| {
        // SAFETY: the addresses are live buffers of `device` held by `launch` until enqueued.
        unsafe {
            cudnn::with_handle(device, order, |s| enqueue(device, s.cu_stream(), addresses, &sizes, factors, flags))
        }
    })
    .unwrap_or_else(|e| panic!("fused SGD step: {e}"));
    UPDATES.fetch_add(slots.len(), Ordering::Relaxed);
    outs
}

/// Launches the kernel on `stream` over `addresses` (five per parameter: value, gradient,
/// buffer, new value, new buffer) in batches of [`SLOTS`] parameters.
///
/// # Safety
/// `addresses` are live f32 buffers of `device` of the given sizes; its context is bound.
unsafe fn enqueue(
    device: usize,
    stream: driver::CUstream,
    addresses: &[u64],
    sizes: &[(usize, bool)],
    factors: [f32; 4],
    flags: [i32; 2],
) -> Result<()> {
    let f = KERNELS.function(device, c"fused_sgd")?;
    for (batch, (addr, size)) in addresses.chunks(5 * SLOTS).zip(sizes.chunks(SLOTS)).enumerate() {
        let mut slots = [SlotArg::default(); SLOTS];
        for (slot, (a, &(n, first))) in slots.iter_mut().zip(addr.chunks(5).zip(size)) {
            let n = u32::try_from(n).map_err(|_| Error::Kernel {
                op: "fused SGD",
                reason: format!("a parameter of {n} elements (at most 2^32 - 1)"),
            })?;
            *slot = SlotArg { p: a[0], g: a[1], v: a[2], p_out: a[3], v_out: a[4], n, first: u32::from(first) };
        }
        let longest = size.iter().map(|&(n, _)| n).max().unwrap_or(0);
        let blocks_x = longest.div_ceil(256).clamp(1, 256) as u32;
        let [mut lr, mut mu, mut keep, mut decay] = factors;
        let [mut momentum, mut nesterov] = flags;
        let mut params = [
            slots.as_mut_ptr() as *mut c_void,
            &mut lr as *mut f32 as *mut c_void,
            &mut mu as *mut f32 as *mut c_void,
            &mut keep as *mut f32 as *mut c_void,
            &mut decay as *mut f32 as *mut c_void,
            &mut momentum as *mut i32 as *mut c_void,
            &mut nesterov as *mut i32 as *mut c_void,
        ];
        // SAFETY: the arguments match the entry's signature (a 64-slot batch by value, four
        // floats, two ints); the caller vouches for the addresses.
        unsafe { launch_256(f, (blocks_x, size.len() as u32), stream, &mut params) }
            .map_err(|e| Error::Kernel { op: "fused SGD", reason: format!("launching batch {batch}: {e:?}") })?;
    }
    Ok(())
}
