//! `bench-data --gpus N`: the input pipeline timed up to the GPU — every batch uploaded as
//! training uploads it (page-locked memory, burn-ddp's upload), the clock stopped once the
//! device holds them all.

use crate::data::loader::Batch;
use crate::data::source::LoadedData;
use crate::data::throughput::BatchSink;
use crate::data::throughput::DataBenchConfig;
use crate::data::throughput::DataBenchResult;
use crate::data::throughput::HostMemory;
use crate::data::throughput::loader_throughput;
use crate::error::{Error, Result};
use burn::prelude::*;

/// Uploads every batch to one device.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct OnDevice<B: Backend> {
    device: B::Device,
    name: String,
    /// The device's decoder when it decodes the JPEGs (`--decode`, resolved).
    decoder: Option<burn_ddp::nn::decode::DeviceDecoder>,
}

impl<B: Backend> BatchSink for OnDevice<B> {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn take(&mut self, batch: Batch) {
        if let Err(e) = crate::train::inference::evaluate::batch_tensors::<B>(batch, &self.device) {
            log::error!("a batch did not reach {}: {e}", self.name);
        }
    }
    fn finish(&mut self) {
        let _ = B::sync(&self.device);
    }
    fn decoder(&self) -> Option<burn_ddp::nn::decode::DeviceDecoder> {
        self.decoder.clone()
    }
}

/// Times the loader delivering `data`'s batches to host memory, or to GPU `gpu`.
///
/// # Errors
/// As [`loader_throughput`]; a GPU that does not exist, or a build without CUDA.
pub fn bench_data(data: &LoadedData, config: &DataBenchConfig, gpu: Option<usize>) -> Result<DataBenchResult> {
    let Some(id) = gpu else {
        if config.decode == crate::data::decode::Decode::Gpu {
            return Err(Error::InvalidConfig {
                name: "--decode",
                value: "gpu".into(),
                reason: "the GPU decodes batches that go to it: add --gpus ID".into(),
            });
        }
        return loader_throughput(data, config, &mut HostMemory);
    };
    crate::train::check_gpus(&[id])?;
    on_gpu(data, config, id)
}

#[cfg(feature = "cuda")]
fn on_gpu(data: &LoadedData, config: &DataBenchConfig, id: usize) -> Result<DataBenchResult> {
    let device = crate::train::gpu(id);
    let pipeline = if config.eval { &data.eval } else { &data.train };
    let decoder =
        crate::data::decode::resolve::<burn_cuda::Cuda>(config.decode, pipeline, &*data.dataset, &device, true)?;
    loader_throughput(data, config, &mut OnDevice::<burn_cuda::Cuda> { device, name: format!("gpu {id}"), decoder })
}

#[cfg(not(feature = "cuda"))]
fn on_gpu(_: &LoadedData, _: &DataBenchConfig, _: usize) -> Result<DataBenchResult> {
    unreachable!("check_gpus fails without the cuda feature")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{DataSource, load_source};

    #[test]
    fn decode_gpu_without_a_gpu_says_to_add_one() {
        let data = load_source(&DataSource::Bundled, 28).unwrap();
        let config = DataBenchConfig {
            batch_size: 8,
            batches: 1,
            eval: false,
            seed: 0,
            prefetch: 1,
            decode: crate::data::decode::Decode::Gpu,
        };
        let e = bench_data(&data, &config, None).unwrap_err().to_string();
        assert!(e.contains("--gpus") && e.lines().count() == 1, "{e}");
        let host = DataBenchConfig { decode: crate::data::decode::Decode::Auto, ..config };
        assert_eq!(bench_data(&data, &host, None).unwrap().delivered_to, "host memory");
    }
}
