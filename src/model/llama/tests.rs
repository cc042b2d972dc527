//! The llama's own tests: its fused path against Burn's ops, packed documents, the parameter
//! count, Llama 3's rope scaling.

use burn::backend::{Autodiff, Flex};

use super::*;
use crate::data::Values;
use crate::model::{ComputeOn, FamilyModel, Model};

pub(super) fn tiny(kv_heads: usize, tie: bool) -> Llama {
    Llama {
        arch: Arch::Llama,
        vocab: 64,
        block: 8,
        layers: 2,
        heads: 4,
        kv_heads,
        dim: 16,
        ffn_dim: 24,
        rope_theta: 10_000.0,
        rope_scaling: None,
        norm_eps: 1e-5,
        tie,
        attn_bias: false,
        dropout: 0.0,
        lora: None,
        head_dim: 4,
        sliding_window: None,
        sliding: vec![false; 2],
        rope_local_theta: 10_000.0,
        query_scale: 0.5,
        moe: None,
        cache: MaskCache::default(),
    }
}

/// A position's logits depend on the tokens up to it only, and the fused kernels give the
/// logits Burn's ops give.
#[test]
fn causal_and_the_fused_path_agrees_with_burns_ops() {
    for (kv, tie) in [(2, false), (4, true), (1, false)] {
        let m = FamilyModel::new(tiny(kv, tie));
        let compute = <Autodiff<Flex> as ComputeOn>::compute(&m, &Default::default(), true);
        let params = m.init(5);
        let x = Values::Tokens(vec![7, 8, 9, 10]);
        let a = compute.logits(&params, &x, &[1, 4]).unwrap();
        let b = compute
            .logits(&params, &Values::Tokens(vec![7, 8, 9, 60]), &[1, 4])
            .unwrap();
        assert_eq!(a[..3 * 64], b[..3 * 64]);
        assert_ne!(a[3 * 64..], b[3 * 64..]);
        // Burn's own ops: a compute made without the fused kernels
        let plain = <Autodiff<Flex> as ComputeOn>::compute(&m, &Default::default(), false)
            .logits(&params, &x, &[1, 4])
            .unwrap();
        for (x, y) in a.iter().zip(&plain) {
            assert!(
                (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                "kv {kv}: {x} vs {y}"
            );
        }
    }
}

/// Over packed rows each position takes the rotary angles of its place in its document
/// (RoPE's scores depend on distances only, so the logits test above cannot see them).
#[test]
fn packed_positions_take_their_documents_angles() {
    let l = tiny(2, false);
    let dev = Default::default();
    let starts: crate::kernels::Starts = vec![0u32, 0, 0, 0, 0, 2].into();
    let ctx = Forward::eval().with_segments(Some(starts));
    let (cos, sin) = l.rotary::<Flex>(0, (2, 3), &ctx, &dev, false);
    let (cos0, sin0) = l.rotary::<Flex>(0, (1, 3), &Forward::eval(), &dev, false);
    let v = |x: Tensor<Flex, 4>| x.into_data().convert::<f32>().into_vec::<f32>().unwrap();
    let (c, s, c0, s0) = (v(cos), v(sin), v(cos0), v(sin0));
    let hd = l.head_dim;
    // row 1: two documents, positions 0, 1 and 0
    for (j, p) in [0, 1, 2, 0, 1, 0].into_iter().enumerate() {
        assert_eq!(
            c[j * hd..(j + 1) * hd],
            c0[p * hd..(p + 1) * hd],
            "token {j}"
        );
        assert_eq!(
            s[j * hd..(j + 1) * hd],
            s0[p * hd..(p + 1) * hd],
            "token {j}"
        );
    }
}

#[test]
fn packed_documents_get_their_own_logits() {
    for kv in [4, 2] {
        crate::model::packed_tests::each_document_gets_its_own_logits(tiny(kv, false), 64);
    }
}

/// The count the memory check uses before building is the built model's.
#[test]
fn the_parameters_counted_before_the_build_are_the_models() {
    for (kv, tie, bias) in [(2, false, false), (4, true, true), (1, false, true)] {
        let mut l = tiny(kv, tie);
        l.attn_bias = bias;
        let counted = l.param_count();
        assert_eq!(counted, FamilyModel::new(l).num_params() as u128);
    }
}

/// Llama 3.1's scaling keeps high frequencies, divides low ones by the factor and blends
/// between (the values transformers' `_compute_llama3_parameters` gives for these settings).
#[test]
fn llama3_scaling_splits_the_frequencies_in_three() {
    let mut l = tiny(2, false);
    l.dim = 32;
    l.head_dim = 8;
    l.rope_scaling = Some(RopeScaling::llama3(8.0, 1.0, 4.0, 16));
    let f = l.inv_freq();
    // wavelengths 2 pi, 62.8, 628, 6283 against 16 / 1 and 16 / 4
    let smooth = (16.0 / (2.0 * std::f64::consts::PI) - 1.0) / 3.0;
    let want = [
        (1.0 - smooth) / 8.0 + smooth,
        0.1 / 8.0,
        0.01 / 8.0,
        0.001 / 8.0,
    ];
    for (a, b) in f.iter().zip(want) {
        assert!((a - b).abs() < 1e-12, "{f:?}");
    }
}

/// What a config.json asks for that no llama-family kind computes is named, whatever the
/// value's JSON type; what computes the same (null, 0 soft-capping, a factor of 1) is not.
#[test]
fn unsupported_settings_are_named_whatever_their_json_type() {
    use serde_json::json;
    let named = |c: serde_json::Value| -> Vec<(String, String)> {
        hf::unsupported(&c, "llama")
            .into_iter()
            .map(|m| (m.theirs, m.value))
            .collect()
    };
    let one = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
    assert!(named(json!({})).is_empty());
    assert!(named(json!({
        "final_logit_softcapping": null, "attn_logit_softcapping": 0.0,
        "router_jitter_noise": 0, "use_bidirectional_attention": false,
        "partial_rotary_factor": 1.0, "rope_parameters": {"partial_rotary_factor": null}
    }))
    .is_empty());
    assert_eq!(
        named(json!({"final_logit_softcapping": 30.0})),
        one("final_logit_softcapping", "30.0")
    );
    assert_eq!(
        named(json!({"use_bidirectional_attention": true})),
        one("use_bidirectional_attention", "true")
    );
    assert_eq!(
        named(json!({"partial_rotary_factor": 0.5})),
        one("partial_rotary_factor", "0.5")
    );
    assert_eq!(
        named(json!({"partial_rotary_factor": "0.5"})),
        one("partial_rotary_factor", "\"0.5\"")
    );
    assert_eq!(
        named(
            json!({"partial_rotary_factor": null, "rope_parameters": {"partial_rotary_factor": 0.25}})
        ),
        one("partial_rotary_factor", "0.25")
    );
}

/// Linear scaling divides every frequency by the factor (transformers'
/// `_compute_linear_scaling_rope_parameters`), on the global layers alone: Gemma 3's sliding
/// layers keep their base, and a config.json that scales them is named, as is a rotary type
/// kiln does not compute.
#[test]
fn linear_scaling_divides_the_global_layers_frequencies() {
    let mut l = tiny(2, false);
    let plain = l.inv_freq();
    l.rope_scaling = Some(RopeScaling::linear(8.0));
    for (a, b) in l.inv_freq().iter().zip(&plain) {
        assert!((a * 8.0 - b).abs() < 1e-15);
    }
    assert_eq!(l.inv_freq_of(l.rope_local_theta, false), plain);
    l.arch = Arch::Gemma3;
    let types = |c: serde_json::Value| -> Vec<String> {
        hf::mismatches(&l, &c)
            .into_iter()
            .filter(|m| m.theirs == "rope_type")
            .map(|m| m.value)
            .collect()
    };
    let gemma = |global: &str, local: &str| {
        serde_json::json!({"model_type": "gemma3_text", "rope_parameters": {
            "full_attention": {"rope_type": global, "factor": 8.0},
            "sliding_attention": {"rope_type": local, "factor": 8.0}}})
    };
    assert!(types(gemma("linear", "default")).is_empty());
    assert_eq!(types(gemma("linear", "linear")), ["\"linear\""]);
    assert_eq!(types(gemma("yarn", "default")), ["\"yarn\""]);
}
