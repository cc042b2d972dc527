//! `kiln sample`'s work: text from a gpt run's checkpoint, byte by byte. The context is the last
//! `block_size` tokens; each next byte is drawn from softmax(logits / temperature), restricted
//! to the `top_k` most likely when given, from one stream of kiln's RNG keyed by the seed, so a
//! seed always gives the same text.

use std::path::Path;

use burn::backend::Flex;

use super::resume::require_checkpoint;
use super::run_dir::{checkpoint_store, run_config};
use crate::checkpoint;
use crate::error::{Error, Result};
use crate::model::{ComputeOn, Task};
use crate::rng::Rng;

/// How to sample.
#[derive(Debug, Clone)]
pub struct SampleOptions {
    /// A checkpoint name (`step-00000600`) instead of the newest verified one.
    pub from: Option<String>,
    pub prompt: String,
    pub tokens: usize,
    pub temperature: f64,
    pub top_k: Option<usize>,
    pub seed: u64,
}

/// The index drawn from `logits` (already divided by the temperature), keeping the `top_k`
/// largest, with `u` uniform in [0, 1).
fn draw(logits: &[f32], top_k: Option<usize>, u: f64) -> usize {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order.truncate(top_k.unwrap_or(logits.len()).clamp(1, logits.len().max(1)));
    let max = f64::from(logits[order[0]]);
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| (f64::from(logits[i]) - max).exp())
        .collect();
    let mut target = u * weights.iter().sum::<f64>();
    for (&i, w) in order.iter().zip(&weights) {
        if target < *w {
            return i;
        }
        target -= w;
    }
    order[order.len() - 1]
}

/// Generates `o.tokens` bytes after `o.prompt` from the gpt run in `run_dir`, handing the
/// prompt's bytes and then each drawn byte to `on_byte`.
pub fn sample(run_dir: &Path, o: &SampleOptions, on_byte: &mut dyn FnMut(u8)) -> Result<()> {
    if !(o.temperature > 0.0 && o.temperature.is_finite()) {
        return Err(Error::Usage(format!(
            "--temperature {} must be above 0 (lower is more predictable)",
            o.temperature
        )));
    }
    if o.top_k == Some(0) {
        return Err(Error::Usage("--top-k must be at least 1".into()));
    }
    let r = run_config(run_dir)?;
    let kind = r.config.model.kind.as_str();
    if kind != "gpt" {
        return Err(Error::Usage(format!(
            "kiln sample generates text from a gpt run, but `{}` trained model.kind = \"{kind}\"",
            run_dir.display()
        )));
    }
    let block = r.config.model.block_size.unwrap_or(128);
    let model = crate::model::build(&r, &[block + 1])?;
    let Task::LanguageModel { vocab, .. } = model.task() else {
        return Err(Error::Usage(
            "the run's model is not a language model".into(),
        ));
    };
    if vocab < 256 {
        return Err(Error::Usage(format!(
            "`{}` has a vocabulary of {vocab} tokens; kiln sample writes bytes and needs 256 (a gpt trained on `data.kind = \"text\"`)",
            run_dir.display()
        )));
    }
    let store = checkpoint_store(run_dir)?;
    let path = require_checkpoint(&store, o.from.as_deref())?;
    let loaded = checkpoint::load(&path, &model.layout().specs()).map_err(Error::Checkpoint)?;
    if loaded.params.len() != model.num_params() {
        return Err(Error::Usage(format!(
            "{} holds {} parameters but the run's model has {}; was config.toml edited?",
            path.display(),
            loaded.params.len(),
            model.num_params()
        )));
    }
    let compute =
        <burn::backend::Autodiff<Flex> as ComputeOn>::compute(model.as_ref(), &Default::default());
    let mut context: Vec<u32> = o.prompt.bytes().map(u32::from).collect();
    if context.is_empty() {
        // nothing to continue: start from a newline, as a new paragraph would
        context.push(u32::from(b'\n'));
    }
    for &b in o.prompt.as_bytes() {
        on_byte(b);
    }
    let mut rng = Rng::stream(o.seed, "sample", &[]);
    for _ in 0..o.tokens {
        let window = &context[context.len().saturating_sub(block)..];
        let x = crate::data::Values::Tokens(window.to_vec());
        let logits = compute.logits(&loaded.params, &x, &[1, window.len()])?;
        let last = &logits[logits.len().saturating_sub(vocab)..];
        let scaled: Vec<f32> = last[..vocab.min(256)]
            .iter()
            .map(|&l| (f64::from(l) / o.temperature) as f32)
            .collect();
        let next = draw(&scaled, o.top_k, rng.next_f64());
        context.push(next as u32);
        on_byte(next as u8);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_follow_the_weights_and_top_k() {
        let logits = [0.0f32, 2.0, 1.0, -5.0];
        assert_eq!(draw(&logits, Some(1), 0.99), 1);
        // top 2 of e^2, e^1: below e^2/(e^2+e) is index 1, above is 2
        assert_eq!(draw(&logits, Some(2), 0.5), 1);
        assert_eq!(draw(&logits, Some(2), 0.9), 2);
        assert_eq!(draw(&logits, None, 0.0), 1);
    }
}
