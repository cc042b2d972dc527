//! One micro-step of an `Engine`, stage by stage (`MicroStep`): what each stage keeps between
//! its forward and its backward (its input to recompute from, or its graph, resharded or not).

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};

use super::install::{unit_tensor, Leaf, Untracked};
use super::loss::{cross_entropy, own_loss};
use super::{to_vec, Engine};
use crate::kernels;
use crate::model::api::{
    recomputed, resharded, Act, Family, Forward, GradScale, Input, MicroStep, ModelError, StepKey,
    UnitParams,
};

/// What a stage keeps between its forward and its backward.
enum Saved<F: Family, B: AutodiffBackend> {
    /// Nothing yet, or the backward has run.
    Empty,
    /// Recomputed: the stage's input and where the dropout stream stood.
    Input {
        x: Act<B::InnerBackend>,
        ctx: Forward,
    },
    /// Kept: the module with its leaves, the input leaf and the output (the scaled loss for the
    /// last stage), with their graph; resharded, the module's parameters without their values
    /// and `held`, the slots the backward's gathered units fill.
    Graph {
        module: F::Module<B>,
        input: Act<B>,
        output: Output<B>,
        held: Option<kernels::Resharded>,
    },
}

enum Output<B: AutodiffBackend> {
    Act(Act<B>),
    Loss(Tensor<B, 1>),
}

/// One micro-step of an `Engine`, stage by stage.
pub(super) struct EngineMicro<'a, F: Family, B: AutodiffBackend> {
    engine: &'a Engine<F, B>,
    ctx: Forward,
    checkpointing: bool,
    /// Stages drop their parameters after their forward (`Compute::micro`, `resharded`).
    reshard: bool,
    grads: GradScale,
    /// The batch's input, until stage 0 takes it.
    x: Option<TensorData>,
    /// The target of each output row, until the last stage takes them.
    targets: Option<Vec<u32>>,
    /// The last forward's output (the next stage's input), without its graph.
    next: Option<Act<B::InnerBackend>>,
    saved: Vec<Saved<F, B>>,
    /// The gradient arriving at the output of the stage whose backward is next.
    grad: Option<Act<B::InnerBackend>>,
    loss: f64,
    /// The model's own part of `loss`.
    own_loss: Option<f64>,
}

impl<F: Family, B: AutodiffBackend> EngineMicro<'_, F, B> {
    /// The loss of the last stage's logits (scaled for the backward) and its value.
    fn loss_of(&mut self, logits: Act<B>) -> Result<Tensor<B, 1>, ModelError> {
        let targets = self
            .targets
            .take()
            .ok_or_else(|| ModelError::Stage("the last stage ran twice".into()))?;
        let (logits, own) = logits.into_logits_and_loss()?;
        let loss = cross_entropy(logits, &targets, self.engine.fused);
        // the model's own loss (a mixture of experts' load balancing) trains with the task's
        let loss = match own {
            Some(own) => {
                let own = own_loss(own, &targets);
                self.own_loss = to_vec(own.clone().inner())?.first().map(|&v| f64::from(v));
                loss + own
            }
            None => loss,
        };
        self.loss = f64::from(
            to_vec(loss.clone().inner())?
                .first()
                .copied()
                .unwrap_or(f32::NAN),
        );
        Ok(loss.mul_scalar(self.grads.weight * self.grads.loss_scale))
    }

    /// Stage `s`'s input: the batch for the first stage, the previous stage's output after.
    fn input(&mut self, s: usize) -> Result<Act<B::InnerBackend>, ModelError> {
        let x = if s == 0 {
            self.x.take().map(Act::Data)
        } else {
            self.next.take()
        };
        x.ok_or_else(|| ModelError::Stage(format!("stage {s} ran out of order")))
    }
}

impl<F: Family, B: AutodiffBackend> MicroStep<B> for EngineMicro<'_, F, B> {
    fn forward(&mut self, s: usize, params: Vec<UnitParams>) -> Result<(), ModelError> {
        let e = self.engine;
        let n = e.stages.len();
        let units = e.stage_params(s, params)?;
        let x = self.input(s)?;
        if !e.trains[s] {
            // nothing up to here trains: no graph, nothing kept for a backward
            let module = e.install::<B, Untracked>(e.template.clone(), units)?;
            let y = e.family.stage_forward(
                &module,
                s,
                Act::<B>::untracked(x),
                &e.device,
                &mut self.ctx,
            );
            if s + 1 == n {
                return Err(ModelError::Stage("no parameter of the model trains".into()));
            }
            self.next = Some(y.inner());
            return Ok(());
        }
        if recomputed(s, n, self.checkpointing) {
            // no graph (nothing requires a gradient): the stage's parameters are freed with the
            // module
            let module = e.install::<B, Untracked>(e.template.clone(), units)?;
            let ctx = self.ctx.clone();
            let y = e.family.stage_forward(
                &module,
                s,
                Act::<B>::untracked(x.clone()),
                &e.device,
                &mut self.ctx,
            );
            self.next = Some(y.inner());
            self.saved[s] = Saved::Input { x, ctx };
        } else {
            let mut held = kernels::Resharded::default();
            let reshard = resharded(s, n, self.reshard);
            let module =
                e.install_held::<B, Leaf>(e.template.clone(), units, reshard.then_some(&mut held))?;
            let input = e.input_act(s, x);
            let y = e
                .family
                .stage_forward(&module, s, input.clone(), &e.device, &mut self.ctx);
            let output = if s + 1 == n {
                Output::Loss(self.loss_of(y)?)
            } else {
                self.next = Some(y.inner());
                Output::Act(y)
            };
            // resharded: the graph keeps the units' slots, the module none of their values
            let (module, held) = if held.any() {
                held.release();
                (e.hollow(s, module), Some(held))
            } else {
                (module, None)
            };
            self.saved[s] = Saved::Graph {
                module,
                input,
                output,
                held,
            };
        }
        Ok(())
    }

    fn loss(&self) -> f64 {
        self.loss
    }

    fn own_loss(&self) -> Option<f64> {
        self.own_loss
    }

    fn backward(
        &mut self,
        s: usize,
        params: Option<Vec<UnitParams>>,
    ) -> Result<Vec<Tensor<B::InnerBackend, 1>>, ModelError> {
        let e = self.engine;
        if !e.trains[s] {
            // (nothing here or before trains: the forward kept nothing)
            return Ok(Vec::new());
        }
        let saved = std::mem::replace(&mut self.saved[s], Saved::Empty);
        // (a resharded stage's slots, filled until its gradients are out)
        let reheld;
        let (module, input, output) = match saved {
            Saved::Graph {
                module,
                input,
                output,
                held,
            } => {
                if let Some(h) = &held {
                    let params = params.ok_or_else(|| {
                        ModelError::Stage(format!("stage {s} is resharded but got no parameters"))
                    })?;
                    let units = e
                        .stage_params(s, params)?
                        .into_iter()
                        .map(|(u, p)| {
                            unit_tensor::<B::InnerBackend>(&e.layout, u, p, &e.device, e.dtype)
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    h.refill(units).map_err(ModelError::Stage)?;
                }
                reheld = held;
                (module, input, output)
            }
            Saved::Input { x, mut ctx } => {
                reheld = None;
                let params = params.ok_or_else(|| {
                    ModelError::Stage(format!("stage {s} is recomputed but got no parameters"))
                })?;
                let module =
                    e.install::<B, Leaf>(e.template.clone(), e.stage_params(s, params)?)?;
                let input = e.input_act(s, x);
                let y = e
                    .family
                    .stage_forward(&module, s, input.clone(), &e.device, &mut ctx);
                (module, input, Output::Act(y))
            }
            Saved::Empty => {
                return Err(ModelError::Stage(format!(
                    "stage {s}'s backward before its forward"
                )))
            }
        };
        let tape = match output {
            Output::Loss(loss) => loss.backward(),
            Output::Act(y) => {
                let g = self.grad.take().ok_or_else(|| {
                    ModelError::Stage(format!("stage {s}'s backward out of order"))
                })?;
                y.vjp(g)?.backward()
            }
        };
        if s > 0 && e.trains[s - 1] {
            self.grad = Some(
                input
                    .grad(&tape)
                    .ok_or_else(|| ModelError::NoGrad(format!("the input of stage {s}")))?,
            );
        }
        drop(input);
        // the tape has every gradient: the re-gathered parameters go before the gradients are
        // joined (only the slots hold them; the module is hollow)
        if let Some(h) = reheld {
            h.release();
        }
        e.stage_grads(s, module, tape, self.grads)
    }
}

impl<'a, F: Family, B: AutodiffBackend> EngineMicro<'a, F, B> {
    /// A micro-step of `engine` on `batch` (`Compute::micro`).
    pub(super) fn new(
        engine: &'a Engine<F, B>,
        batch: Input,
        key: StepKey,
        grads: GradScale,
        (checkpointing, reshard): (bool, bool),
    ) -> Self {
        EngineMicro {
            engine,
            ctx: Forward::train(key)
                .with_fused(engine.fused)
                .with_segments(batch.starts)
                .with_padding(batch.padding),
            checkpointing,
            reshard,
            grads,
            x: Some(batch.x),
            targets: Some(batch.targets),
            next: None,
            saved: (0..engine.stages.len()).map(|_| Saved::Empty).collect(),
            grad: None,
            loss: f64::NAN,
            own_loss: None,
        }
    }
}
