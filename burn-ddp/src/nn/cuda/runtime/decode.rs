//! A batch of encoded images to a burn-cuda tensor: nvJPEG decodes the JPEGs into device memory
//! (`cuda::nvjpeg`) on the decoder's own stream, overlapping the training step already queued,
//! the other images' RGB bytes are copied next to them, and one kernel
//! (`cuda::kernels::crop_resize`) crops, resizes, mirrors and normalises every image into the
//! batch on cuDNN's stream, after the decode and ordered with burn's like a cuDNN computation
//! (`cuda::runtime::launch::launch`), so the training thread does not wait for it.

use crate::error::{Error, Result};
use crate::nn::crop::{CropResize, Normalize, Pixels};
use crate::nn::cuda::cudnn::convolution as cudnn;
use crate::nn::cuda::kernels::crop_resize::{self, Crop};
use crate::nn::cuda::nvjpeg::{self, Input};
use crate::nn::cuda::runtime::launch::{Ad, Inner, Prim, cast, cuda_backend, launch, register};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn_cuda::Cuda;
use cubecl::Runtime;
use cubecl::cuda::{CudaDevice, CudaRuntime};
use std::sync::atomic::{AtomicU64, Ordering};

static DECODED: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);

/// `(images decoded by nvJPEG, images nvJPEG could not decode)` in this process so far.
pub(crate) fn counts() -> (u64, u64) {
    (DECODED.load(Ordering::Relaxed), FAILED.load(Ordering::Relaxed))
}

/// Which nvJPEG backend decodes on `device` (a burn-cuda device), or why none can.
pub(crate) fn backend<B: Backend>(device: &B::Device) -> Result<nvjpeg::Backend> {
    cuda_backend::<B>().ok_or_else(|| Error::Kernel {
        op: "JPEG decode on the GPU",
        reason: "the model does not train on a CUDA GPU (burn-cuda)".into(),
    })?;
    let index = cast::<B::Device, CudaDevice>(device.clone()).index;
    if !crop_resize::available() {
        return Err(Error::Kernel {
            op: "JPEG decode on the GPU",
            reason: "the resize kernel does not compile".into(),
        });
    }
    cudnn::context(index)?.bind_to_thread().map_err(|e| cudnn::fail("binding the CUDA context", e))?;
    nvjpeg::backend(index)
}

/// The batch as a `[n, 3, h, w]` f32 tensor on `device` (burn-cuda, checked by the caller).
pub(crate) fn to_device<B: Backend>(
    images: Vec<CropResize>,
    out_hw: [usize; 2],
    norm: Normalize,
    device: &B::Device,
) -> Result<Tensor<B, 4>> {
    let ad = cuda_backend::<B>().expect("checked by the caller");
    // The decoder is made here, not in the job below: making it takes the device state's lock,
    // which the job holds.
    backend::<B>(device)?;
    let device: CudaDevice = cast(device.clone());
    let shape = [images.len(), 3, out_hw[0], out_hw[1]];
    let client = CudaRuntime::client(&device);
    let out = burn_cubecl::ops::numeric::empty_device_contiguous_dtype::<CudaRuntime>(
        client,
        device.clone(),
        Shape::from(shape.to_vec()),
        burn::tensor::DType::F32,
    );
    let index = device.index;
    let hw = [out_hw[0] as u32, out_hw[1] as u32];
    // SAFETY: `launch` orders the work after burn's last use of the output's memory and before
    // its first reader; the decoder's memory is reused only after the stream is past this batch.
    launch(&[&out], ("decode", images.len()), move |p, order| unsafe {
        cudnn::with_handle(index, order, |s| {
            let inputs: Vec<Input<'_>> = images
                .iter()
                .map(|c| Input {
                    jpeg: matches!(c.pixels, Pixels::Jpeg(_)),
                    bytes: c.pixels.bytes(),
                    width: c.size[0],
                    height: c.size[1],
                })
                .collect();
            let cu = s.stream().cu_stream();
            nvjpeg::with_decoder(index, |d| {
                let (planes, failed, slot) = d.decode(cu, &inputs)?;
                let jpegs = inputs.iter().filter(|i| i.jpeg).count() as u64;
                DECODED.fetch_add(jpegs - failed as u64, Ordering::Relaxed);
                if failed > 0 {
                    FAILED.fetch_add(failed as u64, Ordering::Relaxed);
                    log::warn!("nvJPEG could not decode {failed} of a batch's {jpegs} JPEGs; their pixels are zero");
                }
                let crops: Vec<Crop> = images
                    .iter()
                    .zip(&planes)
                    .map(|(c, plane)| Crop {
                        at: plane.at,
                        pitch: plane.pitch,
                        size: c.size,
                        region: c.region,
                        flip: c.flip,
                    })
                    .collect();
                let made = crop_resize::crop_resize(index, cu, &crops, p[0], hw, (norm.mean, norm.std));
                // The slot is released after the kernel (or at once, when it failed to launch).
                d.consumed(slot, cu)?;
                made
            })
        })
    })?;
    let fusion = burn_fusion::get_client::<Inner>(&device);
    let prim: Prim = register(&fusion, out);
    let t = Tensor::<Cuda, 4>::from_primitive(TensorPrimitive::Float(prim));
    Ok(if ad { cast(Tensor::<Ad, 4>::from_inner(t)) } else { cast(t) })
}
