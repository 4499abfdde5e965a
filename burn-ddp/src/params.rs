//! A module's parameters: drawn in a fixed order ([`initialized`]), and read as one flat host
//! vector (for checks, equivalence tests and broadcasts).

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::prelude::*;

struct Collect<'a> {
    out: &'a mut Vec<f32>,
}

impl<B: Backend> ModuleVisitor<B> for Collect<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let data = param.val().into_data().convert::<f32>();
        self.out.extend_from_slice(&data.to_vec::<f32>().expect("f32 after convert"));
    }
}

/// The identity mapping: mapping a module with it draws its lazily initialised parameters.
struct Initialise;

impl<B: Backend> ModuleMapper<B> for Initialise {}

/// `module` with every lazily initialised parameter drawn now, in visiting order. Burn draws a
/// parameter from the backend's generator when it is first read, so a model whose forward
/// pass reads its parameters in another order than they are visited — or that is broadcast
/// first, or whose threads read it concurrently — would otherwise start from other values for
/// the same seed. Call it right after seeding and building the model.
pub fn initialized<B: Backend, M: Module<B>>(module: M) -> M {
    module.map(&mut Initialise)
}

/// Every float tensor of `module` (parameters and running statistics), in visiting order,
/// copied to the host as `f32`.
pub fn flat_values<B: Backend, M: Module<B>>(module: &M) -> Vec<f32> {
    let mut out = Vec::new();
    module.visit(&mut Collect { out: &mut out });
    out
}

/// Largest |a−b| / max(|a|, |b|, `floor`) over two equal-length slices.
///
/// # Panics
/// If the lengths differ.
pub fn max_relative_diff(a: &[f32], b: &[f32], floor: f32) -> f32 {
    assert_eq!(a.len(), b.len(), "Got lengths {} and {}", a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs() / x.abs().max(y.abs()).max(floor)).fold(0.0, f32::max)
}
