//! The gpt's weights in GPT-2's formats: Hugging Face's `GPT2LMHeadModel` (`hf-gpt2`: Conv1D
//! weights `[in, out]`, the output layer `lm_head.weight` `[vocab, dim]`, and a `config.json`)
//! and nanoGPT's `GPT` (`nanogpt`: the same names, Linear weights `[out, in]`). `model::portable`
//! asks the family (`WeightAdapter::format_tensors` and the hooks beside it) instead of knowing them.

use super::Gpt;
use crate::model::portable::{External, FamilyFormat, WeightFormat};
use crate::model::ConfigMismatch;
use crate::params::ParamLayout;

/// Hugging Face's `GPT2LMHeadModel`: a directory, `model.safetensors` beside `config.json`.
pub const HF_GPT2: WeightFormat = WeightFormat::Family(FamilyFormat {
    name: "hf-gpt2",
    dir: true,
    renames: &[],
});

/// nanoGPT's `GPT` (`torch.compile`'s `_orig_mod.` prefix taken off when read).
pub const NANOGPT: WeightFormat = WeightFormat::Family(FamilyFormat {
    name: "nanogpt",
    dir: false,
    renames: &[("_orig_mod.", "")],
});

/// The formats the gpt reads and writes besides PyTorch's and Burn's names.
pub(super) const FORMATS: [WeightFormat; 2] = [HF_GPT2, NANOGPT];

/// GPT-2's name of a kiln gpt parameter (norm leaves already `weight`/`bias`): `wte.weight` is
/// `transformer.wte.weight`, `blocks.3.mlp_fc.bias` is `transformer.h.3.mlp.c_fc.bias`.
fn gpt2_name(path: &str) -> String {
    // an adapter: after the module it adapts (`transformer.h.3.attn.c_attn.lora_A.weight`)
    if let Some((module, rest)) = super::adapters::adapted_module(path) {
        return format!(
            "{}.{rest}",
            gpt2_name(&format!("{module}.x")).trim_end_matches(".x")
        );
    }
    if let Some(rest) = path.strip_prefix("blocks.") {
        let (i, tail) = rest.split_once('.').unwrap_or((rest, ""));
        let tail = if let Some(t) = tail.strip_prefix("c_attn.") {
            format!("attn.c_attn.{t}")
        } else if let Some(t) = tail.strip_prefix("c_proj.") {
            format!("attn.c_proj.{t}")
        } else if let Some(t) = tail.strip_prefix("mlp_fc.") {
            format!("mlp.c_fc.{t}")
        } else if let Some(t) = tail.strip_prefix("mlp_proj.") {
            format!("mlp.c_proj.{t}")
        } else {
            tail.to_string()
        };
        return format!("transformer.h.{i}.{tail}");
    }
    match path {
        "lm_head.weight" => path.to_string(),
        other => format!("transformer.{other}"),
    }
}

/// The buffers (not parameters) GPT-2 files may hold: the attention's causal mask
/// (`attn.bias`, `attn.masked_bias`), skipped on import.
pub(super) fn gpt2_buffer(name: &str) -> bool {
    name.starts_with("transformer.h.")
        && (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias"))
}

/// The tensors in `format`, from PyTorch's (`torch`, one per parameter in layout order).
pub(super) fn tensors(
    format: WeightFormat,
    layout: &ParamLayout,
    torch: &[External],
) -> Vec<External> {
    let mut out: Vec<External> = torch
        .iter()
        .map(|e| {
            let p = &layout.params[e.param];
            // the path as kiln names it, norm leaves renamed
            let (prefix, leaf) = p.name.rsplit_once('.').unwrap_or(("", &p.name));
            let leaf = e.name.rsplit('.').next().unwrap_or(leaf);
            let path = format!("{prefix}.{leaf}");
            // Hugging Face's Conv1D keeps Burn's [in, out]; its lm_head and every nanoGPT
            // Linear are PyTorch's [out, in]
            // (PEFT's adapters are Linears `[out, in]` whatever the layer they adapt)
            let adapter = crate::model::lora::is_adapter(&p.name);
            let transpose =
                e.transpose && (format == NANOGPT || p.name == "lm_head.weight" || adapter);
            External::stored(gpt2_name(&path), p, e.param, transpose)
        })
        .collect();
    // a tied output layer: `lm_head.weight` is the token embedding
    crate::model::portable::tie_alias(&mut out, "transformer.wte.weight", "lm_head.weight");
    out
}

/// GPT-2's format of a file with these tensors, told by `c_attn`'s shape: Hugging Face's
/// Conv1D `[dim, 3 dim]`, nanoGPT's Linear `[3 dim, dim]` (a compiled model's `_orig_mod.`
/// prefix ignored).
pub(super) fn detect(tensors: &[(&str, &[usize])]) -> Option<WeightFormat> {
    let gpt2: Vec<(std::borrow::Cow<str>, &[usize])> = tensors
        .iter()
        .map(|(name, shape)| (NANOGPT.strip(name), *shape))
        .filter(|(n, _)| n.starts_with("transformer.h."))
        .collect();
    if gpt2.is_empty() {
        return None;
    }
    // each Conv1D/Linear whose shape tells the layout votes: `c_attn` [d, 3d] or [3d, d],
    // `c_fc` [d, 4d] or [4d, d]; one mis-shaped tensor does not hide the others (issue 45,
    // defect 18), and GPT-2's names with no shape that tells are Hugging Face's (the import
    // then names the tensor that is wrong, not every name as missing)
    let (mut hf, mut nano) = (0, 0);
    for (n, shape) in &gpt2 {
        let ratio = if n.ends_with(".attn.c_attn.weight") {
            3
        } else if n.ends_with(".mlp.c_fc.weight") {
            4
        } else {
            continue;
        };
        match shape {
            [a, b] if *b == ratio * *a => hf += 1,
            [a, b] if *a == ratio * *b => nano += 1,
            _ => {}
        }
    }
    Some(if nano > hf { NANOGPT } else { HF_GPT2 })
}

/// Where a `GPT2LMHeadModel` config.json disagrees with `gpt` (issue 45, defect 17): the
/// sizes (which the tensors' shapes also show), the head count, the activation, the
/// LayerNorm epsilon and tied embeddings (which they do not). A key the file lacks is
/// `transformers`' default.
pub(super) fn mismatches(gpt: &Gpt, config: &serde_json::Value) -> Vec<ConfigMismatch> {
    use serde_json::{json, Value};
    let gelu = if gpt.gelu_tanh { "tanh" } else { "exact" };
    // (their key, transformers' default, kiln's value as theirs, the [model] key, kiln's value)
    let checks: [(&str, Value, Value, &str, String); 8] = [
        (
            "n_head",
            json!(12),
            json!(gpt.heads),
            "model.heads",
            gpt.heads.to_string(),
        ),
        (
            "n_layer",
            json!(12),
            json!(gpt.layers),
            "model.layers",
            gpt.layers.to_string(),
        ),
        (
            "n_embd",
            json!(768),
            json!(gpt.dim),
            "model.dim",
            gpt.dim.to_string(),
        ),
        (
            "n_positions",
            json!(1024),
            json!(gpt.block),
            "model.block_size",
            gpt.block.to_string(),
        ),
        (
            "vocab_size",
            json!(50257),
            json!(gpt.vocab),
            "model.vocab_size",
            gpt.vocab.to_string(),
        ),
        (
            "activation_function",
            json!("gelu_new"),
            json!(if gpt.gelu_tanh { "gelu_new" } else { "gelu" }),
            "model.gelu",
            format!("\"{gelu}\""),
        ),
        (
            "layer_norm_epsilon",
            json!(1e-5),
            json!(super::LN_EPS),
            "(kiln's LayerNorm epsilon)",
            super::LN_EPS.to_string(),
        ),
        (
            "tie_word_embeddings",
            json!(true),
            json!(gpt.tie),
            "model.tie_embeddings",
            gpt.tie.to_string(),
        ),
    ];
    let tanh = ["gelu_new", "gelu_pytorch_tanh", "gelu_fast"];
    checks
        .into_iter()
        .filter_map(|(key, default, ours, kiln_key, kiln_value)| {
            let theirs = config
                .get(key)
                .filter(|v| !v.is_null())
                .cloned()
                .unwrap_or(default);
            let same = match (&theirs, &ours) {
                (Value::String(a), Value::String(b)) if key == "activation_function" => {
                    tanh.contains(&a.as_str()) == tanh.contains(&b.as_str())
                        && (a == "gelu" || tanh.contains(&a.as_str()))
                }
                (Value::Number(a), Value::Number(b)) => {
                    let (a, b) = (
                        a.as_f64().unwrap_or(f64::NAN),
                        b.as_f64().unwrap_or(f64::NAN),
                    );
                    (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
                }
                (a, b) => a == b,
            };
            (!same).then(|| ConfigMismatch {
                theirs: key.to_string(),
                value: theirs.to_string(),
                key: kiln_key.to_string(),
                ours: kiln_value,
            })
        })
        .collect()
}

/// Hugging Face's `config.json` of `gpt` as a `GPT2LMHeadModel`, or why it cannot be one.
pub(super) fn config_json(gpt: &Gpt) -> Result<String, String> {
    if !gpt.bias {
        return Err("GPT-2 has biases in every Linear and LayerNorm, but the run set `model.bias = false`; export --format nanogpt (or pytorch) instead".into());
    }
    let (vocab, dropout) = (gpt.vocab, gpt.dropout);
    let config = serde_json::json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": vocab,
        "n_positions": gpt.block,
        "n_ctx": gpt.block,
        "n_embd": gpt.dim,
        "n_layer": gpt.layers,
        "n_head": gpt.heads,
        "n_inner": null,
        "activation_function": if gpt.gelu_tanh { "gelu_new" } else { "gelu" },
        "resid_pdrop": dropout,
        "embd_pdrop": dropout,
        "attn_pdrop": dropout,
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "scale_attn_weights": true,
        "tie_word_embeddings": gpt.tie,
        // GPT-2's end-of-text, where the vocabulary has it
        "bos_token_id": (vocab > 50256).then_some(50256),
        "eos_token_id": (vocab > 50256).then_some(50256),
        "torch_dtype": "float32",
    });
    Ok(serde_json::to_string_pretty(&config).unwrap_or_default() + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt_names_are_gpt2s() {
        for (kiln, hf) in [
            ("wte.weight", "transformer.wte.weight"),
            ("ln_f.bias", "transformer.ln_f.bias"),
            ("blocks.0.ln_1.weight", "transformer.h.0.ln_1.weight"),
            (
                "blocks.11.c_attn.weight",
                "transformer.h.11.attn.c_attn.weight",
            ),
            ("blocks.2.c_proj.bias", "transformer.h.2.attn.c_proj.bias"),
            ("blocks.2.mlp_fc.weight", "transformer.h.2.mlp.c_fc.weight"),
            ("blocks.2.mlp_proj.bias", "transformer.h.2.mlp.c_proj.bias"),
            ("lm_head.weight", "lm_head.weight"),
        ] {
            assert_eq!(gpt2_name(kiln), hf);
        }
        assert!(gpt2_buffer("transformer.h.3.attn.bias"));
        assert!(gpt2_buffer("transformer.h.3.attn.masked_bias"));
        assert!(!gpt2_buffer("transformer.h.3.attn.c_attn.bias"));
    }

    #[test]
    fn the_c_attn_shape_tells_hugging_face_from_nanogpt() {
        let hf: &[usize] = &[8, 24];
        let nano: &[usize] = &[24, 8];
        assert_eq!(
            detect(&[("transformer.h.0.attn.c_attn.weight", hf)]),
            Some(HF_GPT2)
        );
        assert_eq!(
            detect(&[("_orig_mod.transformer.h.0.attn.c_attn.weight", nano)]),
            Some(NANOGPT)
        );
        assert_eq!(detect(&[("fc.weight", hf)]), None);
        // one mis-shaped c_attn: the other blocks' (and c_fc's) shapes still tell
        let bad: &[usize] = &[8, 25];
        let fc: &[usize] = &[32, 8];
        assert_eq!(
            detect(&[
                ("transformer.h.0.attn.c_attn.weight", bad),
                ("transformer.h.0.mlp.c_fc.weight", fc),
            ]),
            Some(NANOGPT)
        );
        assert_eq!(
            detect(&[("transformer.h.0.attn.c_attn.weight", bad)]),
            Some(HF_GPT2)
        );
    }
}
