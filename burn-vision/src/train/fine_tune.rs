//! Fine-tuning from PyTorch weights, as the tutorial does it: `--pretrained FILE` loads
//! torchvision / timm weights before the first step, `--freeze-layers` trains only the
//! classifier head, `--backbone-lr-scale S` trains the backbone at `S ×` the head's rate
//! (PyTorch's two parameter groups: one optimizer, stepped over each group's gradients).

use super::config::TrainConfig;
use crate::error::Result;
use crate::model::classifier::Classifier;
use crate::model::image_classifier::ImageClassifier;
use crate::weights::import::load_pretrained;
use burn::module::{ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_optim::{GradientsParams, Optimizer};
use burn_store::ModuleSnapshot;

/// The ids of the head's parameters.
fn head_ids<B: Backend>(model: &Classifier<B>) -> Vec<ParamId> {
    let head = model.head_params();
    model
        .collect(None, None, true)
        .into_iter()
        .filter(|s| head.contains(&s.full_path()))
        .filter_map(|s| s.tensor_id)
        .collect()
}

/// Loads `config.pretrained` into `model` (logging what happened on the main rank) and freezes
/// the backbone with `config.freeze_layers`. Returns the file's `num_batches_tracked`.
///
/// # Errors
/// As [`load_pretrained`].
pub(super) fn prepare<B: AutodiffBackend>(
    config: &TrainConfig,
    model: Classifier<B>,
    main_rank: bool,
) -> Result<(Classifier<B>, i64)> {
    let (mut model, tracked) = match &config.pretrained {
        Some(path) => {
            let (model, report) = load_pretrained(model, &config.model, path)?;
            if main_rank {
                log::info!("pretrained weights {}: {report}", path.display());
            }
            (model, report.batches_tracked.unwrap_or(0))
        }
        None => (model, 0),
    };
    if config.freeze_layers {
        let keep = head_ids(&model);
        model = model.map(&mut Freeze { keep });
        if main_rank {
            log::info!("--freeze-layers: only the classifier head ({}) trains", model.head_params().join(", "));
        }
    }
    Ok((model, tracked))
}

struct Freeze {
    keep: Vec<ParamId>,
}

impl<B: Backend> ModuleMapper<B> for Freeze {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if self.keep.contains(&param.id) { param } else { param.set_require_grad(false) }
    }
}

/// Moves the head's gradients out of `from` into a set of their own.
struct TakeHead<'a, B: AutodiffBackend> {
    ids: &'a [ParamId],
    from: &'a mut GradientsParams,
    to: GradientsParams,
    _backend: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for TakeHead<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.ids.contains(&param.id)
            && let Some(g) = self.from.remove::<B::InnerBackend, D>(param.id)
        {
            self.to.register(param.id, g);
        }
    }
}

/// How a step applies the learning rate: one rate, or the backbone's scaled.
pub(super) struct LrGroups {
    head: Vec<ParamId>,
    backbone_scale: f64,
}

impl LrGroups {
    /// One group unless `config.backbone_lr_scale` differs from 1.
    pub fn new<B: Backend>(config: &TrainConfig, model: &Classifier<B>) -> Self {
        let scaled = config.backbone_lr_scale != 1.0;
        Self { head: if scaled { head_ids(model) } else { Vec::new() }, backbone_scale: config.backbone_lr_scale }
    }

    /// Steps `optim` with `lr` for the head and `lr × scale` for the rest.
    pub fn step<B: AutodiffBackend, O: Optimizer<Classifier<B>, B>>(
        &self,
        optim: &mut O,
        lr: f64,
        model: Classifier<B>,
        mut grads: GradientsParams,
    ) -> Classifier<B> {
        if self.head.is_empty() {
            return optim.step(lr, model, grads);
        }
        let mut take = TakeHead::<B> {
            ids: &self.head,
            from: &mut grads,
            to: GradientsParams::new(),
            _backend: std::marker::PhantomData,
        };
        model.visit(&mut take);
        let head = take.to;
        let model = optim.step(lr * self.backbone_scale, model, grads);
        optim.step(lr, model, head)
    }
}
