//! A pre-norm transformer encoder block as a classifier of the equivalence tests' rows: each
//! row of `FEATURES` values is `TOKENS` tokens of `FEATURES / TOKENS` features, embedded,
//! LayerNorm → two-head self-attention → residual, LayerNorm → GELU MLP → residual, mean over
//! the tokens, head — a ViT block built from burn-nn and burn-ddp's `nn::linear` / `nn::attention`.

#![allow(dead_code)]

use super::mlp::FEATURES;
use burn::module::Module;
use burn::prelude::*;
use burn_ddp::nn::{attention, linear};
use burn_nn::{LayerNorm, LayerNormConfig, Linear, LinearConfig};

const TOKENS: usize = 4;
const DIM: usize = 8;
const HEADS: usize = 2;

#[derive(Module, Debug)]
pub struct VitBlock<B: Backend> {
    embed: Linear<B>,
    norm1: LayerNorm<B>,
    qkv: Linear<B>,
    proj: Linear<B>,
    norm2: LayerNorm<B>,
    fc1: Linear<B>,
    fc2: Linear<B>,
    head: Linear<B>,
}

impl<B: Backend> VitBlock<B> {
    pub fn new(device: &B::Device) -> Self {
        let norm = || LayerNormConfig::new(DIM).with_epsilon(1e-6).init(device);
        let lin = |i, o| LinearConfig::new(i, o).init(device);
        Self {
            embed: lin(FEATURES / TOKENS, DIM),
            norm1: norm(),
            qkv: lin(DIM, 3 * DIM),
            proj: lin(DIM, DIM),
            norm2: norm(),
            fc1: lin(DIM, 4 * DIM),
            fc2: lin(4 * DIM, DIM),
            head: lin(DIM, 3),
        }
    }

    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let n = x.dims()[0];
        let x = linear(&self.embed, x.reshape([n, TOKENS, FEATURES / TOKENS]));
        let qkv = linear(&self.qkv, self.norm1.forward(x.clone()))
            .reshape([n, TOKENS, 3, HEADS, DIM / HEADS])
            .permute([2, 0, 3, 1, 4]);
        let part = |i: usize| qkv.clone().slice([i..i + 1]).reshape([n, HEADS, TOKENS, DIM / HEADS]);
        let attended = attention(part(0), part(1), part(2)).swap_dims(1, 2).reshape([n, TOKENS, DIM]);
        let x = x + linear(&self.proj, attended);
        let hidden = burn::tensor::activation::gelu(linear(&self.fc1, self.norm2.forward(x.clone())));
        let x = x + linear(&self.fc2, hidden);
        linear(&self.head, x.mean_dim(1).reshape([n, DIM]))
    }
}
