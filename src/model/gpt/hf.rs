//! The gpt's weights in GPT-2's formats: Hugging Face's `GPT2LMHeadModel` (`hf-gpt2`: Conv1D
//! weights `[in, out]`, the output layer `lm_head.weight` `[vocab, dim]`, and a `config.json`)
//! and nanoGPT's `GPT` (`nanogpt`: the same names, Linear weights `[out, in]`). `model::portable`
//! asks the family (`Family::format_tensors` and the hooks beside it) instead of knowing them.

use super::Gpt;
use crate::model::portable::{External, FamilyFormat, WeightFormat};
use crate::params::ParamLayout;

/// Hugging Face's `GPT2LMHeadModel`: a directory, `model.safetensors` beside `config.json`.
pub const HF_GPT2: WeightFormat = WeightFormat::Family(FamilyFormat {
    name: "hf-gpt2",
    dir: true,
    prefix: None,
});

/// nanoGPT's `GPT` (`torch.compile`'s `_orig_mod.` prefix taken off when read).
pub const NANOGPT: WeightFormat = WeightFormat::Family(FamilyFormat {
    name: "nanogpt",
    dir: false,
    prefix: Some("_orig_mod."),
});

/// The formats the gpt reads and writes besides PyTorch's and Burn's names.
pub(super) const FORMATS: [WeightFormat; 2] = [HF_GPT2, NANOGPT];

/// GPT-2's name of a kiln gpt parameter (norm leaves already `weight`/`bias`): `wte.weight` is
/// `transformer.wte.weight`, `blocks.3.mlp_fc.bias` is `transformer.h.3.mlp.c_fc.bias`.
fn gpt2_name(path: &str) -> String {
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
            let transpose = e.transpose && (format == NANOGPT || p.name == "lm_head.weight");
            External::stored(gpt2_name(&path), p, e.param, transpose)
        })
        .collect();
    if let Some(src) = out
        .iter()
        .find(|e| e.name == "transformer.wte.weight")
        .cloned()
        .filter(|_| !out.iter().any(|e| e.name == "lm_head.weight"))
    {
        // a tied output layer: `lm_head.weight` is the token embedding
        out.push(External {
            name: "lm_head.weight".into(),
            alias: true,
            ..src
        });
    }
    out
}

/// GPT-2's format of a file with these tensors, told by `c_attn`'s shape: Hugging Face's
/// Conv1D `[dim, 3 dim]`, nanoGPT's Linear `[3 dim, dim]` (a compiled model's `_orig_mod.`
/// prefix ignored).
pub(super) fn detect(tensors: &[(&str, &[usize])]) -> Option<WeightFormat> {
    let attn = tensors.iter().find(|(name, _)| {
        let n = NANOGPT.strip(name);
        n.starts_with("transformer.h.") && n.ends_with(".attn.c_attn.weight")
    })?;
    match attn.1 {
        [a, b] if *b == 3 * *a => Some(HF_GPT2),
        [a, b] if *a == 3 * *b => Some(NANOGPT),
        _ => None,
    }
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
    }
}
