//! `kiln sample`'s work: text from a language model run's checkpoint on the run's backend (CPU,
//! CUDA or wgpu), encoded and decoded with the run's tokenizer (`data.tokenizer`), through its
//! family's decoder (`Family::decoder`). The parameters are installed once; with the gpt's
//! decoder each new token runs one position against the keys and values cached for the context
//! (`--no-cache`: the whole context again, for comparison). When the context fills the
//! block, it drops to its last `block / 2` tokens (the same with the cache or without, so both
//! give the same tokens). Each next token is drawn from softmax(logits / temperature) (greedy at
//! temperature 0), restricted to the `top_k` most likely and to the smallest set whose
//! probability reaches `top_p`, from one stream of kiln's RNG keyed by the seed, so a seed
//! always gives the same text. Generation stops at the tokenizer's end-of-text token (unless
//! told not to), at a stop sequence, or after `tokens` tokens.

use std::path::Path;
use std::time::Instant;

use crate::backend::RankBackend;
use crate::data::chat::ChatTemplate;
use crate::data::tokenizer::Tokenizer;
use crate::error::{Error, Result};
use crate::model::{Model, Task, TokenDecoder};
use crate::rng::Rng;
use crate::rundir::{checkpoint_store, run_config};

/// How to sample.
#[derive(Debug, Clone)]
pub struct SampleOptions {
    /// A checkpoint name (`step-00000600`) instead of the newest verified one.
    pub from: Option<String>,
    pub prompt: String,
    /// Tokens to generate at most.
    pub tokens: usize,
    /// 0: greedy (the most likely token each time).
    pub temperature: f64,
    pub top_k: Option<usize>,
    /// Nucleus sampling: the smallest set of most likely tokens whose probability reaches it.
    pub top_p: Option<f64>,
    /// Stop once the output ends with one of these.
    pub stop: Vec<String>,
    /// Go on past the tokenizer's end-of-text token.
    pub ignore_eos: bool,
    pub seed: u64,
    /// The KV cache (default); off: the whole context runs for every token.
    pub cache: bool,
    /// Token ids to continue instead of `prompt`'s text (`--prompt-ids`).
    pub prompt_ids: Option<Vec<u32>>,
    /// Hand no text to `on_bytes`: the generated ids come back in `SampleReport::ids`
    /// (`--ids`), drawn from the model's whole vocabulary.
    pub ids: bool,
    /// `--chat`: the prompt is a conversation, rendered with the run's chat template.
    pub chat: Option<ChatOptions>,
}

/// `--chat MESSAGE` (`-`: a turn per line of stdin, the conversation kept) and `--system`.
#[derive(Debug, Clone)]
pub struct ChatOptions {
    pub message: String,
    pub system: Option<String>,
}

/// What a sample did.
#[derive(Debug, Clone)]
pub struct SampleReport {
    pub tokens: usize,
    /// Seconds spent generating (after the prompt's prefill and the set-up).
    pub seconds: f64,
    /// Why it stopped before `tokens`: "end of text" or the stop sequence.
    pub stopped: Option<String>,
    /// The backend it ran on.
    pub backend: &'static str,
    /// The generated ids, in order.
    pub ids: Vec<u32>,
}

/// The index drawn from `logits` (already divided by the temperature), keeping the `top_k`
/// largest and then the smallest prefix whose probability reaches `top_p`, with `u` uniform in
/// [0, 1).
fn draw(logits: &[f32], top_k: Option<usize>, top_p: Option<f64>, u: f64) -> usize {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order.truncate(top_k.unwrap_or(logits.len()).clamp(1, logits.len().max(1)));
    let max = f64::from(logits[order[0]]);
    let mut weights: Vec<f64> = order
        .iter()
        .map(|&i| (f64::from(logits[i]) - max).exp())
        .collect();
    if let Some(p) = top_p {
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        let keep = weights
            .iter()
            .position(|w| {
                acc += w / total;
                acc >= p
            })
            .map_or(weights.len(), |i| i + 1);
        weights.truncate(keep);
        order.truncate(keep);
    }
    let mut target = u * weights.iter().sum::<f64>();
    for (&i, w) in order.iter().zip(&weights) {
        if target < *w {
            return i;
        }
        target -= w;
    }
    order[order.len() - 1]
}

/// The most likely index (the first of equals).
fn argmax(logits: &[f32]) -> usize {
    logits
        .iter()
        .enumerate()
        .fold(0, |best, (i, &v)| if v > logits[best] { i } else { best })
}

/// Generates up to `o.tokens` tokens after `o.prompt` from the language model run in `run_dir`, handing
/// the prompt's bytes and then each new token's bytes to `on_bytes`, which returns false to
/// stop (its reader is gone: `| head`).
pub fn sample(
    run_dir: &Path,
    o: &SampleOptions,
    on_bytes: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<SampleReport> {
    if !(o.temperature >= 0.0 && o.temperature.is_finite()) {
        return Err(Error::Usage(format!(
            "--temperature {} must be 0 (greedy) or above (lower is more predictable)",
            o.temperature
        )));
    }
    if o.top_k == Some(0) {
        return Err(Error::Usage("--top-k must be at least 1".into()));
    }
    if let Some(p) = o.top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(Error::Usage(format!("--top-p {p} must be in (0, 1]")));
        }
    }
    let r = run_config(run_dir)?;
    // the tokenizer the run was trained with, not one replaced since (issue 45, defect 14)
    crate::rundir::inputs::refuse_changed(
        run_dir,
        &r,
        Some(&crate::rundir::inputs::TOKENIZER_KEYS),
        "kiln sample",
    )?;
    let store = checkpoint_store(run_dir)?;
    let (_, (_, model, loaded)) =
        crate::launch::read_model_checkpoint(&store, o.from.as_deref(), &r)?;
    let Task::LanguageModel { vocab, block } = model.task() else {
        return Err(Error::Usage(format!(
            "kiln sample generates text from a language model, but `{}` trained model.kind = \"{}\", a classifier",
            run_dir.display(),
            model.kind()
        )));
    };
    let tokenizer =
        crate::data::tokenizer::from_config(&r).map_err(|e| Error::Usage(e.to_string()))?;
    if tokenizer.vocab_size() > vocab {
        return Err(Error::Usage(format!(
            "`{}` has a vocabulary of {} tokens, fewer than its tokenizer `{}` makes ({})",
            run_dir.display(),
            vocab,
            tokenizer.name(),
            tokenizer.vocab_size()
        )));
    }
    let template = match &o.chat {
        Some(_) => Some(chat_template(&r, &tokenizer, run_dir)?),
        None => None,
    };
    let placement = crate::backend::resolve(&r.config)?;
    let trained = Trained {
        model: model.as_ref(),
        block,
        params: &loaded.params,
        tokenizer: &tokenizer,
        template: template.as_ref(),
    };
    macro_rules! dispatch {
        ($($(#[$a:meta])* $v:ident = $name:literal => $ty:ty),* $(,)?) => {
            match placement.backend {
                $($(#[$a])* crate::backend::BackendKind::$v => generate::<$ty>(
                    &r.config.backend, placement.ordinals.first().copied().unwrap_or(0),
                    trained, o, on_bytes, $name),)*
            }
        };
    }
    crate::model::for_each_backend!(dispatch)
}

/// What the run trained, to sample from.
#[derive(Clone, Copy)]
struct Trained<'a> {
    model: &'a dyn Model,
    /// The model's context window (`Task::LanguageModel`'s block).
    block: usize,
    params: &'a [f32],
    tokenizer: &'a Tokenizer,
    /// `--chat`'s template.
    template: Option<&'a ChatTemplate>,
}

/// The chat template of the run (`data.chat_template`, or the tokenizer's), for `--chat`.
fn chat_template(
    r: &crate::config::Resolved,
    tokenizer: &Tokenizer,
    run_dir: &Path,
) -> Result<ChatTemplate> {
    let file = crate::data::chat::template_file(r);
    match ChatTemplate::find(file.as_deref(), tokenizer).map_err(Error::Usage)? {
        Some(t) => Ok(t),
        None => Err(Error::Usage(format!(
            "--chat renders the conversation with a chat template, but the run `{}` has none (its tokenizer {} has no chat_template.jinja beside it nor a `chat_template` in its tokenizer_config.json)\n  = help: train with `data.chat_template` set, or sample with --prompt",
            run_dir.display(),
            crate::ui::printable(&tokenizer.name())
        ))),
    }
}

/// `sample` on backend `B`.
fn generate<B: RankBackend>(
    be: &crate::config::BackendConfig,
    ordinal: usize,
    trained: Trained<'_>,
    o: &SampleOptions,
    on_bytes: &mut dyn FnMut(&[u8]) -> bool,
    backend: &'static str,
) -> Result<SampleReport> {
    let Trained { model, block, .. } = trained;
    let (params, tokenizer) = (trained.params, trained.tokenizer);
    let device = B::rank_device(be, ordinal);
    B::prepare(&device, be.precision).map_err(Error::Usage)?;
    let dec = crate::model::decoder_on::<B::InnerBackend>(model, params, &device, o.cache, be.fused)?
        .ok_or_else(|| {
            Error::Usage(format!(
                "model.kind = \"{}\" has no decoder for kiln sample (its family does not implement `Family::decoder`)",
                model.kind()
            ))
        })?;
    let vocab = if o.ids {
        model.task().classes()
    } else {
        tokenizer.vocab_size()
    };
    let mut g = Generator {
        dec,
        block,
        vocab,
        tokenizer,
        o,
        rng: Rng::stream(o.seed, "sample", &[]),
    };
    let start = Instant::now();
    let (made, ids, stopped) = match (&o.chat, trained.template) {
        (Some(chat), Some(t)) => g.chat(chat, t, on_bytes)?,
        _ => {
            let (mut context, prompt_text) = prompt(model, tokenizer, o)?;
            let open = o.ids || on_bytes(&prompt_text);
            if context.is_empty() {
                // nothing to continue: a new document (GPT-2's end-of-text) or a new paragraph
                context.push(tokenizer.eot().unwrap_or(u32::from(b'\n')));
            }
            let stops: Vec<u32> = tokenizer.eot().into_iter().collect();
            let r = g.reply(context, &stops, open, false, on_bytes)?;
            (r.ids.len(), r.ids, r.stopped)
        }
    };
    Ok(SampleReport {
        tokens: made,
        seconds: start.elapsed().as_secs_f64(),
        stopped,
        backend,
        ids,
    })
}

/// A reply: its ids (the stop id last, where one stopped it), its text, why it stopped, and
/// whether the reader is still there.
struct Reply {
    ids: Vec<u32>,
    text: Vec<u8>,
    stopped: Option<String>,
    open: bool,
}

/// Generates from a decoder: one reply at a time.
struct Generator<'a> {
    dec: Box<dyn TokenDecoder + 'a>,
    block: usize,
    /// Ids drawn from: below the tokenizer's vocabulary (or the model's, with `--ids`).
    vocab: usize,
    tokenizer: &'a Tokenizer,
    o: &'a SampleOptions,
    rng: Rng,
}

impl Generator<'_> {
    /// Up to `o.tokens` ids after `context`, each one's text handed to `on_bytes` (decoded
    /// after the context's, or, `alone`, as the reply's own text: transformers'
    /// `decode(new_ids)`); an id of `stops` ends it (unless `--ignore-eos`), as does a stop
    /// sequence or a reader gone.
    fn reply(
        &mut self,
        mut context: Vec<u32>,
        stops: &[u32],
        mut open: bool,
        alone: bool,
        on_bytes: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<Reply> {
        let (o, block, tokenizer) = (self.o, self.block, self.tokenizer);
        if context.len() > block {
            context.drain(..context.len() - block);
        }
        let mut logits = self.dec.prefill(&context)?;
        // each token's text decoded after the ones before it (issue 45, defect 15)
        let before: &[u32] = if alone { &[] } else { &context };
        let mut text = crate::data::tokenizer::StreamDecoder::new(tokenizer, before);
        let mut out: Vec<u8> = Vec::new();
        let mut ids = Vec::new();
        // (a reader gone before the first token: nothing is generated)
        let mut stopped = (!open).then(|| "a closed output".to_string());
        while ids.len() < o.tokens && open {
            // (a padded vocabulary's extra rows are never drawn)
            let next = self.next(&logits[..self.vocab.min(logits.len())]);
            ids.push(next);
            if !o.ignore_eos && stops.contains(&next) {
                stopped = Some("end of text".to_string());
                break;
            }
            let bytes = if o.ids {
                Vec::new()
            } else {
                text.push(next).map_err(Error::Usage)?
            };
            // a reader that is gone stops the generation (issue 45, defect 16)
            open = o.ids || on_bytes(&bytes);
            if !open {
                stopped = Some("a closed output".to_string());
                break;
            }
            out.extend_from_slice(&bytes);
            if let Some(s) = o.stop.iter().find(|s| out.ends_with(s.as_bytes())) {
                stopped = Some(format!("stop sequence {s:?}"));
                break;
            }
            if ids.len() == o.tokens {
                break;
            }
            logits = if self.dec.context().len() >= block {
                // the context is full: drop to its last half, then this token
                let mut ctx = dec_context(self.dec.as_ref(), block / 2);
                ctx.push(next);
                self.dec.prefill(&ctx)?
            } else {
                self.dec.step(next)?
            };
        }
        // (an incomplete character held back at the end)
        if open && !o.ids {
            let rest = text.finish().map_err(Error::Usage)?;
            if !rest.is_empty() {
                open = on_bytes(&rest);
                out.extend_from_slice(&rest);
            }
        }
        Ok(Reply {
            ids,
            text: out,
            stopped,
            open,
        })
    }

    /// The next id from `row`'s logits: the most likely at temperature 0, else drawn.
    fn next(&mut self, row: &[f32]) -> u32 {
        let o = self.o;
        if o.temperature == 0.0 {
            return argmax(row) as u32;
        }
        let mut scaled: Vec<f32> = row
            .iter()
            .map(|&l| (f64::from(l) / o.temperature) as f32)
            .collect();
        if scaled.iter().any(|v| !v.is_finite()) {
            // a tiny temperature overflows f32 (1e-45 drew the least likely token): shifted
            // by the largest logit first, in f64, the others become -inf (probability 0),
            // never +inf, which tends to greedy as the temperature does
            let top = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            scaled = row
                .iter()
                .map(|&l| ((f64::from(l) - f64::from(top)) / o.temperature) as f32)
                .collect();
        }
        if scaled.iter().any(|v| v.is_nan()) || !scaled.iter().any(|v| v.is_finite()) {
            argmax(row) as u32
        } else {
            draw(&scaled, o.top_k, o.top_p, self.rng.next_f64()) as u32
        }
    }

    /// `--chat`: each user turn (the message, or each line of stdin for `-`) rendered with the
    /// conversation so far and the generation prompt; the reply, to the template's end of turn
    /// or the EOS id, is printed alone and kept in the conversation.
    fn chat(
        &mut self,
        chat: &ChatOptions,
        t: &ChatTemplate,
        on_bytes: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<(usize, Vec<u32>, Option<String>)> {
        let tokenizer = self.tokenizer;
        let end_of_turn = t.end_of_turn(tokenizer);
        let mut stops: Vec<u32> = tokenizer.eos().map(|(id, _)| id).into_iter().collect();
        stops.extend(end_of_turn);
        stops.extend(tokenizer.eot());
        let mut messages: Vec<serde_json::Value> = chat
            .system
            .iter()
            .map(|s| serde_json::json!({"role": "system", "content": s}))
            .collect();
        let turns: Box<dyn Iterator<Item = std::io::Result<String>>> = if chat.message == "-" {
            Box::new(std::io::stdin().lines())
        } else {
            Box::new(std::iter::once(Ok(chat.message.clone())))
        };
        let (mut made, mut all, mut stopped) = (0, Vec::new(), None);
        for turn in turns {
            let turn = turn.map_err(|e| Error::io("reading a turn from stdin", e))?;
            if turn.trim().is_empty() {
                continue;
            }
            messages.push(serde_json::json!({"role": "user", "content": turn}));
            let (text, _) = t.render(&messages, true).map_err(Error::Usage)?;
            let (context, _) = tokenizer.encode_offsets(&text).map_err(Error::Usage)?;
            let r = self.reply(context, &stops, true, true, on_bytes)?;
            made += r.ids.len();
            all.extend(&r.ids);
            stopped = match r.stopped {
                Some(s) if s == "end of text" && r.ids.last() == end_of_turn.as_ref() => {
                    Some("the template's end of turn".to_string())
                }
                s => s,
            };
            // a turn per line: each reply (or, `--ids`, its ids as a JSON list) on a line
            let end = if self.o.ids {
                format!("{}\n", serde_json::to_string(&r.ids).unwrap_or_default())
            } else {
                "\n".to_string()
            };
            if !r.open || (chat.message == "-" && !on_bytes(end.as_bytes())) {
                break;
            }
            let reply = String::from_utf8_lossy(&r.text).into_owned();
            messages.push(serde_json::json!({"role": "assistant", "content": reply}));
        }
        Ok((made, all, stopped))
    }
}

/// The prompt's ids (`--prompt-ids`, each below the model's vocabulary, or `--prompt`'s text
/// tokenized) and the text to show for it (none with `--ids`).
fn prompt(
    model: &dyn Model,
    tokenizer: &Tokenizer,
    o: &SampleOptions,
) -> Result<(Vec<u32>, Vec<u8>)> {
    Ok(match &o.prompt_ids {
        Some(ids) => {
            let vocab = model.task().classes();
            if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
                return Err(Error::Usage(format!(
                    "--prompt-ids: id {bad} is not below the model's vocabulary size {vocab}"
                )));
            }
            let text = if o.ids {
                Vec::new()
            } else {
                tokenizer
                    .decode(ids)
                    .map_err(|e| Error::Usage(format!("--prompt-ids: {e}")))?
            };
            (ids.clone(), text)
        }
        None => (
            tokenizer
                .encode(o.prompt.as_bytes())
                .map_err(|e| Error::Usage(format!("--prompt: {e}")))?
                .0,
            o.prompt.as_bytes().to_vec(),
        ),
    })
}

/// The last `keep` ids of the decoder's context.
fn dec_context(dec: &dyn TokenDecoder, keep: usize) -> Vec<u32> {
    let c = dec.context();
    c[c.len().saturating_sub(keep)..].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_follow_the_weights_and_top_k() {
        let logits = [0.0f32, 2.0, 1.0, -5.0];
        assert_eq!(draw(&logits, Some(1), None, 0.99), 1);
        // top 2 of e^2, e^1: below e^2/(e^2+e) is index 1, above is 2
        assert_eq!(draw(&logits, Some(2), None, 0.5), 1);
        assert_eq!(draw(&logits, Some(2), None, 0.9), 2);
        assert_eq!(draw(&logits, None, None, 0.0), 1);
        // top-p: p(1) = e^2 / (1 + e^2 + e + e^-5) = 0.665, so 0.6 keeps index 1 alone and 0.7
        // adds index 2 (0.245 more)
        assert_eq!(draw(&logits, None, Some(0.6), 0.99), 1);
        assert_eq!(draw(&logits, None, Some(0.7), 0.99), 2);
        assert_eq!(argmax(&[0.0, 3.0, 3.0, 1.0]), 1);
    }
}
