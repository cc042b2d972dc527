//! Bounded fuzzing: random and mutated inputs to the config loader and the checkpoint reader
//! never panic; they load, or they fail with a config error (exit 2) or an invalid-checkpoint
//! report. Deterministic (a fixed seed), a few hundred cases each.

use std::path::Path;

use crate::common::{kiln, stderr, write, TINY};

/// xorshift64*: a small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One random edit of `bytes`: flip, insert, delete, duplicate a span, or truncate.
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>, alphabet: &[u8]) {
    let n = bytes.len();
    match rng.below(6) {
        0 if n > 0 => {
            let i = rng.below(n);
            bytes[i] = alphabet[rng.below(alphabet.len())];
        }
        1 => {
            let i = rng.below(n + 1);
            bytes.insert(i, alphabet[rng.below(alphabet.len())]);
        }
        2 if n > 0 => {
            let i = rng.below(n);
            let len = rng.below(8).min(n - i);
            bytes.drain(i..i + len);
        }
        3 if n > 0 => {
            let i = rng.below(n);
            let len = rng.below(32).min(n - i);
            let span: Vec<u8> = bytes[i..i + len].to_vec();
            let at = rng.below(n + 1);
            bytes.splice(at..at, span);
        }
        4 => bytes.truncate(rng.below(n + 1)),
        _ if n > 0 => {
            let i = rng.below(n);
            bytes[i] ^= 1 << rng.below(8);
        }
        _ => bytes.push(b'='),
    }
}

#[test]
fn the_config_loader_never_panics_on_mutated_experiment_files() {
    let d = kiln::testdir::tempdir().unwrap();
    let base = format!(
        "{TINY}\n[strategy]\nkind = \"ddp\"\ndevices = 2\n[checkpoint]\nevery_steps = 5\n[slurm]\ntime = \"01:00:00\"\n"
    );
    let alphabet = b"[]{}=\".,-_0123456789abcdefxyz \n\t#'e+\\";
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for case in 0..400 {
        let mut bytes = base.as_bytes().to_vec();
        for _ in 0..1 + rng.below(6) {
            mutate(&mut rng, &mut bytes, alphabet);
        }
        let f = d.path().join(format!("c{case}.toml"));
        std::fs::write(&f, &bytes).unwrap();
        let r = std::panic::catch_unwind(|| kiln::config::load(&f, &[], &[]).map(|_| ()));
        assert!(
            r.is_ok(),
            "case {case}: the loader panicked on:\n{}",
            String::from_utf8_lossy(&bytes)
        );
    }
    // and a few through the binary: exit 0 or 2, never a crash
    let mut rng = Rng(7);
    for case in 0..20 {
        let mut bytes = base.as_bytes().to_vec();
        for _ in 0..1 + rng.below(4) {
            mutate(&mut rng, &mut bytes, alphabet);
        }
        std::fs::write(d.path().join("b.toml"), &bytes).unwrap();
        let o = kiln(d.path(), &["check", "b.toml"]);
        assert!(
            matches!(o.status.code(), Some(0) | Some(2)),
            "case {case}: {:?} {}",
            o.status.code(),
            stderr(&o)
        );
    }
}

/// Rewrites the manifest so the mutated files verify, which sends them to the parsers.
pub(crate) fn reseal(dir: &Path) {
    use sha2::{Digest, Sha256};
    let mut files = Vec::new();
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "MANIFEST.json")
        .collect();
    names.sort();
    for name in names {
        let bytes = std::fs::read(dir.join(&name)).unwrap();
        let sha: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        files.push(serde_json::json!({"name": name, "size": bytes.len(), "sha256": sha}));
    }
    std::fs::write(
        dir.join("MANIFEST.json"),
        serde_json::to_vec(&serde_json::json!({ "files": files })).unwrap(),
    )
    .unwrap();
}

fn copy(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    crate::common::copy_dir(from, to);
}

#[test]
fn the_checkpoint_reader_never_panics_on_mutated_checkpoints() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    for (run, sets) in [
        ("whole", vec!["train.max_steps=2"]),
        (
            "shards",
            vec![
                "train.max_steps=2",
                "strategy.kind=fsdp",
                "strategy.devices=2",
            ],
        ),
    ] {
        let mut a = vec!["run", "t.toml", "--quiet", "--run-dir", run];
        for s in &sets {
            a.extend(["--set", s]);
        }
        let o = kiln(d.path(), &a);
        assert!(o.status.success(), "{}", stderr(&o));
        let good = d.path().join(run).join("checkpoints/step-00000002");
        let r = kiln::rundir::run_config(&d.path().join(run)).unwrap();
        let state = kiln::checkpoint::read_state(&good).unwrap();
        let specs = kiln::model::build(&r, &state.input_shape)
            .unwrap()
            .layout()
            .specs();
        let names: Vec<String> = std::fs::read_dir(&good)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let alphabet: Vec<u8> = (0..=255).collect();
        let mut rng = Rng(0xdead_beef_cafe_f00d ^ run.len() as u64);
        let work = d.path().join("work");
        for case in 0..150 {
            copy(&good, &work);
            let name = &names[rng.below(names.len())];
            let p = work.join(name);
            let mut bytes = std::fs::read(&p).unwrap();
            // state.json gets JSON-ish edits; tensors bytes anywhere, headers most often
            let text: &[u8] = if name.ends_with(".json") {
                b"{}[]\":,0123456789-e.aflnrstu"
            } else {
                &alphabet
            };
            for _ in 0..1 + rng.below(4) {
                if !name.ends_with(".json") && rng.below(2) == 0 && bytes.len() > 16 {
                    // the safetensors header: its length and the JSON after it
                    let i = rng
                        .below(16.min(bytes.len()).max(1) + 64)
                        .min(bytes.len() - 1);
                    bytes[i] = text[rng.below(text.len())];
                } else {
                    mutate(&mut rng, &mut bytes, text);
                }
            }
            std::fs::write(&p, &bytes).unwrap();
            if rng.below(4) != 0 {
                reseal(&work);
            }
            let r = std::panic::catch_unwind(|| {
                let _ = kiln::checkpoint::verify(&work);
                let _ = kiln::checkpoint::read_state(&work);
                kiln::checkpoint::load(&work, &specs).map(|_| ())
            });
            assert!(
                r.is_ok(),
                "{run} case {case}: the reader panicked on a mutated {name}"
            );
        }
    }
}

/// A change made to a state.json.
type Edit = Box<dyn Fn(&mut serde_json::Value)>;

/// Every number of a sharded checkpoint's layout in `state.json` changed, one at a time (the
/// manifest resealed): the load is refused as invalid, never a panic or a wrong model.
#[test]
fn a_layout_that_disagrees_with_the_shards_is_invalid() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let o = kiln(
        d.path(),
        &[
            "run",
            "t.toml",
            "--quiet",
            "--run-dir",
            "r",
            "--set",
            "train.max_steps=2",
            "--set",
            "strategy.kind=fsdp",
            "--set",
            "strategy.devices=2",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let good = d.path().join("r/checkpoints/step-00000002");
    let r = kiln::rundir::run_config(&d.path().join("r")).unwrap();
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(good.join("state.json")).unwrap()).unwrap();
    let shape: Vec<usize> = serde_json::from_value(state["input_shape"].clone()).unwrap();
    let specs = kiln::model::build(&r, &shape).unwrap().layout().specs();
    let work = d.path().join("work");
    let unit = state["params"]["units"][0].clone();
    let (len, shard) = (
        unit["len"].as_u64().unwrap(),
        unit["shard_len"].as_u64().unwrap(),
    );
    let n = state["num_params"].as_u64().unwrap();
    assert_eq!(state["params"]["world"], 2, "{state}");
    let edits: Vec<(&str, Edit)> = vec![
        ("world + 1", Box::new(|s| s["params"]["world"] = 3.into())),
        ("world 0", Box::new(|s| s["params"]["world"] = 0.into())),
        (
            "len + 1",
            Box::new(move |s| s["params"]["units"][0]["len"] = (len + 1).into()),
        ),
        (
            "len 0",
            Box::new(|s| s["params"]["units"][0]["len"] = 0.into()),
        ),
        (
            "shard_len + 1",
            Box::new(move |s| s["params"]["units"][0]["shard_len"] = (shard + 1).into()),
        ),
        (
            "shard_len huge",
            Box::new(|s| s["params"]["units"][0]["shard_len"] = u64::MAX.into()),
        ),
        (
            "start 7",
            Box::new(|s| s["params"]["units"][0]["start"] = 7.into()),
        ),
        (
            "no units",
            Box::new(|s| s["params"]["units"] = serde_json::json!([])),
        ),
        (
            "num_params + 1",
            Box::new(move |s| s["num_params"] = (n + 1).into()),
        ),
        (
            "world_size huge",
            Box::new(|s| s["world_size"] = u64::MAX.into()),
        ),
    ];
    for (what, edit) in edits {
        copy(&good, &work);
        let mut s = state.clone();
        edit(&mut s);
        std::fs::write(work.join("state.json"), serde_json::to_vec(&s).unwrap()).unwrap();
        reseal(&work);
        let res = std::panic::catch_unwind(|| kiln::checkpoint::load(&work, &specs).map(|_| ()));
        match res {
            Err(_) => panic!("{what}: the reader panicked"),
            Ok(Ok(())) if what == "world_size huge" => {} // not part of the layout
            Ok(Ok(())) => panic!("{what}: loaded a checkpoint that disagrees with its shards"),
            Ok(Err(_)) => {}
        }
    }
}
