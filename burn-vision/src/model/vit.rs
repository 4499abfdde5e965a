//! Vision Transformers (ViT-Ti/S/B, patch 16 or 32, and a patch-4 variant for 28–64 px images)
//! with timm's `vit_*_patch*_224` parameter names and shapes (`patch_embed.proj`, `cls_token`,
//! `pos_embed`, `blocks.N.{norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2}`, `norm`,
//! `head`), so that timm's weights load with `--pretrained`.
//!
//! Pre-norm encoder blocks: LayerNorm (ε 1e-6) → multi-head self-attention
//! (`burn_ddp::nn::multi_head_self_attention` on the qkv projection's output: cuDNN's fused flash attention
//! for bf16/f16 on burn-cuda, cuBLAS products and a softmax otherwise, f32-accurate for f32) →
//! residual; LayerNorm → GELU MLP (ratio 4; `burn_ddp::nn::linear_gelu`: the first layer's bias
//! and the exact GELU are one kernel each way on burn-cuda) → residual;
//! final LayerNorm; the class token's features → head. The position embedding is learned for the grid the model was built
//! for and resized bicubically (timm's `resample_abs_pos_embed`: `align_corners=False`) when an
//! image has another size, so 224² weights fine-tune at 384² or 96².
//!
//! Precision: with bf16/f16 activations the patch embedding, attention and MLP products run in
//! that type (PyTorch's autocast), the final LayerNorm and the head in f32; the blocks' LayerNorms
//! (`burn_ddp::nn::layer_norm`) keep the activations' type with f32 statistics (one cuDNN pass
//! each way on burn-cuda).

use super::image_classifier::{ImageClassifier, NameScheme};
use burn::module::{Module, Param};
use burn::prelude::*;
use burn::tensor::FloatDType;
use burn_ddp::BatchNormSync;
use burn_ddp::grad_ready::param_val;
use burn_ddp::nn::{Conv2d, Layout, Precision, layer_norm, linear, linear_gelu, matmul, multi_head_self_attention};
use burn_nn::conv::Conv2dConfig;
use burn_nn::{Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig};

/// Our (timm's) names → torchvision's `VisionTransformer`.
const TORCHVISION: &[(&str, &str)] = &[
    (r"^patch_embed\.proj\.", "conv_proj."),
    (r"^cls_token$", "class_token"),
    (r"^pos_embed$", "encoder.pos_embedding"),
    (r"^blocks\.(\d+)\.norm1\.", "encoder.layers.encoder_layer_$1.ln_1."),
    (r"^blocks\.(\d+)\.norm2\.", "encoder.layers.encoder_layer_$1.ln_2."),
    (r"^blocks\.(\d+)\.attn\.qkv\.weight$", "encoder.layers.encoder_layer_$1.self_attention.in_proj_weight"),
    (r"^blocks\.(\d+)\.attn\.qkv\.bias$", "encoder.layers.encoder_layer_$1.self_attention.in_proj_bias"),
    (r"^blocks\.(\d+)\.attn\.proj\.", "encoder.layers.encoder_layer_$1.self_attention.out_proj."),
    (r"^blocks\.(\d+)\.mlp\.fc1\.", "encoder.layers.encoder_layer_$1.mlp.0."),
    (r"^blocks\.(\d+)\.mlp\.fc2\.", "encoder.layers.encoder_layer_$1.mlp.3."),
    (r"^norm\.", "encoder.ln."),
    (r"^head\.", "heads.head."),
];

/// The LayerNorms' ε (timm's ViTs).
const NORM_EPS: f64 = 1e-6;

/// Multi-head self-attention, timm's layout: one `qkv` projection whose outputs are ordered
/// (q/k/v, head, head dim), then `proj`.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    /// `[dim] → [3·dim]`.
    pub qkv: Linear<B>,
    /// `[dim] → [dim]`.
    pub proj: Linear<B>,
    #[module(skip)]
    heads: usize,
}

impl<B: Backend> Attention<B> {
    /// `[n, tokens, dim]` → `[n, tokens, dim]`
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        linear(&self.proj, multi_head_self_attention(linear(&self.qkv, x), self.heads))
    }
}

/// The MLP of a block: `fc1` (ratio 4) → GELU → `fc2`.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// `[dim] → [hidden]`.
    pub fc1: Linear<B>,
    /// `[hidden] → [dim]`.
    pub fc2: Linear<B>,
}

/// A pre-norm encoder block.
#[derive(Module, Debug)]
pub struct EncoderBlock<B: Backend> {
    /// Before attention.
    pub norm1: LayerNorm<B>,
    /// Self-attention.
    pub attn: Attention<B>,
    /// Before the MLP.
    pub norm2: LayerNorm<B>,
    /// The MLP.
    pub mlp: Mlp<B>,
}

impl<B: Backend> EncoderBlock<B> {
    /// `[n, tokens, dim]` → `[n, tokens, dim]`
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.forward_dropping(x, None)
    }

    /// [`forward`](Self::forward) with each residual branch (attention, MLP) multiplied by its
    /// per-sample `[n, 1, 1]` stochastic-depth factor.
    pub fn forward_dropping(&self, x: Tensor<B, 3>, drop: Option<&[Tensor<B, 3>; 2]>) -> Tensor<B, 3> {
        let scaled = |t: Tensor<B, 3>, k: usize| match drop {
            Some(m) => t * m[k].clone(),
            None => t,
        };
        let x = x.clone() + scaled(self.attn.forward(layer_norm(&self.norm1, x, NORM_EPS)), 0);
        let hidden = linear_gelu(&self.mlp.fc1, layer_norm(&self.norm2, x.clone(), NORM_EPS));
        x + scaled(linear(&self.mlp.fc2, hidden), 1)
    }
}

/// Stochastic depth (timm's `DropPath`): in training, each sample skips block `i`'s residual
/// branches with probability `rate · i / (depth − 1)` (each branch drawn apart), kept ones scaled
/// by `1 / (1 − p)`. The draws are a pure function of the step's key (set by the trainer) and
/// block, branch and sample; clones of the model share the key.
#[derive(Clone, Debug, Default)]
pub struct DropPath {
    rate: f64,
    key: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl DropPath {
    /// Block `block`'s two `[n, 1, 1]` factors, or `None` when it drops nothing.
    fn factors<B: Backend>(
        &self,
        block: usize,
        depth: usize,
        n: usize,
        like: &Tensor<B, 3>,
    ) -> Option<[Tensor<B, 3>; 2]> {
        let p = if depth > 1 { self.rate * block as f64 / (depth - 1) as f64 } else { self.rate };
        if p <= 0.0 || !B::ad_enabled(&like.device()) {
            return None;
        }
        let key = self.key.load(std::sync::atomic::Ordering::Relaxed);
        Some([0, 1].map(|branch| {
            use rand::{Rng, SeedableRng};
            let mut rng =
                rand_chacha::ChaCha8Rng::seed_from_u64(key ^ ((block as u64) << 48) ^ ((branch as u64) << 56));
            let f: Vec<f32> =
                (0..n).map(|_| if rng.random::<f64>() < p { 0.0 } else { (1.0 / (1.0 - p)) as f32 }).collect();
            Tensor::<B, 3>::from_data(TensorData::new(f, [n, 1, 1]), &like.device()).cast(like.dtype())
        }))
    }
}

/// The patch embedding: a `patch × patch` convolution of stride `patch`, run as one matrix
/// product over the image's patches (`burn_ddp::nn::Conv2d::forward_tokens`).
#[derive(Module, Debug)]
pub struct PatchEmbed<B: Backend> {
    /// `[c_in] → [dim]` per patch.
    pub proj: Conv2d<B>,
}

/// A Vision Transformer classifier.
#[derive(Module, Debug)]
pub struct VisionTransformer<B: Backend> {
    /// Patches → tokens.
    pub patch_embed: PatchEmbed<B>,
    /// `[1, 1, dim]`.
    pub cls_token: Param<Tensor<B, 3>>,
    /// `[1, 1 + grid², dim]`, for the grid the model was built for.
    pub pos_embed: Param<Tensor<B, 3>>,
    /// The encoder.
    pub blocks: Vec<EncoderBlock<B>>,
    /// Final LayerNorm.
    pub norm: LayerNorm<B>,
    /// Classifier head on the class token.
    pub head: Linear<B>,
    #[module(skip)]
    precision: Precision,
    #[module(skip)]
    drop_path: DropPath,
}

/// A ViT's shape. `init::<B>(&device)` builds it.
#[derive(Config, Debug)]
pub struct VitConfig {
    /// Patch side (16 or 32; 4 for small inputs).
    pub patch: usize,
    /// Token width.
    pub dim: usize,
    /// Encoder blocks.
    pub depth: usize,
    /// Attention heads.
    pub heads: usize,
    /// Classes.
    pub num_classes: usize,
    /// Input channels.
    #[config(default = 3)]
    pub in_channels: usize,
    /// Image side the position embedding is made for (224; 32 with `small_input`).
    #[config(default = 224)]
    pub image_size: usize,
    /// Patch 4 at 32² (for 28–64 px images), as the ResNets' small stem.
    #[config(default = false)]
    pub small_input: bool,
}

impl VitConfig {
    /// ViT-Ti: dim 192, depth 12, 3 heads.
    pub fn tiny(patch: usize, num_classes: usize) -> Self {
        Self::new(patch, 192, 12, 3, num_classes)
    }
    /// ViT-S: dim 384, depth 12, 6 heads.
    pub fn small(patch: usize, num_classes: usize) -> Self {
        Self::new(patch, 384, 12, 6, num_classes)
    }
    /// ViT-B: dim 768, depth 12, 12 heads.
    pub fn base(patch: usize, num_classes: usize) -> Self {
        Self::new(patch, 768, 12, 12, num_classes)
    }

    fn layout(&self) -> (usize, usize) {
        if self.small_input { (4, 32) } else { (self.patch, self.image_size) }
    }

    /// Builds the model with timm's initialisation (truncated-normal 0.02 for the linear layers
    /// and the embeddings — here normal 0.02 —, zero biases, LayerNorm 1 and 0).
    ///
    /// # Panics
    /// If `dim` is not a multiple of `heads`, or the image side not of the patch side.
    pub fn init<B: Backend>(&self, device: &B::Device) -> VisionTransformer<B> {
        let (patch, side) = self.layout();
        assert!(
            self.dim.is_multiple_of(self.heads) && side.is_multiple_of(patch) && self.depth > 0,
            "ViT: dim {} over {} heads, image {side} over patch {patch}",
            self.dim,
            self.heads
        );
        let normal = Initializer::Normal { mean: 0.0, std: 0.02 };
        let linear = |i: usize, o: usize| LinearConfig::new(i, o).with_initializer(normal.clone()).init(device);
        let norm = || LayerNormConfig::new(self.dim).with_epsilon(NORM_EPS).init(device);
        let block = || EncoderBlock {
            norm1: norm(),
            attn: Attention {
                qkv: linear(self.dim, 3 * self.dim),
                proj: linear(self.dim, self.dim),
                heads: self.heads,
            },
            norm2: norm(),
            mlp: Mlp { fc1: linear(self.dim, 4 * self.dim), fc2: linear(4 * self.dim, self.dim) },
        };
        let tokens = 1 + (side / patch) * (side / patch);
        let proj = Conv2dConfig::new([self.in_channels, self.dim], [patch, patch])
            .with_stride([patch, patch])
            .with_initializer(Initializer::KaimingUniform { gain: 1.0 / 3f64.sqrt(), fan_out_only: false });
        VisionTransformer {
            patch_embed: PatchEmbed { proj: proj.init(device).into() },
            cls_token: normal.init([1, 1, self.dim], device),
            pos_embed: normal.init([1, tokens, self.dim], device),
            blocks: (0..self.depth).map(|_| block()).collect(),
            norm: norm(),
            head: linear(self.dim, self.num_classes),
            precision: Precision::F32,
            drop_path: DropPath::default(),
        }
    }
}

impl<B: Backend> VisionTransformer<B> {
    /// The position embedding for a `gh × gw` grid: the learned one, or it resized bicubically
    /// (the class token's entry unchanged).
    fn pos_embed_for(&self, gh: usize, gw: usize, anchor: &Tensor<B, 3>) -> Tensor<B, 3> {
        let pos = param_val(&self.pos_embed, anchor);
        let [_, tokens, d] = pos.dims();
        let g = ((tokens - 1) as f64).sqrt().round() as usize;
        if g * g + 1 != tokens || (g == gh && g == gw) {
            return pos;
        }
        let cls = pos.clone().slice([0..1, 0..1]);
        let grid = resize_bicubic(pos.slice([0..1, 1..tokens]).reshape([g, g * d]), (g, g), (gh, gw), d);
        Tensor::cat(vec![cls, grid.reshape([1, gh * gw, d])], 1)
    }
}

/// PyTorch's bicubic weights (`align_corners=False`, A = −0.75, edge taps clamped) taking `from`
/// samples to `to`, as a `[to, from]` row-major matrix.
fn bicubic_matrix(from: usize, to: usize) -> Vec<f32> {
    const A: f64 = -0.75;
    let near = |x: f64| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let far = |x: f64| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    let mut m = vec![0f32; to * from];
    for i in 0..to {
        let src = (i as f64 + 0.5) * from as f64 / to as f64 - 0.5;
        let (i0, t) = (src.floor(), src - src.floor());
        for (k, w) in [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)].into_iter().enumerate() {
            let j = (i0 as i64 + k as i64 - 1).clamp(0, from as i64 - 1) as usize;
            m[i * from + j] += w as f32;
        }
    }
    m
}

/// A `[rows · cols, d]` grid (row-major `[rows, cols, d]` as `[rows, cols · d]`) resized
/// bicubically to `to`, as two products with weight matrices — so its gradient exists on every
/// backend (burn-cuda has no bicubic backward) — through `burn_ddp::nn::matmul` (f32-exact on
/// burn-cuda). Returns `[to.0, to.1, d]`.
fn resize_bicubic<B: Backend>(grid: Tensor<B, 2>, from: (usize, usize), to: (usize, usize), d: usize) -> Tensor<B, 3> {
    let device = grid.device();
    let weights =
        |f: usize, t: usize| Tensor::<B, 2>::from_data(TensorData::new(bicubic_matrix(f, t), [t, f]), &device);
    let rows = matmul(weights(from.0, to.0), grid).reshape([to.0, from.1, d]);
    let cols = weights(from.1, to.1).unsqueeze_dim::<3>(0).expand([to.0, to.1, from.1]);
    matmul(cols, rows)
}

impl<B: Backend> ImageClassifier<B> for VisionTransformer<B> {
    /// Class logits (f32 whatever the [`Precision`]).
    ///
    /// # Shapes
    /// `[n, in_channels, h, w]` → `[n, num_classes]` (`h`, `w` multiples of the patch side)
    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = x.cast(self.precision.dtype());
        let (tokens, [gh, gw]) = self.patch_embed.proj.forward_tokens(x);
        let [n, _, d] = tokens.dims();
        let cls = param_val(&self.cls_token, &tokens).cast(tokens.dtype()).expand([n, 1, d]);
        let pos = self.pos_embed_for(gh, gw, &tokens).cast(tokens.dtype());
        let mut x = Tensor::cat(vec![cls, tokens], 1) + pos;
        let depth = self.blocks.len();
        for (i, block) in self.blocks.iter().enumerate() {
            let drop = self.drop_path.factors(i, depth, n, &x);
            x = block.forward_dropping(x, drop.as_ref());
        }
        // The final LayerNorm acts per token: only the class token's is needed.
        let cls = x.slice([0..n, 0..1]).reshape([n, d]);
        linear(&self.head, self.norm.forward(cls.cast(FloatDType::F32)))
    }

    fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    fn precision(&self) -> Precision {
        self.precision
    }

    /// Tokens have no channel axis: the model keeps its one layout.
    fn with_channels_last(self, _channels_last: bool) -> Self {
        self
    }

    fn layout(&self) -> Layout {
        Layout::Nchw
    }

    /// A ViT has no BatchNorm (LayerNorm needs no statistics across ranks).
    fn with_sync_batch_norm(self, sync: Option<BatchNormSync>) -> Self {
        if sync.is_some() {
            log::warn!(
                "--sync-bn: a Vision Transformer has no BatchNorm (LayerNorm needs no cross-rank statistics); ignored"
            );
        }
        self
    }

    fn sync_batch_norm(&self) -> bool {
        false
    }

    /// timm's names are ours; torchvision's `vit_*` nest the blocks in `encoder.layers` and
    /// keep the attention's input projection as raw parameters (the same `[3·dim, dim]` layout).
    fn torch_names(&self) -> &'static [NameScheme] {
        &[("timm", &[]), ("torchvision", TORCHVISION)]
    }

    fn head_params(&self) -> Vec<String> {
        vec!["head.weight".into(), "head.bias".into()]
    }

    fn with_drop_path(mut self, rate: f64) -> Option<Self> {
        self.drop_path.rate = rate;
        Some(self)
    }

    fn set_draw_key(&self, key: u64) {
        self.drop_path.key.store(key, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::AutodiffModule;
    use burn::tensor::module::interpolate;
    use burn::tensor::ops::{InterpolateMode, InterpolateOptions};
    use burn_flex::Flex;

    /// The two weight products equal burn's bicubic interpolation (PyTorch's semantics), up and
    /// down, square and not; and the weights of each output sample add up to 1.
    #[test]
    fn the_bicubic_resize_by_products_equals_bicubic_interpolation() {
        let device = Default::default();
        for (from, to) in [((4, 4), (7, 7)), ((14, 14), (6, 6)), ((8, 8), (5, 12)), ((2, 2), (2, 3))] {
            let d = 3;
            let grid =
                Tensor::<Flex, 3>::random([from.0, from.1, d], burn::tensor::Distribution::Normal(0.0, 1.0), &device);
            let ours = resize_bicubic(grid.clone().reshape([from.0, from.1 * d]), from, to, d)
                .into_data()
                .to_vec::<f32>()
                .unwrap();
            let options = InterpolateOptions { mode: InterpolateMode::Bicubic, align_corners: false };
            let burn = interpolate(grid.permute([2, 0, 1]).unsqueeze_dim::<4>(0), [to.0, to.1], options)
                .squeeze_dim::<3>(0)
                .permute([1, 2, 0])
                .into_data()
                .to_vec::<f32>()
                .unwrap();
            let err = ours.iter().zip(&burn).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(err < 1e-5, "{from:?} → {to:?}: max difference {err}");
        }
        for row in bicubic_matrix(5, 9).chunks(5) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6, "{row:?}");
        }
    }

    /// Stochastic depth: reproducible per key, different across keys, off outside autodiff
    /// (evaluation), none in block 0, and each branch dropped with the block's probability.
    #[test]
    fn drop_path_draws_per_key_in_training_only() {
        type Ad = burn_autodiff::Autodiff<Flex>;
        let device = Default::default();
        let model = VitConfig::new(4, 32, 3, 2, 5).with_image_size(32).init::<Ad>(&device);
        let x = Tensor::<Ad, 4>::random([6, 3, 32, 32], burn::tensor::Distribution::Normal(0.0, 1.0), &device);
        let v = |t: Tensor<Ad, 2>| t.into_data().to_vec::<f32>().unwrap();
        let dropping = model.with_drop_path(0.5).unwrap();
        dropping.set_draw_key(1);
        let a = v(dropping.forward(x.clone()));
        // Cloned after the first forward: lazily initialised parameters are drawn by then.
        let plain = v(dropping.clone().with_drop_path(0.0).unwrap().forward(x.clone()));
        assert_eq!(a, v(dropping.forward(x.clone())), "the same key draws the same");
        dropping.set_draw_key(2);
        assert_ne!(a, v(dropping.forward(x.clone())), "another key draws anew");
        assert_ne!(a, plain, "rate 0.5 drops something in 6 samples × 4 branches");
        let eval = dropping.valid().forward(x.inner()).into_data().to_vec::<f32>().unwrap();
        let close = eval.iter().zip(&plain).all(|(e, p)| (e - p).abs() < 1e-5);
        assert!(close, "evaluation must not drop: {:?} vs {:?}", &eval[..4], &plain[..4]);
        let d = DropPath { rate: 0.3, key: Default::default() };
        let like = Tensor::<Ad, 3>::zeros([1, 1, 1], &device);
        assert!(d.factors(0, 4, 8, &like).is_none(), "block 0 keeps everything");
        let f = d.factors(3, 4, 4000, &like).unwrap()[1].clone().into_data().to_vec::<f32>().unwrap();
        let dropped = f.iter().filter(|&&v| v == 0.0).count() as f64 / 4000.0;
        assert!((dropped - 0.3).abs() < 0.03, "dropped {dropped}");
        assert!(f.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.7).abs() < 1e-6));
    }

    /// The resize has a gradient (what burn-cuda's bicubic interpolation lacks): for
    /// `out = Ry · grid · Rxᵀ` (per feature), `d grid = Ryᵀ · g · Rx`, against f64.
    #[test]
    fn the_resized_position_grid_has_its_gradient() {
        type Ad = burn_autodiff::Autodiff<Flex>;
        let device = Default::default();
        let ((fh, fw), (th, tw)) = ((4, 3), (6, 5));
        let grid =
            Tensor::<Ad, 2>::random([fh, fw], burn::tensor::Distribution::Normal(0.0, 1.0), &device).require_grad();
        let g = Tensor::<Ad, 3>::random([th, tw, 1], burn::tensor::Distribution::Normal(0.0, 1.0), &device);
        let gv: Vec<f64> = g.clone().into_data().to_vec::<f32>().unwrap().into_iter().map(f64::from).collect();
        let grads = (resize_bicubic(grid.clone(), (fh, fw), (th, tw), 1) * g).sum().backward();
        let got = grid.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap();
        let (ry, rx) = (bicubic_matrix(fh, th), bicubic_matrix(fw, tw));
        for a in 0..fh {
            for b in 0..fw {
                let want: f64 = (0..th)
                    .flat_map(|i| (0..tw).map(move |j| (i, j)))
                    .map(|(i, j)| f64::from(ry[i * fh + a]) * gv[i * tw + j] * f64::from(rx[j * fw + b]))
                    .sum();
                assert!((f64::from(got[a * fw + b]) - want).abs() < 1e-5, "({a},{b}): {} vs {want}", got[a * fw + b]);
            }
        }
    }

    #[test]
    fn timm_parameter_counts() {
        // timm: sum(p.numel() for p in create_model(name).parameters()) (1000 classes).
        let device = Default::default();
        for (config, params) in [
            (VitConfig::tiny(16, 1000), 5_717_416usize),
            (VitConfig::small(16, 1000), 22_050_664),
            (VitConfig::base(16, 1000), 86_567_656),
        ] {
            assert_eq!(config.init::<Flex>(&device).num_params(), params, "{config:?}");
        }
    }

    #[test]
    fn another_image_size_resizes_the_position_embedding() {
        let device = Default::default();
        let model = VitConfig::new(4, 32, 2, 2, 5).with_image_size(32).init::<Flex>(&device);
        for side in [32, 28, 48] {
            let x =
                Tensor::<Flex, 4>::random([2, 3, side, side], burn::tensor::Distribution::Normal(0.0, 1.0), &device);
            assert_eq!(model.forward(x).dims(), [2, 5], "{side}");
        }
    }
}
