//! A batch of encoded images to a burn-cuda tensor, in two parts. [`start`], on the data
//! loader's thread ahead of the step: nvJPEG decodes the JPEGs into device memory
//! (`cuda::nvjpeg`) on the decoder's own stream, overlapping the training steps already queued,
//! and the other images' RGB bytes are copied next to them. [`to_device`], on the training
//! thread: one kernel (`cuda::kernels::crop_resize`) crops, resizes, mirrors and normalises
//! every image into the batch on cuDNN's stream, after the decode and ordered with burn's like
//! a cuDNN computation (`cuda::runtime::launch::launch`), so neither thread waits for the GPU.

use crate::error::{Error, Result};
use crate::nn::crop::{CropResize, Normalize, Pixels};
use crate::nn::cuda::cudnn::convolution as cudnn;
use crate::nn::cuda::kernels::crop_resize::{self, Crop, Target};
use crate::nn::cuda::kernels::pixel_ops;
use crate::nn::cuda::nvjpeg::{self, Input};
use crate::nn::cuda::runtime::launch::{Ad, Inner, Prim, cast, cuda_backend, launch, register};
use burn::prelude::*;
use burn::tensor::{DType, TensorPrimitive};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
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

/// The index of `device` (a burn-cuda device) and the nvJPEG backend that decodes there (its
/// decoder set up now), or why none can.
pub(crate) fn backend<B: Backend>(device: &B::Device) -> Result<(usize, nvjpeg::Backend)> {
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
    Ok((index, nvjpeg::backend(index)?))
}

/// A batch whose decode was submitted to a device's decoder, to be cropped into a tensor by
/// [`to_device`].
pub(crate) struct Started {
    device: usize,
    submitted: nvjpeg::Submitted,
    crops: Vec<Crop>,
    out_hw: [usize; 2],
    norm: Normalize,
    /// Each image's crop and pixel operations (its encoded bytes are with the decoder, which
    /// keeps them until their decode has ended).
    images: Vec<CropResize>,
}

/// Submits `images`' decode on `device`'s decoder (its own stream) from this thread, after the
/// batch two submissions back was read: called by a data loader's thread, ahead of the step.
pub(crate) fn start(
    device: usize,
    mut images: Vec<CropResize>,
    out_hw: [usize; 2],
    norm: Normalize,
) -> Result<Started> {
    cudnn::context(device)?.bind_to_thread().map_err(|e| cudnn::fail("binding the CUDA context", e))?;
    let jpeg = nvjpeg::device_jpeg(device)?;
    // The encoded bytes go to the decoder, which keeps them until their decode has ended.
    let encoded: Vec<(Pixels, [u32; 2])> =
        images.iter_mut().map(|c| (std::mem::replace(&mut c.pixels, Pixels::Rgb(Vec::new())), c.size)).collect();
    let jpegs = encoded.iter().filter(|(p, _)| matches!(p, Pixels::Jpeg(_))).count() as u64;
    fn inputs(encoded: &[(Pixels, [u32; 2])]) -> Vec<Input<'_>> {
        encoded
            .iter()
            .map(|(p, size)| Input {
                jpeg: matches!(p, Pixels::Jpeg(_)),
                bytes: p.bytes(),
                width: size[0],
                height: size[1],
            })
            .collect()
    }
    // SAFETY: the device's context is bound above.
    let submitted = unsafe { jpeg.submit(encoded, |e| inputs(e)) }?;
    let failed = submitted.failed as u64;
    DECODED.fetch_add(jpegs - failed, Ordering::Relaxed);
    if failed > 0 {
        FAILED.fetch_add(failed, Ordering::Relaxed);
        log::warn!("nvJPEG could not decode {failed} of a batch's {jpegs} JPEGs; their images are black");
    }
    let crops: Vec<Crop> = images
        .iter()
        .zip(&submitted.planes)
        .map(|(c, &pixels)| Crop { pixels, size: c.size, region: c.region, flip: c.flip })
        .collect();
    Ok(Started { device, submitted, crops, out_hw, norm, images })
}

impl Started {
    /// Images in the batch.
    pub(crate) fn len(&self) -> usize {
        self.crops.len()
    }
}

/// The started batch as a `[n, 3, h, w]` f32 tensor on `device`, the burn-cuda device it was
/// started on.
pub(crate) fn to_device<B: Backend>(started: Started, device: &B::Device) -> Result<Tensor<B, 4>> {
    let elsewhere = |on: String| Error::Kernel {
        op: "JPEG decode on the GPU",
        reason: format!("a batch decoded on GPU {} cannot become a tensor on {on}", started.device),
    };
    let Some(ad) = cuda_backend::<B>() else { return Err(elsewhere("another backend".into())) };
    let device: CudaDevice = cast(device.clone());
    if device.index != started.device {
        return Err(elsewhere(format!("GPU {}", device.index)));
    }
    let [h, w] = started.out_hw;
    let shape = [started.crops.len(), 3, h, w];
    let client = CudaRuntime::client(&device);
    let out = empty_device_contiguous_dtype::<CudaRuntime>(
        client.clone(),
        device.clone(),
        Shape::from(shape.to_vec()),
        DType::F32,
    );
    let index = device.index;
    let augmented = started.images.iter().any(|c| !c.ops.is_empty());
    if augmented && !pixel_ops::available() {
        return Err(Error::Kernel {
            op: "pixel operations on the GPU",
            reason: "their kernel does not compile (NVRTC); use --decode cpu".into(),
        });
    }
    // With pixel operations: the 8-bit crops and a spare buffer of their size, and each image's
    // program, uploaded through burn's stream.
    let scratch = augmented.then(|| {
        let programs = crate::nn::pixel_ops::kernel_programs(started.images.iter().map(|c| &c.ops));
        let bytes = Shape::new([2 * shape[0] * 3 * h * w]);
        let crops = empty_device_contiguous_dtype::<CudaRuntime>(client.clone(), device.clone(), bytes, DType::U8);
        let handle = client.create_from_slice(&programs);
        let programs =
            CubeTensor::new_contiguous(client.clone(), device.clone(), Shape::new([programs.len()]), handle, DType::U8);
        (crops, programs)
    });
    let mut tensors = vec![&out];
    tensors.extend(scratch.iter().flat_map(|(crops, programs)| [crops, programs]));
    let (n, hw) = (shape[0], [h as u32, w as u32]);
    // SAFETY: `launch` orders the work after burn's last use of the outputs' memory and before
    // their first reader; the decoder's memory is reused only after the stream is past this batch.
    launch(&tensors, ("decode", n, augmented), move |p, order| unsafe {
        cudnn::with_handle(index, order, |s| {
            let cu = s.cu_stream();
            let Started { submitted, crops, norm, .. } = started;
            submitted.wait_on(cu)?;
            let made = if augmented {
                let (bytes, spare) = (p[1], p[1] + (n * 3 * hw[0] as usize * hw[1] as usize) as u64);
                crop_resize::crop_resize(index, cu, &crops, bytes, hw, Target::Bytes).and_then(|()| {
                    pixel_ops::pixel_ops(index, cu, n, p[2], (bytes, spare), p[0], hw, (norm.mean, norm.std))
                })
            } else {
                crop_resize::crop_resize(
                    index,
                    cu,
                    &crops,
                    p[0],
                    hw,
                    Target::Normalized { mean: norm.mean, std: norm.std },
                )
            };
            // The slot is released after the kernels (or at once, when one failed to launch).
            submitted.consumed(cu)?;
            made
        })
    })?;
    drop(scratch);
    // cubecl's queue hands tasks to the device thread in batches: without a flush the job, and
    // the slot it frees, could wait for work that only comes after the next batch — which the
    // loader's thread cannot start before the slot is free.
    crate::nn::cuda::runtime::device_thread::flush(&device);
    let fusion = burn_fusion::get_client::<Inner>(&device);
    let prim: Prim = register(&fusion, out);
    let t = Tensor::<Cuda, 4>::from_primitive(TensorPrimitive::Float(prim));
    Ok(if ad { cast(Tensor::<Ad, 4>::from_inner(t)) } else { cast(t) })
}
