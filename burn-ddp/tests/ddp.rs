//! Proof by equivalence: DDP with N ranks and batch b per rank gives the same parameters after k
//! SGD steps (momentum, weight decay) as one process with batch N·b. Ranks initialise with
//! different seeds, so the broadcast from rank 0 is part of what is tested.

mod common;

use burn::module::AutodiffModule;
use burn::prelude::*;
use burn_autodiff::Autodiff;
use burn_ddp::params::{flat_values, max_relative_diff};
use burn_ddp::{
    CommBackend, DdpConfig, DistributedDataParallel, Error, ProcessGroup, RendezvousConfig, init_process_group,
};
use burn_flex::Flex;
use burn_nn::loss::CrossEntropyLossConfig;
use burn_optim::decay::WeightDecayConfig;
use burn_optim::momentum::MomentumConfig;
use burn_optim::{GradientsParams, Optimizer, SgdConfig};
use common::mlp::Mlp;
use common::vit_block::VitBlock;
use common::{assert_all_ok, is_worker, spawn};

type B = Autodiff<Flex>;
const PER_RANK: usize = 4;
const STEPS: usize = 3;

fn batch(rows: std::ops::Range<usize>, device: &burn::tensor::Device<B>) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    common::mlp::batch::<B>(rows, device)
}

/// A classifier of the rows of `common::mlp::batch`: the MLP, or a ViT block.
trait RowModel: AutodiffModule<B> + 'static {
    fn init(device: &burn::tensor::Device<B>) -> Self;
    fn logits(&self, x: Tensor<B, 2>) -> Tensor<B, 2>;
}

impl RowModel for Mlp<B> {
    fn init(device: &burn::tensor::Device<B>) -> Self {
        Mlp::new(device)
    }
    fn logits(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.forward(x)
    }
}

impl RowModel for VitBlock<B> {
    fn init(device: &burn::tensor::Device<B>) -> Self {
        VitBlock::new(device)
    }
    fn logits(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.forward(x)
    }
}

/// Trains `STEPS` steps; `rows_of(step)` picks this process's rows; `sync` averages gradients.
fn train<M: RowModel>(
    mut model: M,
    rows_of: impl Fn(usize) -> std::ops::Range<usize>,
    sync: impl Fn(&M, GradientsParams) -> GradientsParams,
) -> M {
    let device = Default::default();
    let mut optim = SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_momentum(0.9).with_dampening(0.0)))
        .with_weight_decay(Some(WeightDecayConfig::new(5e-3)))
        .init::<B, M>();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    for step in 0..STEPS {
        let (x, y) = batch(rows_of(step), &device);
        let loss = loss_fn.forward(model.logits(x), y);
        let grads = sync(&model, GradientsParams::from_grads(loss.backward(), &model));
        model = optim.step(0.1, model, grads);
    }
    model
}

/// The parameters a worker printed on its `PARAMS` line.
fn printed_params(r: usize, o: &std::process::Output) -> Vec<f32> {
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text
        .lines()
        .find_map(|l| l.split_once("PARAMS ").map(|(_, p)| p))
        .unwrap_or_else(|| panic!("rank {r} printed no parameters: {text}"));
    serde_json::from_str(line).unwrap()
}

/// Each rank's printed `PARAMS` against the single-process parameters (within 1e-5 relative).
fn assert_ranks_match(outs: &[std::process::Output], single: &[f32]) {
    for (r, o) in outs.iter().enumerate() {
        let params = printed_params(r, o);
        let diff = max_relative_diff(&params, single, 1e-6);
        assert!(diff < 1e-5, "rank {r}: max relative difference {diff} from single-process training");
        eprintln!(
            "rank {r}: {} parameters, max relative difference {diff:e} from single-process training",
            params.len()
        );
    }
}

static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn equivalence<M: RowModel>(test: &str, world: usize) {
    let device = Default::default();
    if is_worker() {
        let pg = init_process_group(CommBackend::Tcp, &RendezvousConfig::from_env().unwrap()).unwrap();
        let (rank, w) = (pg.rank(), pg.world_size());
        B::seed(&device, 1000 + rank as u64); // deliberately different initialisations
        let ddp = DistributedDataParallel::new(pg, DdpConfig { bucket_bytes: 256, ..DdpConfig::default() });
        let model = ddp.broadcast_module(M::init(&device)).unwrap();
        let global = w * PER_RANK;
        let model = train(
            model,
            |s| s * global + rank * PER_RANK..s * global + (rank + 1) * PER_RANK,
            |m, g| ddp.sync_gradients(m, g).unwrap(),
        );
        let stats = ddp.stats();
        assert_eq!(stats.steps, STEPS);
        assert!(stats.buckets > STEPS, "a 256-byte bucket limit must split the gradients");
        println!("PARAMS {}", serde_json::to_string(&flat_values(&model)).unwrap());
        return;
    }
    let outs = spawn(test, world, &(0..world).collect::<Vec<_>>(), &[]);
    assert_all_ok(test, &outs);
    // One process, batch N·b, rank 0's initialisation. The backend's generator is global to the
    // process and the two tests run side by side: seed and draw under one lock.
    let _init = INIT.lock().unwrap_or_else(|e| e.into_inner());
    B::seed(&device, 1000);
    let global = world * PER_RANK;
    let single = flat_values(&train(M::init(&device), |s| s * global..(s + 1) * global, |_, g| g));
    let initial = {
        B::seed(&device, 1000);
        flat_values(&M::init(&device))
    };
    assert!(max_relative_diff(&single, &initial, 1e-6) > 1e-3, "training must move the parameters");
    assert_ranks_match(&outs, &single);
}

/// Gradient accumulation: each rank runs its b rows as `MICRO` micro-batches through
/// `no_sync` (loss scaled by 1/MICRO) and syncs once per step — still one process with N·b.
const MICRO: usize = 2;

#[test]
fn ddp_no_sync_accumulation_equals_one_process_with_the_global_batch() {
    let test = "ddp_no_sync_accumulation_equals_one_process_with_the_global_batch";
    let device = Default::default();
    let world = 2;
    if is_worker() {
        let pg = init_process_group(CommBackend::Tcp, &RendezvousConfig::from_env().unwrap()).unwrap();
        let rank = pg.rank();
        B::seed(&device, 1000 + rank as u64);
        let ddp = DistributedDataParallel::new(pg, DdpConfig::default());
        let mut model = ddp.broadcast_module(Mlp::<B>::new(&device)).unwrap();
        let mut optim = SgdConfig::new()
            .with_momentum(Some(MomentumConfig::new().with_momentum(0.9).with_dampening(0.0)))
            .with_weight_decay(Some(WeightDecayConfig::new(5e-3)))
            .init::<B, Mlp<B>>();
        let loss_fn = CrossEntropyLossConfig::new().init(&device);
        let global = world * PER_RANK;
        let micro = PER_RANK / MICRO;
        for step in 0..STEPS {
            let mut acc = burn_optim::GradientsAccumulator::new();
            for m in 0..MICRO {
                let start = step * global + rank * PER_RANK + m * micro;
                let (x, y) = batch(start..start + micro, &device);
                let loss = loss_fn.forward(model.forward(x), y) / MICRO as f32;
                ddp.no_sync(&mut acc, &model, GradientsParams::from_grads(loss.backward(), &model));
            }
            let synced_before = ddp.stats().steps;
            let grads = ddp.sync_gradients(&model, acc.grads()).unwrap();
            assert_eq!(ddp.stats().steps, synced_before + 1, "one sync per optimiser step");
            model = optim.step(0.1, model, grads);
        }
        assert_eq!(ddp.stats().steps, STEPS);
        println!("PARAMS {}", serde_json::to_string(&flat_values(&model)).unwrap());
        return;
    }
    let outs = spawn(test, world, &[0, 1], &[]);
    assert_all_ok(test, &outs);
    let _init = INIT.lock().unwrap_or_else(|e| e.into_inner());
    B::seed(&device, 1000);
    let global = world * PER_RANK;
    let single = flat_values(&train(Mlp::<B>::new(&device), |s| s * global..(s + 1) * global, |_, g| g));
    assert_ranks_match(&outs, &single);
}

/// Two `burn-ddp launch --nnodes 2` on this machine (node ranks 0 and 1, two processes each)
/// form one world of 4 whose training equals one process with 4× the batch.
#[test]
fn ddp_2_nodes_of_2_ranks_equal_one_process_with_the_global_batch() {
    let test = "ddp_2_nodes_of_2_ranks_equal_one_process_with_the_global_batch";
    if is_worker() {
        return equivalence::<Mlp<B>>(test, 4);
    }
    let port = burn_ddp::launch::free_port_pair().unwrap().to_string();
    let exe = std::env::current_exe().unwrap();
    let nodes: Vec<_> = (0..2)
        .map(|node| {
            std::process::Command::new(env!("CARGO_BIN_EXE_burn-ddp"))
                .args([
                    "launch",
                    "--nnodes",
                    "2",
                    "--node-rank",
                    &node.to_string(),
                    "--master-addr",
                    "127.0.0.1",
                    "--master-port",
                    &port,
                    "--nproc-per-node",
                    "2",
                    "--",
                ])
                .arg(&exe)
                .args([test, "--exact", "--nocapture", "--test-threads=1"])
                .env("BURN_DDP_TEST_ROLE", "worker")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<_> = nodes.into_iter().map(|n| n.wait_with_output().unwrap()).collect();
    assert_all_ok(test, &outs);
    // Each launcher prefixes its ranks' lines with `[rank r]`: one PARAMS line per global rank.
    let text: String = outs.iter().map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).collect();
    let ranks: Vec<std::process::Output> = (0..4)
        .map(|r| {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("[rank {r}] ")) && l.contains("PARAMS "))
                .unwrap_or_else(|| panic!("no PARAMS from rank {r}:\n{text}"));
            std::process::Output {
                status: outs[0].status,
                stdout: line.split_once("] ").unwrap().1.as_bytes().to_vec(),
                stderr: Vec::new(),
            }
        })
        .collect();
    let device = Default::default();
    let _init = INIT.lock().unwrap_or_else(|e| e.into_inner());
    B::seed(&device, 1000);
    let single = flat_values(&train(Mlp::<B>::new(&device), |s| s * 4 * PER_RANK..(s + 1) * 4 * PER_RANK, |_, g| g));
    assert_ranks_match(&ranks, &single);
}

#[test]
fn ddp_2_ranks_equals_one_process_with_the_global_batch() {
    equivalence::<Mlp<B>>("ddp_2_ranks_equals_one_process_with_the_global_batch", 2);
}

/// A ViT block (LayerNorm, attention through `nn::attention`, GELU MLP, `nn::linear`): DDP
/// is exact for it as for the MLP.
#[test]
fn ddp_2_ranks_of_a_vit_block_equal_one_process_with_the_global_batch() {
    equivalence::<VitBlock<B>>("ddp_2_ranks_of_a_vit_block_equal_one_process_with_the_global_batch", 2);
}

#[test]
fn ddp_3_ranks_equals_one_process_with_the_global_batch() {
    equivalence::<Mlp<B>>("ddp_3_ranks_equals_one_process_with_the_global_batch", 3);
}

/// The MLP with an extra head that only some ranks use.
#[derive(burn::module::Module, Debug)]
struct TwoHeads<B: Backend> {
    body: Mlp<B>,
    extra: burn_nn::Linear<B>,
}

impl<B: Backend> TwoHeads<B> {
    fn new(device: &B::Device) -> Self {
        Self { body: Mlp::new(device), extra: burn_nn::LinearConfig::new(3, 3).init(device) }
    }
    fn forward(&self, x: Tensor<B, 2>, use_extra: bool) -> Tensor<B, 2> {
        let y = self.body.forward(x);
        if use_extra { y.clone() + self.extra.forward(y) } else { y }
    }
}

/// One step where only rank 1 uses `extra`; prints the outcome and, when it succeeds, the
/// parameters after an SGD step.
fn one_step_with_a_rank_local_head(find_unused_parameters: bool) {
    let device = Default::default();
    let pg = init_process_group(CommBackend::Tcp, &RendezvousConfig::from_env().unwrap()).unwrap();
    let rank = pg.rank();
    B::seed(&device, 7);
    let ddp = DistributedDataParallel::new(pg, DdpConfig { find_unused_parameters, ..DdpConfig::default() });
    let model = ddp.broadcast_module(TwoHeads::<B>::new(&device)).unwrap();
    let before = flat_values(&model);
    let (x, y) = batch(rank * PER_RANK..(rank + 1) * PER_RANK, &device);
    let loss = CrossEntropyLossConfig::new().init(&device).forward(model.forward(x, rank == 1), y);
    match ddp.sync_gradients(&model, GradientsParams::from_grads(loss.backward(), &model)) {
        Err(e) => println!("SYNC_ERROR {e}"),
        Ok(grads) => {
            let mut optim = SgdConfig::new().init::<B, TwoHeads<B>>();
            let after = optim.step(0.1, model, grads);
            let after = flat_values(&after);
            println!("MOVED {}", max_relative_diff(&after, &before, 1e-6) > 1e-4);
            println!("PARAMS {}", serde_json::to_string(&after).unwrap());
        }
    }
}

#[test]
fn ddp_parameter_unused_on_one_rank_is_an_error_naming_it() {
    let test = "ddp_parameter_unused_on_one_rank_is_an_error_naming_it";
    if is_worker() {
        return one_step_with_a_rank_local_head(false);
    }
    let outs = spawn(test, 2, &[0, 1], &[]);
    assert_all_ok(test, &outs);
    for (r, o) in outs.iter().enumerate() {
        let text = String::from_utf8_lossy(&o.stdout);
        // `extra` is registered last: its bias is parameter #5 (of 0..=5), shape [3].
        assert!(
            text.contains("SYNC_ERROR parameter `extra.bias` (#5, shape [3]) has no gradient on some ranks only"),
            "rank {r}: {text}"
        );
        assert!(text.contains("find_unused_parameters"), "rank {r}: the error says how to opt in: {text}");
    }
}

#[test]
fn ddp_find_unused_parameters_counts_missing_gradients_as_zero() {
    let test = "ddp_find_unused_parameters_counts_missing_gradients_as_zero";
    if is_worker() {
        return one_step_with_a_rank_local_head(true);
    }
    let outs = spawn(test, 2, &[0, 1], &[]);
    assert_all_ok(test, &outs);
    let params: Vec<Vec<f32>> = outs
        .iter()
        .enumerate()
        .map(|(r, o)| {
            let text = String::from_utf8_lossy(&o.stdout);
            assert!(text.contains("MOVED true"), "{text}");
            printed_params(r, o)
        })
        .collect();
    assert_eq!(params[0], params[1], "both ranks step with the same averaged gradients");
}

/// After training-mode forward passes on different data, `broadcast_module` hands every rank
/// rank 0's BatchNorm running statistics — also those burn still holds per thread (a model
/// whose statistics were updated since they were last read).
#[test]
fn broadcast_module_hands_out_rank_0s_pending_batch_norm_statistics() {
    // A port from free_port() can be taken by another test before rank 0 binds it: try again.
    let means = (0..3)
        .find_map(|_| broadcast_running_means(burn_ddp::launch::free_port().unwrap()))
        .expect("three free ports in a row were taken before rank 0 bound them");
    assert_eq!(means[0], vec![0.1; 3], "rank 0 keeps its own statistics (momentum 0.1 of mean 1)");
    assert_eq!(means[1], means[0], "rank 1 did not get rank 0's running mean");
}

/// Each of 2 ranks' BatchNorm running means after a forward pass on rank-dependent data and
/// `broadcast_module`; `None` when `port` was taken before rank 0 could bind it.
fn broadcast_running_means(port: u16) -> Option<Vec<Vec<f32>>> {
    use burn_nn::{BatchNorm, BatchNormConfig};
    let results: Vec<Result<Vec<f32>, Error>> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || {
                    let config = RendezvousConfig {
                        master_addr: "127.0.0.1".into(),
                        master_port: port,
                        rank,
                        world_size: 2,
                        local_rank: rank,
                        local_world_size: 2,
                        timeout: std::time::Duration::from_secs(15),
                        token: None,
                        source: burn_ddp::launch_env::EnvSource::Torchrun,
                    };
                    let ddp = DistributedDataParallel::new(
                        init_process_group(CommBackend::Tcp, &config)?,
                        DdpConfig::default(),
                    );
                    let device = Default::default();
                    let bn: BatchNorm<B> = BatchNormConfig::new(3).init(&device);
                    // Rank-dependent data: the running means differ before the broadcast.
                    let x = Tensor::<B, 4>::ones([2, 3, 4, 4], &device).mul_scalar(1.0 + 10.0 * rank as f64);
                    let _ = bn.forward(x);
                    let bn = ddp.broadcast_module(bn)?;
                    Ok(bn.running_mean.value().into_data().to_vec::<f32>().unwrap())
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    if results.iter().any(|r| matches!(r, Err(Error::PortInUse { .. }))) {
        return None;
    }
    Some(results.into_iter().map(|r| r.unwrap()).collect())
}

/// A module's gradients in `grads`, flattened in visiting order.
struct GradValues<'a> {
    grads: &'a GradientsParams,
    out: Vec<f32>,
}

impl burn::module::ModuleVisitor<B> for GradValues<'_> {
    fn visit_float<const D: usize>(&mut self, p: &burn::module::Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<Flex, D>(p.id) {
            self.out.extend(g.into_data().convert::<f32>().to_vec::<f32>().unwrap());
        }
    }
}

fn grad_values<M: burn::module::Module<B>>(module: &M, grads: &GradientsParams) -> Vec<f32> {
    let mut v = GradValues { grads, out: Vec::new() };
    module.visit(&mut v);
    v.out
}

/// Gradients sent as bf16 or fp16 (PyTorch's compress hooks) average to the f32 average within
/// the type's rounding: each rank's share rounded once on the way in and the sum once more,
/// so per element |compressed − f32| ≤ 2 · 2^-m · mean over ranks of |gradient| (m = 8 for bf16,
/// 11 for fp16), plus twice fp16's half-spacing below its normal range (2^-25). The f32 average is each rank's own gradients' mean (to 1e-6), and the rounding
/// must show somewhere (the compressed average is not the f32 one).
#[test]
fn ddp_compressed_gradients_average_within_their_rounding() {
    let test = "ddp_compressed_gradients_average_within_their_rounding";
    if is_worker() {
        use burn_ddp::GradCompression;
        let device = Default::default();
        let pg = init_process_group(CommBackend::Tcp, &RendezvousConfig::from_env().unwrap()).unwrap();
        let rank = pg.rank();
        B::seed(&device, 5);
        let model = Mlp::<B>::new(&device);
        let (x, y) = batch(rank * PER_RANK..(rank + 1) * PER_RANK, &device);
        let grads = || {
            GradientsParams::from_grads(
                CrossEntropyLossConfig::new().init(&device).forward(model.forward(x.clone()), y.clone()).backward(),
                &model,
            )
        };
        println!("LOCAL {}", serde_json::to_string(&grad_values(&model, &grads())).unwrap());
        for (name, compression) in
            [("f32", GradCompression::None), ("bf16", GradCompression::Bf16), ("fp16", GradCompression::Fp16)]
        {
            let ddp = DistributedDataParallel::new(
                pg.clone(),
                DdpConfig { compression, bucket_bytes: 256, ..DdpConfig::default() },
            );
            let avg = ddp.sync_gradients(&model, grads()).unwrap();
            println!("AVG_{name} {}", serde_json::to_string(&grad_values(&model, &avg)).unwrap());
        }
        return;
    }
    let outs = spawn(test, 2, &[0, 1], &[]);
    assert_all_ok(test, &outs);
    let line = |o: &std::process::Output, key: &str| -> Vec<f32> {
        let text = String::from_utf8_lossy(&o.stdout);
        // libtest's "test … " may precede a worker's first line.
        serde_json::from_str(
            text.lines()
                .find_map(|l| l.split_once(&format!("{key} ")).map(|(_, v)| v))
                .unwrap_or_else(|| panic!("no {key} line: {text}")),
        )
        .unwrap()
    };
    let (g0, g1) = (line(&outs[0], "LOCAL"), line(&outs[1], "LOCAL"));
    let f32_avg = line(&outs[0], "AVG_f32");
    let mean: Vec<f32> = g0.iter().zip(&g1).map(|(a, b)| (a + b) / 2.0).collect();
    assert!(max_relative_diff(&f32_avg, &mean, 1e-6) < 1e-6, "the f32 average is the ranks' mean");
    for (name, m, floor) in [("bf16", 8, 0.0), ("fp16", 11, 2.0 * 2f32.powi(-25))] {
        let avg = line(&outs[0], &format!("AVG_{name}"));
        assert_eq!(avg, line(&outs[1], &format!("AVG_{name}")), "{name}: both ranks get the same average");
        let mut worst = 0.0f32;
        for (i, (&c, &f)) in avg.iter().zip(&f32_avg).enumerate() {
            let bound = 2.0 * 2f32.powi(-m) * (g0[i].abs() + g1[i].abs()) / 2.0 + floor + 1e-12;
            assert!((c - f).abs() <= bound, "{name}: element {i}: {c} vs f32 {f}, bound {bound}");
            worst = worst.max((c - f).abs() / bound);
        }
        assert!(avg.iter().zip(&f32_avg).any(|(c, f)| c != f), "{name}: the gradients travelled rounded");
        eprintln!("{name}: {} gradients, worst error {worst:.2} of the bound", avg.len());
    }
}

/// A world of one process without a launcher (`RendezvousConfig::single_process`: a store on a
/// port the system picks): DDP over it averages a rank's gradients to themselves.
#[test]
fn ddp_in_a_world_of_one_process_returns_the_gradients() {
    let device = Default::default();
    let pg = init_process_group(CommBackend::Tcp, &RendezvousConfig::single_process(0)).unwrap();
    assert_eq!((pg.rank(), pg.world_size()), (0, 1));
    B::seed(&device, 3);
    let model = Mlp::<B>::new(&device);
    let (x, y) = batch(0..PER_RANK, &device);
    let grads = || {
        GradientsParams::from_grads(
            CrossEntropyLossConfig::new().init(&device).forward(model.forward(x.clone()), y.clone()).backward(),
            &model,
        )
    };
    let ddp = DistributedDataParallel::new(pg, DdpConfig { bucket_bytes: 256, ..DdpConfig::default() });
    let (plain, averaged) =
        (grad_values(&model, &grads()), grad_values(&model, &ddp.sync_gradients(&model, grads()).unwrap()));
    assert!(!plain.is_empty());
    assert_eq!(averaged, plain);
}
