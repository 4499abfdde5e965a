//! The small model and data set of the equivalence tests (DDP, DataParallel): an MLP and rows
//! that are a fixed function of their global index.

#![allow(dead_code)]

use burn::module::Module;
use burn::prelude::*;
use burn::tensor::TensorData;
use burn_nn::{Linear, LinearConfig, Relu};

pub const FEATURES: usize = 8;

#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    l1: Linear<B>,
    l2: Linear<B>,
    relu: Relu,
}

impl<B: Backend> Mlp<B> {
    pub fn new(device: &B::Device) -> Self {
        Self {
            l1: LinearConfig::new(FEATURES, 16).init(device),
            l2: LinearConfig::new(16, 3).init(device),
            relu: Relu::new(),
        }
    }
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.l2.forward(self.relu.forward(self.l1.forward(x)))
    }
}

/// Rows `rows` of the global data set: features and labels.
pub fn batch<B: Backend>(rows: std::ops::Range<usize>, device: &B::Device) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let n = rows.len();
    let xs: Vec<f32> =
        rows.clone().flat_map(|i| (0..FEATURES).map(move |j| (((i * 31 + j * 17) % 29) as f32 - 14.0) / 7.0)).collect();
    let ys: Vec<i64> = rows.map(|i| (i % 3) as i64).collect();
    (Tensor::from_data(TensorData::new(xs, [n, FEATURES]), device), Tensor::from_data(TensorData::new(ys, [n]), device))
}
