//! Proof by equivalence: DataParallel over N devices (threads) gives the same parameters after
//! k SGD steps (momentum, weight decay) as one device with the same batch, including batches
//! that do not split evenly.

mod common;

use burn::tensor::backend::Backend;
use burn_autodiff::Autodiff;
use burn_ddp::data_parallel::DataParallel;
use burn_ddp::params::{flat_values, max_relative_diff};
use burn_flex::Flex;
use burn_nn::loss::CrossEntropyLossConfig;
use burn_optim::decay::WeightDecayConfig;
use burn_optim::momentum::MomentumConfig;
use burn_optim::{GradientsParams, Optimizer, SgdConfig};
use common::mlp::{Mlp, batch};

type B = Autodiff<Flex>;
const STEPS: usize = 3;

static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn optimizer() -> impl Optimizer<Mlp<B>, B> {
    SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_momentum(0.9).with_dampening(0.0)))
        .with_weight_decay(Some(WeightDecayConfig::new(5e-3)))
        .init::<B, Mlp<B>>()
}

fn equivalence(devices: usize, batch_size: usize) {
    let device: burn::tensor::Device<B> = Default::default();
    // Lazily initialised parameters are drawn when first read: read them once, so the two runs
    // (and the replicas) start from the same values.
    // The initialisation is seeded (under a lock: the backend's generator is global to the
    // process and the tests run side by side), so the comparison is the same on every run.
    let init = {
        let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
        B::seed(&device, 1000);
        let init = Mlp::<B>::new(&device);
        let _ = flat_values(&init);
        init
    };
    let loss_fn = CrossEntropyLossConfig::new().init(&device);

    let mut single = init.clone();
    let mut optim = optimizer();
    for s in 0..STEPS {
        let (x, y) = batch(s * batch_size..(s + 1) * batch_size, &device);
        let grads = GradientsParams::from_grads(loss_fn.forward(single.forward(x), y).backward(), &single);
        single = optim.step(0.1, single, grads);
    }

    let dp = DataParallel::<B>::new(vec![device; devices]);
    let mut model = init.clone();
    let mut optim = optimizer();
    for s in 0..STEPS {
        let (x, y) = batch(s * batch_size..(s + 1) * batch_size, &device);
        let (xs, ys) = (dp.scatter(x), dp.scatter(y));
        let out = dp.step(model, batch_size, |replica: Mlp<B>, i, dev| {
            (
                CrossEntropyLossConfig::new().init(dev).forward(replica.forward(xs[i].clone()), ys[i].clone()),
                xs[i].dims()[0],
            )
        });
        assert_eq!(out.outputs.iter().sum::<usize>(), batch_size, "every row on exactly one device");
        assert!(out.loss.is_finite());
        model = optim.step(0.1, out.model, out.grads);
    }
    let (a, b) = (flat_values(&model), flat_values(&single));
    assert!(max_relative_diff(&b, &flat_values(&init), 1e-6) > 1e-3, "training must move the parameters");
    let diff = max_relative_diff(&a, &b, 1e-6);
    assert!(diff < 1e-5, "{devices} devices, batch {batch_size}: max relative difference {diff} from one device");
    eprintln!("{devices} devices, batch {batch_size}: max relative difference {diff:e} from one device");
}

#[test]
fn data_parallel_2_devices_equals_one_device() {
    equivalence(2, 8);
}

#[test]
fn data_parallel_3_devices_uneven_split_equals_one_device() {
    equivalence(3, 10);
}
