//! Checkpoint save and load of the 7.9M-parameter `fsdp-wide-mlp` with AdamW state, written as
//! one whole model (ddp, rank 0) and as 2 fsdp shards. `cargo bench --bench checkpoint`.
//! Save = encode the files, write and fsync them, then state.json, the manifest (sha256 of every
//! file) and the rename; load = verify the manifest and read the tensors back whole.

use std::time::Instant;

use kiln::checkpoint::{
    encode_files, load, CheckpointDir, DataPosition, Layout, OptState, OptimizerInfo, RngState,
    SchedulerInfo, ShardUnit, State, FORMAT,
};

const SIZES: [usize; 10] = [512, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 10];

fn units() -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    for w in SIZES.windows(2) {
        let len = w[0] * w[1] + w[1];
        out.push((start, len));
        start += len;
    }
    out
}

fn state(n: usize, layout: Layout) -> State {
    State {
        format: FORMAT.into(),
        step: 1,
        position: DataPosition {
            epoch: 0,
            cursor: 0,
            segment_start: 0,
            segment_micro: 0,
        },
        accum_position: 0,
        rng: RngState {
            init_seed: 0,
            dropout_seed: 0,
            sampler_seed: 0,
            data_seed: 0,
        },
        world_size: 2,
        strategy: "fsdp".into(),
        micro_batch: 32,
        grad_accum_steps: 1,
        num_params: n,
        frozen_params: 0,
        input_shape: vec![512],
        params: layout,
        optimizer: OptimizerInfo {
            kind: "adamw".into(),
            steps: 1,
        },
        scheduler: SchedulerInfo {
            kind: "constant".into(),
            last_step: 1,
            last_lr: 1e-3,
        },
        last_loss: 0.0,
        config_hash: String::new(),
        kiln_version: "bench".into(),
        early_stopping: None,
        best: None,
        loss_scale: None,
        documents: None,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let units = units();
    let n: usize = units.iter().map(|u| u.1).sum();
    let specs: Vec<(String, Vec<usize>)> = SIZES
        .windows(2)
        .enumerate()
        .flat_map(|(i, w)| {
            [
                (format!("layers.{i}.weight"), vec![w[0], w[1]]),
                (format!("layers.{i}.bias"), vec![w[1]]),
            ]
        })
        .collect();
    let params: Vec<f32> = (0..n).map(|i| (i as f32 * 1e-3).sin()).collect();
    let opt = OptState {
        steps: 1,
        m: params.clone(),
        v: params.iter().map(|x| x * x).collect(),
    };
    let dir = kiln::testdir::tempdir().expect("tempdir");
    let store = CheckpointDir::new(dir.path().to_path_buf());
    let world = 2;
    for sharded in [false, true] {
        let (mut saves, mut loads) = (Vec::new(), Vec::new());
        for it in (0..5u64).map(|i| i + if sharded { 100 } else { 0 }) {
            let t = Instant::now();
            store.begin(it).expect("begin");
            let layout = if sharded {
                Layout::Sharded {
                    world,
                    units: units
                        .iter()
                        .enumerate()
                        .map(|(i, &(start, len))| ShardUnit {
                            name: format!("layers.{i}"),
                            start,
                            len,
                            shard_len: len.div_ceil(world),
                        })
                        .collect(),
                }
            } else {
                Layout::Full
            };
            let ranks = if sharded { world } else { 1 };
            for r in 0..ranks {
                let (p, o) = match &layout {
                    Layout::Full => (params.clone(), opt.clone()), // the snapshot's copy, as in training
                    Layout::Sharded { units, .. } => {
                        let part = |b: &[f32]| -> Vec<f32> {
                            units
                                .iter()
                                .flat_map(|u| {
                                    let own = u.owned(r);
                                    b[u.start + own.start..u.start + own.end].to_vec()
                                })
                                .collect()
                        };
                        let o = OptState {
                            steps: 1,
                            m: part(&opt.m),
                            v: part(&opt.v),
                        };
                        (part(&params), o)
                    }
                };
                for (name, bytes) in encode_files(&layout, r, &specs, 0, &p, &o).expect("encode") {
                    store.write_file(it, &name, &bytes).expect("write");
                }
            }
            store.commit(it, &state(n, layout), 1, 0).expect("commit");
            saves.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let l = load(&store.step_dir(it), &specs).expect("load");
            loads.push(t.elapsed().as_secs_f64());
            assert_eq!(l.params, params);
        }
        println!(
            "{{\"bench\":\"checkpoint\",\"layout\":\"{}\",\"params\":{n},\"save_s\":{:.4},\"load_s\":{:.4}}}",
            if sharded { "fsdp-2-shards" } else { "full" },
            median(saves),
            median(loads)
        );
    }
}
