//! Packed rows (`Forward::with_segments`): a row of several documents gives each document the
//! logits it has alone, with kiln's fused kernels and with Burn's ops, for every family that
//! reads the documents' starts (gpt: its position embeddings and attention; llama: its rotary
//! angles and attention).

use burn::backend::Flex;
use burn::tensor::TensorData;

use super::{Family, FamilyModel, Forward, Model};
use crate::kernels::Starts;

/// Rows of `t` tokens packed with `docs` (row by row; the tokens after a row's last document
/// are a document of their own): the ids and the starts.
fn packed(rows: &[&[&[i64]]], t: usize) -> (Vec<i64>, Starts) {
    let (mut ids, mut starts) = (Vec::new(), Vec::new());
    for docs in rows {
        let mut at = 0u32;
        for d in docs.iter() {
            ids.extend_from_slice(d);
            starts.extend(std::iter::repeat_n(at, d.len()));
            at += d.len() as u32;
        }
        let pad = t - at as usize;
        ids.extend(std::iter::repeat_n(1, pad));
        starts.extend(std::iter::repeat_n(at, pad));
    }
    (ids, starts.into())
}

fn logits<F: Family>(
    f: &F,
    m: &F::Module<Flex>,
    ids: Vec<i64>,
    shape: [usize; 2],
    ctx: Forward,
) -> Vec<f32> {
    f.forward(m, TensorData::new(ids, shape), &Default::default(), &mut {
        ctx
    })
    .into_data()
    .convert::<f32>()
    .into_vec::<f32>()
    .unwrap()
}

/// `family` (positions up to at least 8, a vocabulary over 20): each document of two packed
/// rows of 8 has, at its positions, the logits it has alone, fused and not; and the same rows
/// unpacked do not (the test would see a family that ignores the starts).
pub(super) fn each_document_gets_its_own_logits<F: Family>(family: F, vocab: usize) {
    let m = FamilyModel::new(family);
    let params = m.init(11);
    let module = m.module_with::<Flex>(&params, &Default::default()).unwrap();
    let f = m.family();
    let t = 8;
    let rows: [&[&[i64]]; 2] = [
        &[&[5, 9, 3], &[7, 7, 1, 2, 8]],
        &[&[4], &[12, 3, 3, 6], &[2]],
    ];
    let (ids, starts) = packed(&rows, t);
    for fused in [true, false] {
        let ctx = Forward::eval().with_fused(fused);
        let got = logits(
            f,
            &module,
            ids.clone(),
            [2, t],
            ctx.clone().with_segments(Some(starts.clone())),
        );
        let mut checked = 0;
        for (r, docs) in rows.iter().enumerate() {
            let mut at = r * t;
            for d in docs.iter() {
                let alone = logits(f, &module, d.to_vec(), [1, d.len()], ctx.clone());
                let here = &got[at * vocab..(at + d.len()) * vocab];
                for (x, y) in here.iter().zip(&alone) {
                    assert!(
                        (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                        "fused {fused}, row {r}, document {d:?}: {x} vs {y}"
                    );
                }
                at += d.len();
                checked += d.len();
            }
        }
        assert_eq!(checked, 14);
        // unpacked, the second document of the first row sees the first
        let plain = logits(f, &module, ids.clone(), [2, t], ctx);
        assert_ne!(plain[3 * vocab..8 * vocab], got[3 * vocab..8 * vocab]);
    }
}
