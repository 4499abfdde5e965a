//! `FusedAdamW`'s step (adamw.rs) on burn-cuda, as PyTorch's `AdamW(fused=True)`: the f32
//! parameters of one device are updated by a single burn-fusion operation
//! ([`fusion_op::queue`]) that hands every parameter's addresses to one CUDA kernel, launched in
//! batches of up to [`SLOTS`] parameters on cuDNN's stream, ordered with burn's like every cuDNN
//! call ([`launch::launch`]) — the same machinery as `FusedSgd`'s (`ops::sgd`). The moments are
//! updated in place when the step holds the only reference to them.
//!
//! The kernel is CUDA C compiled by NVRTC once per process ([`crate::nn::cuda::kernels::nvrtc`]);
//! when that fails, a warning says so and burn's operations run instead.

use crate::error::{Error, Result};
use crate::nn::cuda::cudnn::convolution as cudnn;
use crate::nn::cuda::kernels::nvrtc::{Kernels, launch_256};
use crate::nn::cuda::runtime::fusion_op::{self, Cube, packed};
use crate::nn::cuda::runtime::launch::{self, Prim, by_device, cast, cuda_backend, empty_f32};
use crate::nn::optim::adamw_rule::{Done, Entry, FusedAdamWConfig, Moments, corrections};
use burn::module::ParamId;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape};
use cudarc::driver::sys as driver;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Parameters per launch: their addresses and factors fill 3.4 KiB of the 4 KiB kernel-argument
/// space.
const SLOTS: usize = 48;

const KERNEL: &str = r#"
struct Slot { const float* p; const float* g; const float* m; const float* v; float* p_out; float* m_out; float* v_out;
              unsigned int n; unsigned int first; float c1; float c2; };
struct Batch { Slot s[48]; };
// burn's AdamW: m = b1*m + (1-b1)*g, v = b2*v + (1-b2)*g*g (from zero on the first step),
// p_out = p*keep - lr * (m/c1) / (sqrt(v/c2) + eps), keep = 1 - lr*decay, c1 and c2 the bias
// corrections of the parameter's step. Block row y is parameter y of the batch; m and v may
// alias m_out and v_out (in place).
extern "C" __global__ void fused_adamw(const Batch b, float lr, float b1, float b2, float eps, float keep) {
    const Slot s = b.s[blockIdx.y];
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < s.n; i += gridDim.x * blockDim.x) {
        float g = s.g[i];
        float m = s.first ? (1.0f - b1) * g : b1 * s.m[i] + (1.0f - b1) * g;
        float v = s.first ? (1.0f - b2) * (g * g) : b2 * s.v[i] + (1.0f - b2) * (g * g);
        s.m_out[i] = m;
        s.v_out[i] = v;
        float delta = (m / s.c1) / (sqrtf(v / s.c2) + eps);
        s.p_out[i] = s.p[i] * keep - lr * delta;
    }
}
"#;

/// One parameter of a launch, as the kernel's `Slot` reads it.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SlotArg {
    p: u64,
    g: u64,
    m: u64,
    v: u64,
    p_out: u64,
    m_out: u64,
    v_out: u64,
    n: u32,
    first: u32,
    c1: f32,
    c2: f32,
}

/// Parameters updated by the kernel so far (read by `adamw::fused_updates`).
pub(crate) static UPDATES: AtomicUsize = AtomicUsize::new(0);

static KERNELS: Kernels = Kernels::new("fused AdamW", KERNEL);

/// What each parameter contributes to the operation's inputs and outputs.
#[derive(Clone)]
struct Slot {
    id: ParamId,
    shape: Shape,
    /// The step this one is for, counted from 1 (1: no moments yet).
    time: usize,
}

/// Updates the entries this path takes (burn-cuda, f32 value, gradient and moments, NVRTC
/// working) as one operation per device; returns their results and the entries left for burn's
/// operations.
pub(crate) fn update<B: Backend>(
    entries: Vec<Entry<B>>,
    lr: f64,
    c: &FusedAdamWConfig,
) -> (Vec<Done<B>>, Vec<Entry<B>>) {
    if cuda_backend::<B>() != Some(false) || entries.is_empty() || KERNELS.ptx().is_none() {
        return (Vec::new(), entries);
    }
    let f32s = |e: &Entry<B>| {
        let moments = e.state.iter().flat_map(|s| [&s.m, &s.v]);
        [&e.param, &e.grad]
            .into_iter()
            .chain(moments)
            .all(|t| cast::<FloatTensor<B>, Prim>(t.clone()).dtype == DType::F32)
    };
    let (ours, rest): (Vec<_>, Vec<_>) = entries.into_iter().partition(f32s);
    let done = by_device::<B, _>(ours, |e: &Entry<B>| &e.param)
        .into_iter()
        .flat_map(|list| queue_group(list, lr, c))
        .map(|(id, p, m, v, time)| (id, cast(p), Some(Moments { m: cast(m), v: cast(v), time })))
        .collect();
    (done, rest)
}

/// One operation for `entries` (one device): inputs value, gradient [, m, v] per parameter;
/// outputs new value, m, v.
fn queue_group<B: Backend>(
    entries: Vec<Entry<B>>,
    lr: f64,
    c: &FusedAdamWConfig,
) -> Vec<(ParamId, Prim, Prim, Prim, usize)> {
    let mut inputs: Vec<Prim> = Vec::with_capacity(entries.len() * 4);
    let mut outputs = Vec::with_capacity(entries.len() * 3);
    let mut slots = Vec::with_capacity(entries.len());
    for e in entries {
        let param: Prim = cast(e.param);
        let shape = param.shape.clone();
        outputs.extend(std::iter::repeat_n((shape.clone(), DType::F32), 3));
        slots.push(Slot { id: e.id, shape, time: e.state.as_ref().map_or(1, |s| s.time + 1) });
        inputs.extend([param, cast(e.grad)]);
        if let Some(s) = e.state {
            inputs.extend([cast(s.m), cast(s.v)]);
        }
    }
    let (run_slots, c) = (slots.clone(), *c);
    let out = fusion_op::queue("fused_adamw", inputs, &outputs, move |ins| run(ins, &run_slots, lr, &c));
    let mut out = out.into_iter();
    let mut next = || out.next().expect("a new value and two moments per parameter");
    slots.into_iter().map(|s| (s.id, next(), next(), next(), s.time)).collect()
}

/// On burn-fusion's thread: the new values allocated (moments reused when only this step holds
/// them), then every parameter's update queued as one ordered computation.
fn run(ins: Vec<Cube>, slots: &[Slot], lr: f64, c: &FusedAdamWConfig) -> Vec<Cube> {
    let mut ins = ins.into_iter().map(packed);
    let (mut outs, mut tensors, mut args) =
        (Vec::with_capacity(slots.len() * 3), Vec::with_capacity(slots.len() * 7), Vec::with_capacity(slots.len()));
    for slot in slots {
        let (p, g) = (ins.next().expect("a value"), ins.next().expect("a gradient"));
        let first = slot.time == 1;
        let (m, v) = if first {
            (None, None)
        } else {
            (Some(ins.next().expect("a first moment")), Some(ins.next().expect("a second moment")))
        };
        let reuse = |t: &Option<Cube>| match t {
            Some(t) if t.handle.can_mut() => t.clone(),
            _ => empty_f32(&p, slot.shape.as_slice()),
        };
        let (p_out, m_out, v_out) = (empty_f32(&p, slot.shape.as_slice()), reuse(&m), reuse(&v));
        let placeholder = || p.clone();
        tensors.extend([
            p.clone(),
            g,
            m.unwrap_or_else(placeholder),
            v.unwrap_or_else(placeholder),
            p_out.clone(),
            m_out.clone(),
            v_out.clone(),
        ]);
        let (c1, c2) = corrections(c, slot.time);
        args.push((slot.shape.num_elements(), first, c1, c2));
        outs.extend([p_out, m_out, v_out]);
    }
    let device = tensors[0].device.index;
    let factors = [lr as f32, c.beta_1, c.beta_2, c.epsilon, (1.0 - lr * f64::from(c.weight_decay)) as f32];
    let refs: Vec<&Cube> = tensors.iter().collect();
    launch::launch(&refs, "fused_adamw", move |addresses, order| {
        // SAFETY: the addresses are live buffers of `device` held by `launch` until enqueued.
        unsafe { cudnn::with_handle(device, order, |s| enqueue(device, s.cu_stream(), addresses, &args, factors)) }
    })
    .unwrap_or_else(|e| panic!("fused AdamW step: {e}"));
    UPDATES.fetch_add(slots.len(), Ordering::Relaxed);
    outs
}

/// Launches the kernel on `stream` over `addresses` (seven per parameter: value, gradient, m,
/// v, new value, new m, new v) in batches of [`SLOTS`] parameters; `args` holds each
/// parameter's size, whether it is its first step, and its bias corrections.
///
/// # Safety
/// `addresses` are live f32 buffers of `device` of the given sizes; its context is bound.
unsafe fn enqueue(
    device: usize,
    stream: driver::CUstream,
    addresses: &[u64],
    args: &[(usize, bool, f32, f32)],
    factors: [f32; 5],
) -> Result<()> {
    let f = KERNELS.function(device, c"fused_adamw")?;
    for (batch, (addr, arg)) in addresses.chunks(7 * SLOTS).zip(args.chunks(SLOTS)).enumerate() {
        let mut slots = [SlotArg::default(); SLOTS];
        for (slot, (a, &(n, first, c1, c2))) in slots.iter_mut().zip(addr.chunks(7).zip(arg)) {
            let n = u32::try_from(n).map_err(|_| Error::Kernel {
                op: "fused AdamW",
                reason: format!("a parameter of {n} elements (at most 2^32 - 1)"),
            })?;
            *slot = SlotArg {
                p: a[0],
                g: a[1],
                m: a[2],
                v: a[3],
                p_out: a[4],
                m_out: a[5],
                v_out: a[6],
                n,
                first: u32::from(first),
                c1,
                c2,
            };
        }
        let longest = arg.iter().map(|&(n, ..)| n).max().unwrap_or(0);
        let blocks_x = longest.div_ceil(256).clamp(1, 256) as u32;
        let [mut lr, mut b1, mut b2, mut eps, mut keep] = factors;
        let mut params = [
            slots.as_mut_ptr() as *mut c_void,
            &mut lr as *mut f32 as *mut c_void,
            &mut b1 as *mut f32 as *mut c_void,
            &mut b2 as *mut f32 as *mut c_void,
            &mut eps as *mut f32 as *mut c_void,
            &mut keep as *mut f32 as *mut c_void,
        ];
        // SAFETY: the arguments match the entry's signature (a 48-slot batch by value, five
        // floats); the caller vouches for the addresses.
        unsafe { launch_256(f, (blocks_x, arg.len() as u32), stream, &mut params) }
            .map_err(|e| Error::Kernel { op: "fused AdamW", reason: format!("launching batch {batch}: {e:?}") })?;
    }
    Ok(())
}
