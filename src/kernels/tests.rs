//! Each fused op against Burn's own ops on random inputs of awkward shapes (one head, a head of
//! one channel, one sample, lengths that are no multiple of any block or vector width): the
//! forward and the gradient of every input within 1e-5 of the reference, relative to the
//! reference's largest value.

use burn::backend::{Autodiff, Flex};
use burn::tensor::activation::{gelu, log_softmax, softmax};
use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive};

use std::sync::Arc;

use super::*;

type Ad = Autodiff<Flex>;

/// Deterministic values in [-scale, scale).
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn leaf<const D: usize>(shape: [usize; D], seed: u64, scale: f32) -> Tensor<Ad, D> {
    let n = shape.iter().product();
    Tensor::<Ad, D>::from_data(
        TensorData::new(values(n, seed, scale), shape),
        &Default::default(),
    )
    .require_grad()
}

fn vec_of<const D: usize>(t: Tensor<Flex, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

/// `a` within 1e-5 of `b`, relative to `b`'s largest magnitude.
fn close(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let top = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(
        worst <= 1e-5 * top,
        "{what}: worst difference {worst:e} against a largest value of {top:e}"
    );
    assert!(a.iter().all(|v| v.is_finite()), "{what}: not finite");
}

/// Compares `fused(inputs)` with `reference(inputs)`: the outputs, and the gradients of every
/// input for the loss sum(y * w) with a random `w`.
fn compare<const D: usize, const O: usize>(
    what: &str,
    inputs: Vec<Tensor<Ad, D>>,
    fused: impl Fn(Vec<Tensor<Ad, D>>) -> Tensor<Ad, O>,
    reference: impl Fn(Vec<Tensor<Ad, D>>) -> Tensor<Ad, O>,
) {
    let run = |f: &dyn Fn(Vec<Tensor<Ad, D>>) -> Tensor<Ad, O>| {
        let xs: Vec<Tensor<Ad, D>> = inputs
            .iter()
            .map(|x| Tensor::from_inner(x.clone().inner()).require_grad())
            .collect();
        let y = f(xs.clone());
        let w = Tensor::<Ad, O>::from_data(
            TensorData::new(values(y.shape().num_elements(), 99, 1.0), y.shape()),
            &Default::default(),
        );
        let out = vec_of(y.clone().inner());
        let grads = (y * w).sum().backward();
        let g: Vec<Vec<f32>> = xs
            .iter()
            .map(|x| x.grad(&grads).map(vec_of).unwrap_or_default())
            .collect();
        (out, g)
    };
    let (a, ga) = run(&fused);
    let (b, gb) = run(&reference);
    close(&format!("{what}: forward"), &a, &b);
    for (i, (x, y)) in ga.iter().zip(&gb).enumerate() {
        close(&format!("{what}: gradient of input {i}"), x, y);
    }
}

/// Burn's causal attention from `qkv` `[n, t, 3 dim]`.
fn attention_ops(qkv: Tensor<Ad, 3>, heads: usize) -> Tensor<Ad, 3> {
    let [n, t, _] = qkv.dims();
    document_attention_ops(qkv, heads, &vec![0; n * t])
}

#[test]
fn attention_matches_burns_ops() {
    for (n, t, heads, hd) in [
        (1, 1, 1, 1),
        (2, 7, 3, 5),
        (1, 33, 1, 4),
        (3, 17, 2, 1),
        (2, 64, 4, 8),
        (1, 128, 2, 4),
        (2, 150, 1, 3),
        (1, 65, 2, 2),
    ] {
        let qkv = leaf([n, t, 3 * heads * hd], (n * t * heads * hd) as u64, 2.0);
        compare(
            &format!("attention n={n} t={t} heads={heads} hd={hd}"),
            vec![qkv],
            |x| causal_attention(x[0].clone(), heads).expect("flex f32"),
            |x| attention_ops(x[0].clone(), heads),
        );
    }
}

/// Burn's attention from `qkv` `[n, t, 3 dim]` inside documents: position i of row b sees
/// the keys from `starts[b * t + i]` to i.
fn document_attention_ops(qkv: Tensor<Ad, 3>, heads: usize, starts: &[u32]) -> Tensor<Ad, 3> {
    let [n, t, three] = qkv.dims();
    let d = three / 3;
    let hd = d / heads;
    let split = |i: usize| {
        qkv.clone()
            .slice([0..n, 0..t, i * d..(i + 1) * d])
            .reshape([n, t, heads, hd])
            .swap_dims(1, 2)
    };
    let (q, k, v) = (split(0), split(1), split(2));
    let mask: Vec<f32> = (0..n * t * t)
        .map(|x| {
            let (b, i, j) = (x / (t * t), x / t % t, x % t);
            let lo = starts[b * t + i] as usize;
            if j > i || j < lo {
                -1e9
            } else {
                0.0
            }
        })
        .collect();
    let mask = Tensor::<Ad, 4>::from_data(TensorData::new(mask, [n, 1, t, t]), &Default::default());
    let att = q.matmul(k.swap_dims(2, 3)).div_scalar((hd as f64).sqrt()) + mask;
    softmax(att, 3).matmul(v).swap_dims(1, 2).reshape([n, t, d])
}

/// Document starts for rows of `t` positions made of documents of `lens` (row by row).
fn starts_of(rows: &[&[usize]], t: usize) -> Starts {
    let mut out = Vec::new();
    for lens in rows {
        let mut at = 0;
        for &l in lens.iter() {
            out.extend(std::iter::repeat_n(at as u32, l));
            at += l;
        }
        // (padding after the last document: a document of its own)
        out.extend(std::iter::repeat_n(at as u32, t - at));
    }
    out.into()
}

#[test]
fn document_attention_matches_burns_ops_with_a_block_diagonal_mask() {
    let cases: [(&[&[usize]], usize, usize, usize); 4] = [
        (&[&[3, 4]], 7, 2, 3),
        (&[&[1, 1, 1], &[2, 1]], 3, 1, 2),
        (&[&[70, 10, 20], &[100]], 100, 2, 4),
        (&[&[5], &[2, 2], &[1, 3]], 5, 3, 1),
    ];
    for (rows, t, heads, hd) in cases {
        let n = rows.len();
        let starts = starts_of(rows, t);
        let qkv = leaf([n, t, 3 * heads * hd], (n * t * heads * hd + 3) as u64, 2.0);
        compare(
            &format!("document attention {rows:?} heads={heads} hd={hd}"),
            vec![qkv],
            |x| document_attention(x[0].clone(), heads, Some(starts.clone())).expect("flex f32"),
            |x| document_attention_ops(x[0].clone(), heads, &starts),
        );
    }
}

#[test]
fn a_document_in_a_packed_row_gets_the_attention_it_has_alone() {
    // a row of documents of 5, 9 and 2 positions; the second alone is a row of 9
    let (heads, hd, t) = (2, 3, 16);
    let d3 = 3 * heads * hd;
    let packed = values(t * d3, 11, 2.0);
    let alone = packed[5 * d3..14 * d3].to_vec();
    let tensor = |v: Vec<f32>, t: usize| {
        Tensor::<Flex, 3>::from_data(TensorData::new(v, [1, t, d3]), &Default::default())
    };
    let starts = starts_of(&[&[5, 9, 2]], t);
    let y = vec_of(document_attention(tensor(packed, t), heads, Some(starts)).unwrap());
    let y_alone = vec_of(causal_attention(tensor(alone, 9), heads).unwrap());
    let d = heads * hd;
    close(
        "the packed row's second document",
        &y[5 * d..14 * d],
        &y_alone,
    );
    // starts that do not fit the shape are refused (the caller runs Burn's ops)
    let bad: Starts = vec![0u32; t - 1].into();
    assert!(document_attention(tensor(values(t * d3, 1, 1.0), t), heads, Some(bad)).is_none());
    let ahead: Starts = (0..t as u32).map(|i| i + 1).collect::<Vec<_>>().into();
    assert!(document_attention(tensor(values(t * d3, 1, 1.0), t), heads, Some(ahead)).is_none());
}

#[test]
fn layer_norm_matches_burns_op() {
    for (rows, d, bias) in [
        (1, 1, true),
        (5, 3, false),
        (13, 17, true),
        (40, 128, false),
        (3, 700, true),
    ] {
        let x = leaf([rows, 1, d], rows as u64, 3.0);
        let params = |x: &[Tensor<Ad, 3>]| {
            let g: Tensor<Ad, 1> = x[1].clone().reshape([d]);
            let b: Tensor<Ad, 1> = x[2].clone().reshape([d]);
            (g, bias.then_some(b))
        };
        let inputs = vec![x, leaf([1, 1, d], 5, 1.0), leaf([1, 1, d], 6, 1.0)];
        compare(
            &format!("layer_norm rows={rows} d={d} bias={bias}"),
            inputs,
            |x| {
                let (g, b) = params(&x);
                layer_norm(x[0].clone(), g, b, 1e-5)
            },
            |x| {
                let (g, b) = params(&x);
                Tensor::from_primitive(TensorPrimitive::Float(
                    <Ad as burn::tensor::ops::ModuleOps<Ad>>::layer_norm(
                        x[0].clone().into_primitive().tensor(),
                        g.into_primitive().tensor(),
                        b.map(|b| b.into_primitive().tensor()),
                        1e-5,
                    ),
                ))
            },
        );
    }
}

#[test]
fn gelu_matches_burns_ops_exact_and_tanh() {
    for n in [1, 15, 16, 17, 1000] {
        let x = leaf([n], n as u64, 6.0);
        compare(
            &format!("gelu n={n}"),
            vec![x.clone()],
            |x| super::gelu(x[0].clone(), false),
            |x| gelu(x[0].clone()),
        );
        compare(
            &format!("gelu tanh n={n}"),
            vec![x],
            |x| super::gelu(x[0].clone(), true),
            |x| gelu_tanh_ops(x[0].clone()),
        );
    }
}

#[test]
fn linear_matches_burns_ops_with_bias_residual_and_a_transposed_weight() {
    for (rows, i, o) in [(1, 1, 1), (7, 5, 3), (37, 16, 65), (64, 128, 384)] {
        let x = leaf([rows, i], 1, 1.0);
        let w = leaf([i, o], 2, 0.5);
        let wt = leaf([o, i], 3, 0.5);
        let b = leaf([1, o], 4, 0.5);
        let r = leaf([rows, o], 5, 1.0);
        compare(
            &format!("linear {rows}x{i}x{o}"),
            vec![x.clone(), w.clone(), b.clone(), r.clone()],
            |x| {
                linear(
                    x[0].clone(),
                    x[1].clone(),
                    Some(x[2].clone().reshape([o])),
                    Some(x[3].clone()),
                )
            },
            |x| {
                x[3].clone()
                    + burn::tensor::module::linear(
                        x[0].clone(),
                        x[1].clone(),
                        Some(x[2].clone().reshape([o])),
                    )
            },
        );
        compare(
            &format!("linear transposed {rows}x{i}x{o}"),
            vec![x, wt],
            |x| linear(x[0].clone(), x[1].clone().transpose(), None, None),
            |x| x[0].clone().matmul(x[1].clone().transpose()),
        );
    }
}

#[test]
fn cross_entropy_matches_burns_ops() {
    for (rows, classes) in [(1, 1), (1, 65), (13, 3), (768, 65), (5, 1000)] {
        let x = leaf([rows, classes], rows as u64, 8.0);
        let targets: Vec<u32> = (0..rows).map(|r| ((r * 7 + 3) % classes) as u32).collect();
        let ids: Vec<i64> = targets.iter().map(|&t| i64::from(t)).collect();
        compare(
            &format!("cross_entropy {rows}x{classes}"),
            vec![x],
            |x| cross_entropy(x[0].clone(), &targets).expect("flex f32"),
            |x| {
                let idx = Tensor::<Ad, 2, Int>::from_data(
                    TensorData::new(ids.clone(), [rows, 1]),
                    &Default::default(),
                );
                log_softmax(x[0].clone(), 1)
                    .gather(1, idx)
                    .sum()
                    .neg()
                    .div_scalar(rows as f64)
            },
        );
    }
}

#[test]
fn cross_entropy_leaves_out_ignored_targets() {
    // every third row ignored (and one all-ignored batch): the mean is over the others
    for (rows, classes, every) in [(13, 7, 3), (4, 5, 1), (700, 65, 2)] {
        let x = leaf([rows, classes], 40 + rows as u64, 6.0);
        let targets: Vec<u32> = (0..rows)
            .map(|r| {
                if r % every == 0 {
                    IGNORE
                } else {
                    ((r * 5 + 1) % classes) as u32
                }
            })
            .collect();
        let ids: Vec<i64> = targets
            .iter()
            .map(|&t| if t == IGNORE { 0 } else { i64::from(t) })
            .collect();
        let mask: Vec<f32> = targets
            .iter()
            .map(|&t| if t == IGNORE { 0.0 } else { 1.0 })
            .collect();
        let counted = mask.iter().sum::<f32>().max(1.0);
        compare(
            &format!("cross_entropy {rows}x{classes}, every {every}th ignored"),
            vec![x],
            |x| cross_entropy(x[0].clone(), &targets).expect("flex f32"),
            |x| {
                let idx = Tensor::<Ad, 2, Int>::from_data(
                    TensorData::new(ids.clone(), [rows, 1]),
                    &Default::default(),
                );
                let m = Tensor::<Ad, 2>::from_data(
                    TensorData::new(mask.clone(), [rows, 1]),
                    &Default::default(),
                );
                (log_softmax(x[0].clone(), 1).gather(1, idx) * m)
                    .sum()
                    .neg()
                    .div_scalar(f64::from(counted))
            },
        );
    }
}

#[test]
fn without_autodiff_the_kernels_give_the_same_forward() {
    let qkv = leaf([2, 9, 3 * 2 * 3], 7, 2.0);
    let a = vec_of(causal_attention(qkv.clone(), 2).unwrap().inner());
    let b = vec_of(causal_attention(qkv.inner(), 2).unwrap());
    assert_eq!(a, b);
    let x = leaf([6, 10], 8, 2.0);
    let g = leaf([10], 9, 1.0);
    let a = vec_of(layer_norm(x.clone(), g.clone(), None, 1e-5).inner());
    let b = vec_of(layer_norm(x.clone().inner(), g.inner(), None, 1e-5));
    assert_eq!(a, b);
    let a = vec_of(super::gelu(x.clone(), false).inner());
    let b = vec_of(super::gelu(x.inner(), false));
    assert_eq!(a, b);
}

#[test]
fn other_backends_and_dtypes_are_not_routed() {
    use burn::backend::NdArray;
    assert!(fused_on::<Ad>(burn::tensor::DType::F32));
    assert!(fused_on::<Flex>(burn::tensor::DType::F32));
    assert!(!fused_on::<Ad>(burn::tensor::DType::F16));
    assert!(!fused_on::<NdArray>(burn::tensor::DType::F32));
    assert!(!fused_on::<Autodiff<NdArray>>(burn::tensor::DType::F32));
    let x = Tensor::<NdArray, 3>::from_data(
        TensorData::new(values(2 * 3 * 6, 1, 1.0), [2, 3, 6]),
        &Default::default(),
    );
    assert!(
        causal_attention(x, 1).is_none(),
        "ndarray has no fused attention"
    );
}

/// Burn's grouped-query attention with rotary embeddings from `qkv` `[n, t, (heads + 2 kv)
/// hd]` (the q heads, the k heads, the v heads): q and k rotated by the rows `pos` of the
/// tables, query head h reading key/value head h / (heads / kv), scores scaled by `scale`,
/// inside documents `starts`.
fn grouped_attention_ops(
    qkv: Tensor<Ad, 3>,
    (heads, kv, scale): (usize, usize, f64),
    (cos, sin, pos): (&[f32], &[f32], &[u32]),
    starts: &[u32],
) -> Tensor<Ad, 3> {
    let [n, t, w] = qkv.dims();
    let hd = w / (heads + 2 * kv);
    let dev = Default::default();
    let part = |from: usize, h: usize| {
        qkv.clone()
            .slice([0..n, 0..t, from * hd..(from + h) * hd])
            .reshape([n, t, h, hd])
    };
    let table = |v: &[f32]| {
        let rows: Vec<f32> = pos
            .iter()
            .flat_map(|&p| v[p as usize * hd..(p as usize + 1) * hd].to_vec())
            .collect();
        Tensor::<Ad, 4>::from_data(TensorData::new(rows, [n, t, 1, hd]), &dev)
    };
    let (c, s) = (table(cos), table(sin));
    let rotate = |x: Tensor<Ad, 4>| {
        let [n, t, h, _] = x.dims();
        let x1 = x.clone().slice([0..n, 0..t, 0..h, 0..hd / 2]);
        let x2 = x.clone().slice([0..n, 0..t, 0..h, hd / 2..hd]);
        x * c.clone() + Tensor::cat(vec![x2.neg(), x1], 3) * s.clone()
    };
    let repeat = |x: Tensor<Ad, 4>| {
        let x = x.swap_dims(1, 2);
        x.reshape([n, kv, 1, t, hd])
            .repeat_dim(2, heads / kv)
            .reshape([n, heads, t, hd])
    };
    let q = rotate(part(0, heads)).swap_dims(1, 2);
    let k = repeat(rotate(part(heads, kv)));
    let v = repeat(part(heads + kv, kv));
    let mask: Vec<f32> = (0..n * t * t)
        .map(|x| {
            let (b, i, j) = (x / (t * t), x / t % t, x % t);
            if j > i || j < starts[b * t + i] as usize {
                -1e9
            } else {
                0.0
            }
        })
        .collect();
    let mask = Tensor::<Ad, 4>::from_data(TensorData::new(mask, [n, 1, t, t]), &dev);
    let att = q.matmul(k.swap_dims(2, 3)).mul_scalar(scale) + mask;
    softmax(att, 3)
        .matmul(v)
        .swap_dims(1, 2)
        .reshape([n, t, heads * hd])
}

#[test]
fn grouped_attention_with_rotary_embeddings_matches_burns_ops() {
    // (rows of documents, t, heads, kv heads, hd, packed positions)
    type Case<'a> = (&'a [&'a [usize]], usize, usize, usize, usize, bool);
    let cases: [Case; 6] = [
        (&[&[1]], 1, 1, 1, 2, false),
        (&[&[7], &[7]], 7, 4, 2, 6, false),
        (&[&[3, 4]], 7, 3, 1, 4, true),
        (&[&[70, 10, 20], &[100]], 100, 4, 2, 8, true),
        (&[&[65]], 65, 2, 2, 2, false),
        (&[&[2, 2], &[1, 3]], 4, 6, 3, 4, true),
    ];
    for (rows, t, heads, kv, hd, packed) in cases {
        let n = rows.len();
        let starts = starts_of(rows, t);
        let block = t + 3;
        let cos: Arc<[f32]> = values(block * hd, 7, 1.0).into();
        let sin: Arc<[f32]> = values(block * hd, 8, 1.0).into();
        let pos: Vec<u32> = (0..n * t)
            .map(|j| {
                let i = j % t;
                (if packed { i - starts[j] as usize } else { i }) as u32
            })
            .collect();
        let rope = Rope {
            cos: cos.clone(),
            sin: sin.clone(),
            positions: packed.then(|| pos.clone().into()),
        };
        let scale = 0.3;
        let h = Heads {
            heads,
            kv_heads: kv,
            scale: Some(scale),
        };
        let st = packed.then(|| starts.clone());
        let no_docs = vec![0u32; n * t];
        let ref_starts: &[u32] = if packed { &starts } else { &no_docs };
        let qkv = leaf(
            [n, t, (heads + 2 * kv) * hd],
            (n * t * heads + kv) as u64,
            2.0,
        );
        compare(
            &format!("grouped attention {rows:?} heads={heads} kv={kv} hd={hd}"),
            vec![qkv],
            |x| {
                grouped_attention(x[0].clone(), h, Some(rope.clone()), st.clone())
                    .expect("flex f32")
            },
            |x| {
                let tables = (&cos[..], &sin[..], &pos[..]);
                grouped_attention_ops(x[0].clone(), (heads, kv, scale), tables, ref_starts)
            },
        );
    }
    // tables too short for the positions, or heads that do not divide, are refused
    let qkv = Tensor::<Flex, 3>::from_data(
        TensorData::new(values(4 * 16, 1, 1.0), [1, 4, 16]),
        &Default::default(),
    );
    let short = Rope {
        cos: vec![0.0; 3 * 4].into(),
        sin: vec![0.0; 3 * 4].into(),
        positions: None,
    };
    let h = Heads {
        heads: 2,
        kv_heads: 1,
        scale: None,
    };
    assert!(grouped_attention(qkv.clone(), h, Some(short), None).is_none());
    let odd = Heads {
        heads: 3,
        kv_heads: 2,
        scale: None,
    };
    assert!(grouped_attention(qkv, odd, None, None).is_none());
}

#[test]
fn rms_norm_matches_burns_ops_with_and_without_gemmas_offset() {
    for (rows, d, offset) in [
        (1, 2, 0.0),
        (5, 3, 1.0),
        (13, 17, 0.0),
        (40, 128, 1.0),
        (3, 700, 0.0),
    ] {
        let x = leaf([rows, 1, d], rows as u64 + 40, 3.0);
        let inputs = vec![x, leaf([1, 1, d], 5, 1.0)];
        compare(
            &format!("rms_norm rows={rows} d={d} offset={offset}"),
            inputs,
            |x| rms_norm(x[0].clone(), x[1].clone().reshape([d]), offset, 1e-6).expect("flex"),
            |x| {
                let w: Tensor<Ad, 1> = x[1].clone().reshape([d]);
                let rms = (x[0].clone().powf_scalar(2.0).mean_dim(2) + 1e-6).sqrt();
                (x[0].clone() / rms) * w.add_scalar(offset).reshape([1, 1, d])
            },
        );
    }
}

#[test]
fn glu_matches_burns_ops_for_silu_and_gelu_tanh() {
    for n in [1, 15, 33, 1000] {
        let inputs = vec![leaf([n], n as u64 + 7, 6.0), leaf([n], n as u64 + 8, 2.0)];
        compare(
            &format!("swiglu n={n}"),
            inputs.clone(),
            |x| glu(x[0].clone(), x[1].clone(), Gate::Silu).expect("flex"),
            |x| burn::tensor::activation::silu(x[0].clone()) * x[1].clone(),
        );
        compare(
            &format!("geglu n={n}"),
            inputs,
            |x| glu(x[0].clone(), x[1].clone(), Gate::GeluTanh).expect("flex"),
            |x| gelu_tanh_ops(x[0].clone()) * x[1].clone(),
        );
    }
}

#[test]
fn embedding_matches_burns_op_with_repeated_ids() {
    let (vocab, d) = (7, 5);
    let ids = [3i64, 0, 3, 6, 1, 3];
    let idx = || {
        Tensor::<Ad, 2, Int>::from_data(TensorData::new(ids.to_vec(), [2, 3]), &Default::default())
    };
    compare(
        "embedding",
        vec![leaf([vocab, d], 17, 1.0)],
        |w| embedding(w[0].clone(), idx()).expect("flex"),
        |w| burn::tensor::module::embedding(w[0].clone(), idx()),
    );
    // an id outside the table is left to Burn's op
    let bad =
        Tensor::<Ad, 2, Int>::from_data(TensorData::new(vec![7i64], [1, 1]), &Default::default());
    assert!(embedding(leaf([vocab, d], 1, 1.0), bad).is_none());
}

#[test]
fn a_resharded_units_buffer_is_freed_after_the_forward_and_comes_back_for_the_backward() {
    let dev = Default::default();
    let vals = values(15, 3, 1.0);
    let x = leaf([2, 5, 4], 1, 1.0);
    let run = |reshard: bool| {
        let unit = Tensor::<Flex, 1>::from_data(TensorData::new(vals.clone(), [15]), &dev);
        let mut held = Resharded::default();
        if reshard {
            assert!(held.add(&unit));
        }
        // the unit's parameters: views of its buffer (the weight [4, 3], then a scale [3])
        let w = Tensor::<Ad, 2>::from_inner(param_view(&unit, 0, [4, 3]).unwrap()).require_grad();
        let g = Tensor::<Ad, 1>::from_inner(param_view(&unit, 12, [3]).unwrap()).require_grad();
        let buffer = std::sync::Arc::downgrade(&reshard::flex_of(&unit).unwrap().data_arc());
        drop(unit);
        let x = Tensor::<Ad, 3>::from_inner(x.clone().inner()).require_grad();
        let y = linear(x.clone(), w.clone().transpose().transpose(), None, None);
        let y = rms_norm(y, g.clone(), 0.0, 1e-6).unwrap();
        let (w, g) = if reshard {
            held.release();
            let (w, g) = (hollow(w), hollow(g));
            // nothing holds the buffer between the forward and the backward
            assert!(
                buffer.upgrade().is_none(),
                "the unit's buffer outlived the forward"
            );
            let again = Tensor::<Flex, 1>::from_data(TensorData::new(vals.clone(), [15]), &dev);
            held.refill(vec![again]).unwrap();
            (w, g)
        } else {
            assert!(buffer.upgrade().is_some());
            (w, g)
        };
        let wts = Tensor::<Ad, 3>::from_data(TensorData::new(values(30, 5, 1.0), [2, 5, 3]), &dev);
        let grads = (y * wts).sum().backward();
        [
            vec_of(x.grad(&grads).unwrap()),
            vec_of(w.grad(&grads).unwrap()),
            vec_of(g.grad(&grads).unwrap()),
        ]
    };
    assert_eq!(run(true), run(false), "the same gradients, bit for bit");
    // a buffer of another length is refused
    let mut held = Resharded::default();
    assert!(held.add(&Tensor::<Flex, 1>::from_data(
        TensorData::new(vals.clone(), [15]),
        &dev
    )));
    held.release();
    let short = Tensor::<Flex, 1>::from_data(TensorData::new(vec![0f32; 14], [14]), &dev);
    assert!(held.refill(vec![short]).is_err());
}

#[test]
fn transpose_puts_every_value_in_its_place_at_any_size() {
    // whole 8 x 8 tiles, ragged edges on either side, rows longer than the values read
    for (rows, cols, stride) in [(1, 1, 1), (8, 8, 8), (7, 13, 20), (17, 33, 33), (64, 9, 70)] {
        let src = values(rows * stride, 7, 1.0);
        let mut dst = vec![f32::NAN; rows * cols];
        // SAFETY: src holds rows rows of stride values, dst rows * cols
        unsafe { super::dense::transpose(src.as_ptr(), stride, rows, cols, &mut dst) };
        for r in 0..rows {
            for c in 0..cols {
                assert_eq!(
                    dst[c * rows + r].to_bits(),
                    src[r * stride + c].to_bits(),
                    "{rows}x{cols} (stride {stride}): value ({r}, {c})"
                );
            }
        }
    }
}
