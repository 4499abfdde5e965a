//! A Burn model trained with burn-ddp's DDP, alone or under any launcher (README.md quotes this
//! file whole; a test keeps the two identical and runs it both ways).
use burn::prelude::*;
use burn::tensor::activation::relu;
use burn_autodiff::Autodiff;
use burn_ddp::{
    CommBackend, DistributedDataParallel, DistributedSampler, ProcessGroup, RendezvousConfig, init_process_group,
};
use burn_flex::Flex; // the CPU backend; burn_cuda::Cuda on GPUs
use burn_nn::loss::CrossEntropyLossConfig;
use burn_nn::{Linear, LinearConfig};
use burn_optim::{Optimizer, SgdConfig};

type B = Autodiff<Flex>;

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    hidden: Linear<B>,
    out: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        Self { hidden: LinearConfig::new(2, 32).init(device), out: LinearConfig::new(32, 2).init(device) }
    }
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.out.forward(relu(self.hidden.forward(x)))
    }
}

/// Sample `i`, the same on every rank: a point of [-1, 1]², labelled 1 inside a circle.
fn sample(i: usize) -> ([f32; 2], i64) {
    let h = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let unit = |bits: u64| (bits & 0xFF_FFFF) as f32 / 0x80_0000 as f32 - 1.0;
    let (a, b) = (unit(h >> 40), unit(h >> 16));
    ([a, b], i64::from(a * a + b * b < 0.5))
}

fn batch(indices: &[usize], device: &Device<B>) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let (points, labels): (Vec<[f32; 2]>, Vec<i64>) = indices.iter().map(|&i| sample(i)).unzip();
    let x = Tensor::from_data(TensorData::new(points.concat(), [indices.len(), 2]), device);
    (x, Tensor::from_data(TensorData::new(labels, [indices.len()]), device))
}

fn main() -> burn_ddp::Result<()> {
    // The launcher's variables (burn-ddp launch, torchrun, srun, mpirun), or a world of one.
    let config = RendezvousConfig::from_env_or_single_process()?;
    let pg = init_process_group(CommBackend::Tcp, &config)?; // CommBackend::Nccl on GPUs
    let ddp = DistributedDataParallel::new(pg.clone(), Default::default());
    let device = Default::default();
    let mut model = ddp.broadcast_module(Mlp::<B>::new(&device))?; // rank 0's weights everywhere
    let mut optim = SgdConfig::new().init();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut sampler = DistributedSampler::new(8192, pg.world_size(), pg.rank());
    for epoch in 0..8 {
        sampler.set_epoch(epoch); // a new shuffle each epoch, each rank its own share
        let mut losses = Vec::new();
        for indices in sampler.indices().chunks(32) {
            let (x, y) = batch(indices, &device);
            let step = ddp.step(&model)?; // opened before the forward pass
            let loss = loss_fn.forward(model.forward(x), y);
            losses.push(loss.clone().into_scalar().elem::<f32>());
            let grads = step.backward(loss, &model)?; // averaged over every rank
            model = optim.step(0.5, model, grads);
        }
        let mean = losses.iter().sum::<f32>() / losses.len() as f32;
        println!("rank {}/{} epoch {epoch}: loss {mean:.4}", pg.rank(), pg.world_size());
    }
    let held_out: Vec<usize> = (1_000_000..1_002_000).collect();
    let (x, y) = batch(&held_out, &device);
    let correct: i64 = model.forward(x).argmax(1).squeeze_dim::<1>(1).equal(y).int().sum().into_scalar().elem();
    println!("rank {}: held-out accuracy {:.4}", pg.rank(), correct as f64 / held_out.len() as f64);
    Ok(())
}
