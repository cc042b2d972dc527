//! Weights any tool reads: `kiln export` writes the run's parameters under PyTorch's (or Burn's)
//! names and layouts, fsdp shards gathered from the checkpoint files; `model.init_from` starts a
//! run from such a file (or PyTorch's), and export -> init_from -> export is bit-identical; bad
//! weight files are exit 2 naming the file, with nothing written; checkpoints are safetensors
//! files, and one of the old format is refused naming the version that wrote it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use sha2::{Digest, Sha256};

use crate::common::{kiln, stderr, stdout, write, TINY};
use crate::models::{corpus, CNN, GPT};

/// A file's tensors as f32: name -> (shape, values).
fn tensors(path: &Path) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, v)| {
            assert_eq!(v.dtype(), Dtype::F32, "{name}");
            let data = v
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (name, (v.shape().to_vec(), data))
        })
        .collect()
}

fn metadata(path: &Path) -> HashMap<String, String> {
    let bytes = std::fs::read(path).unwrap();
    let (_, m) = SafeTensors::read_metadata(&bytes).unwrap();
    m.metadata().clone().unwrap_or_default()
}

fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = v[r * cols + c];
        }
    }
    out
}

fn run(dir: &Path, toml: &str, run_dir: &str, sets: &[&str]) -> PathBuf {
    let file = write(dir, &format!("{run_dir}.toml"), toml);
    let mut args = vec![
        "run",
        file.to_str().unwrap(),
        "--quiet",
        "--run-dir",
        run_dir,
    ];
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = kiln(dir, &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    dir.join(run_dir)
}

fn export(dir: &Path, run: &Path, out: &str, extra: &[&str]) -> PathBuf {
    let mut args = vec!["export", run.to_str().unwrap(), "-o", out];
    args.extend(extra);
    let o = kiln(dir, &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("wrote"), "{}", stdout(&o));
    dir.join(out)
}

/// The newest checkpoint directory of a run.
fn newest_checkpoint(run: &Path) -> PathBuf {
    let mut steps: Vec<PathBuf> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    steps.sort();
    steps.pop().unwrap()
}

#[test]
fn an_mlp_export_holds_the_runs_parameters_under_torch_and_burn_names() {
    let d = kiln::testdir::tempdir().unwrap();
    // single: the checkpoint's model.safetensors holds the parameters by module path
    let single = run(d.path(), TINY, "single", &["optim.kind=\"adamw\""]);
    let ckpt = newest_checkpoint(&single);
    let files: Vec<String> = std::fs::read_dir(&ckpt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for f in [
        "model.safetensors",
        "optim.safetensors",
        "state.json",
        "MANIFEST.json",
    ] {
        assert!(files.contains(&f.to_string()), "{files:?}");
    }
    let params = tensors(&ckpt.join("model.safetensors"));
    let optim = tensors(&ckpt.join("optim.safetensors"));
    let mut names: Vec<&String> = optim.keys().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "exp_avg.layers.0.bias",
            "exp_avg.layers.0.weight",
            "exp_avg.layers.1.bias",
            "exp_avg.layers.1.weight",
            "exp_avg_sq.layers.0.bias",
            "exp_avg_sq.layers.0.weight",
            "exp_avg_sq.layers.1.bias",
            "exp_avg_sq.layers.1.weight"
        ]
    );
    let torch = tensors(&export(d.path(), &single, "torch.safetensors", &[]));
    let burn = tensors(&export(
        d.path(),
        &single,
        "burn.safetensors",
        &["--format", "burn"],
    ));
    assert_eq!(burn, params, "burn names and layouts are the checkpoint's");
    let mut names: Vec<&String> = torch.keys().collect();
    names.sort();
    assert_eq!(names, ["0.bias", "0.weight", "2.bias", "2.weight"]);
    for (torch_name, burn_name, [rows, cols]) in [
        ("0.weight", "layers.0.weight", [8, 16]),
        ("2.weight", "layers.1.weight", [16, 3]),
    ] {
        let (shape, values) = &torch[torch_name];
        assert_eq!(shape, &vec![cols, rows], "Linear weights are [out, in]");
        assert_eq!(values, &transpose(&params[burn_name].1, rows, cols));
    }
    assert_eq!(torch["0.bias"], params["layers.0.bias"]);
    assert_eq!(torch["2.bias"], params["layers.1.bias"]);
    let meta = metadata(&d.path().join("torch.safetensors"));
    assert_eq!(meta["kiln.step"], "8");
    assert_eq!(meta["kiln.kind"], "mlp");
    assert_eq!(meta["kiln.version"], env!("CARGO_PKG_VERSION"));
    assert!(
        meta["kiln.model"].contains("\"hidden_sizes\":[16]"),
        "{meta:?}"
    );

    // fsdp: the export gathers the shards from the files; each rank's file holds its part
    let fsdp = run(
        d.path(),
        TINY,
        "fsdp",
        &[
            "strategy.kind=\"fsdp\"",
            "strategy.devices=2",
            "optim.kind=\"adamw\"",
        ],
    );
    let ckpt = newest_checkpoint(&fsdp);
    let r0 = tensors(&ckpt.join("model-rank-0.safetensors"));
    let r1 = tensors(&ckpt.join("model-rank-1.safetensors"));
    let o0 = tensors(&ckpt.join("optim-rank-0.safetensors"));
    assert!(o0.contains_key("exp_avg.flat.0.model"), "{:?}", o0.keys());
    let mut flat = r0["flat.0.model"].1.clone();
    flat.extend(&r1["flat.0.model"].1);
    // 8*16 + 16 + 16*3 + 3 parameters, in layout order
    assert_eq!(flat.len(), 195);
    let burn = tensors(&export(
        d.path(),
        &fsdp,
        "fsdp-burn.safetensors",
        &["--format", "burn"],
    ));
    let mut joined: Vec<f32> = Vec::new();
    for n in [
        "layers.0.weight",
        "layers.0.bias",
        "layers.1.weight",
        "layers.1.bias",
    ] {
        joined.extend(&burn[n].1);
    }
    assert_eq!(joined, flat);
}

/// Trains `toml`, exports it with a probe, starts a run from the export with lr = 0 (so the
/// weights stay as they are), exports that: the tensors and the logits must be identical.
fn round_trip(toml: &str, sets: &[&str], expect_names: &[&str]) {
    let d = kiln::testdir::tempdir().unwrap();
    corpus(d.path());
    let toml = toml.replace("corpus.txt", d.path().join("corpus.txt").to_str().unwrap());
    let a = run(d.path(), &toml, "a", sets);
    let ea = export(
        d.path(),
        &a,
        "a.safetensors",
        &["--probe", "a-probe.safetensors"],
    );
    let ta = tensors(&ea);
    for n in expect_names {
        assert!(ta.contains_key(*n), "`{n}` not in {:?}", ta.keys());
    }
    // every tensor against the run's parameters (read by kiln's checkpoint loader)
    let flat = crate::common::checkpoint_params(&a, &newest_checkpoint(&a));
    let r = kiln::rundir::run_config(&a).unwrap();
    let state = kiln::checkpoint::read_state(&newest_checkpoint(&a)).unwrap();
    let model = kiln::model::build(&r, &state.input_shape).unwrap();
    let burn = tensors(&export(
        d.path(),
        &a,
        "a-burn.safetensors",
        &["--format", "burn"],
    ));
    assert_eq!(burn.len(), model.layout().params.len());
    let externals = kiln::model::portable::externals(
        model.as_ref(),
        kiln::model::portable::WeightFormat::PyTorch,
    );
    assert_eq!(ta.len(), externals.len());
    for e in &externals {
        let p = &model.layout().params[e.param];
        assert_eq!(burn[&p.name], (p.shape.clone(), flat[p.range()].to_vec()));
        let want = if e.transpose {
            transpose(&flat[p.range()], p.shape[0], p.shape[1])
        } else {
            flat[p.range()].to_vec()
        };
        assert_eq!(ta[&e.name], (e.shape.clone(), want), "{}", e.name);
    }
    let mut sets_b: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    sets_b.extend([
        format!("model.init_from=\"{}\"", ea.display()),
        "optim.kind=\"sgd\"".into(),
        "optim.lr=0.0".into(),
        "optim.weight_decay=0.0".into(),
        "train.max_steps=1".into(),
    ]);
    let refs: Vec<&str> = sets_b.iter().map(String::as_str).collect();
    let b = run(d.path(), &toml, "b", &refs);
    let eb = export(
        d.path(),
        &b,
        "b.safetensors",
        &["--probe", "b-probe.safetensors"],
    );
    assert_eq!(tensors(&eb), ta, "export -> init_from -> export");
    let (pa, pb) = (
        tensors(&d.path().join("a-probe.safetensors")),
        tensors(&d.path().join("b-probe.safetensors")),
    );
    assert_eq!(pa["input"], pb["input"]);
    let (la, lb) = (&pa["logits"].1, &pb["logits"].1);
    assert_eq!(la.len(), lb.len());
    let diff = la
        .iter()
        .zip(lb)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(
        diff <= 1e-6,
        "logits of the reloaded model differ by {diff}"
    );
}

#[test]
fn cnn_export_round_trips_through_init_from() {
    round_trip(
        CNN,
        &[
            "strategy.kind=\"fsdp\"",
            "strategy.devices=2",
            "strategy.unit=\"layer\"",
        ],
        &[
            "0.weight", "0.bias", "3.weight", "7.weight", "9.weight", "9.bias",
        ],
    );
}

#[test]
fn gpt_export_round_trips_with_its_tied_head_under_both_names() {
    round_trip(
        GPT,
        &[],
        &[
            "wte.weight",
            "lm_head.weight",
            "blocks.1.mlp.0.weight",
            "blocks.1.mlp.2.bias",
            "blocks.0.ln_1.weight",
            "ln_f.bias",
        ],
    );
}

/// Writes a safetensors file of `tensors` (name, dtype, shape, raw bytes).
fn write_raw(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(&str, TensorView)> = tensors
        .iter()
        .map(|(n, dt, s, b)| (*n, TensorView::new(*dt, s.clone(), b).unwrap()))
        .collect();
    let bytes = safetensors::tensor::serialize(views, None).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The TINY mlp's tensors under PyTorch's names, from an export.
fn tiny_torch(d: &Path) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    let a = run(d, TINY, "a", &[]);
    tensors(&export(d, &a, "a.safetensors", &[]))
}

#[test]
fn init_from_takes_half_precision_and_a_head_under_either_name() {
    let d = kiln::testdir::tempdir().unwrap();
    let t = tiny_torch(d.path());
    // values that f16 and bf16 hold exactly
    let round = |v: &[f32]| -> Vec<f32> { v.iter().map(|x| (x * 64.0).round() / 64.0).collect() };
    for (dtype, name) in [(Dtype::F16, "f16"), (Dtype::BF16, "bf16")] {
        let list: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> = t
            .iter()
            .map(|(n, (s, v))| {
                let bytes = round(v)
                    .iter()
                    .flat_map(|&x| match dtype {
                        Dtype::F16 => half::f16::from_f32(x).to_le_bytes(),
                        _ => half::bf16::from_f32(x).to_le_bytes(),
                    })
                    .collect();
                (n.as_str(), dtype, s.clone(), bytes)
            })
            .collect();
        let file = d.path().join(format!("{name}.safetensors"));
        write_raw(&file, &list);
        let sets = [
            format!("model.init_from=\"{}\"", file.display()),
            "optim.lr=0.0".into(),
            "train.max_steps=1".into(),
        ];
        let refs: Vec<&str> = sets.iter().map(String::as_str).collect();
        let b = run(d.path(), TINY, name, &refs);
        // (as f32: by default an export keeps the dtype the run started from, issue 58,
        // defect 23)
        let back = tensors(&export(
            d.path(),
            &b,
            &format!("{name}-back.safetensors"),
            &["--dtype", "f32"],
        ));
        for (n, (_, v)) in &t {
            assert_eq!(back[n].1, round(v), "{name}: {n}");
        }
        let kept = export(d.path(), &b, &format!("{name}-kept.safetensors"), &[]);
        let bytes = std::fs::read(&kept).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        assert!(
            st.tensors().iter().all(|(_, v)| v.dtype() == dtype),
            "{name}"
        );
    }

    // a gpt saved the way `safetensors.torch.save_model` saves tied weights: one name only
    let g = kiln::testdir::tempdir().unwrap();
    corpus(g.path());
    let toml = GPT.replace("corpus.txt", g.path().join("corpus.txt").to_str().unwrap());
    let a = run(g.path(), &toml, "a", &[]);
    let full = tensors(&export(g.path(), &a, "a.safetensors", &[]));
    let only_head: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> = full
        .iter()
        .filter(|(n, _)| n.as_str() != "wte.weight")
        .map(|(n, (s, v))| (n.as_str(), Dtype::F32, s.clone(), f32_bytes(v)))
        .collect();
    let file = g.path().join("head-only.safetensors");
    write_raw(&file, &only_head);
    let sets = [
        format!("model.init_from=\"{}\"", file.display()),
        "optim.lr=0.0".into(),
        "optim.kind=\"sgd\"".into(),
        "train.max_steps=1".into(),
    ];
    let refs: Vec<&str> = sets.iter().map(String::as_str).collect();
    let b = run(g.path(), &toml, "b", &refs);
    assert_eq!(tensors(&export(g.path(), &b, "b.safetensors", &[])), full);
}

/// `kiln run` of TINY from `file`: exit 2, the file named, no run directory.
fn refused(d: &Path, file: &Path, wants: &[&str]) {
    let exp = write(d, "t.toml", TINY);
    let run_dir = d.join("never");
    let o = kiln(
        d,
        &[
            "run",
            exp.to_str().unwrap(),
            "--quiet",
            "--run-dir",
            run_dir.to_str().unwrap(),
            "--set",
            &format!("model.init_from=\"{}\"", file.display()),
        ],
    );
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains(&file.display().to_string()),
        "names the file: {e}"
    );
    for w in wants {
        assert!(e.contains(w), "wants `{w}` in: {e}");
    }
    assert!(!run_dir.exists(), "nothing written");
}

#[test]
fn bad_weight_files_are_refused_naming_the_file_and_what_is_wrong() {
    let d = kiln::testdir::tempdir().unwrap();
    let t = tiny_torch(d.path());
    let good = std::fs::read(d.path().join("a.safetensors")).unwrap();
    let p = |n: &str| d.path().join(n);

    refused(
        d.path(),
        &p("nope.safetensors"),
        &["cannot read", "No such file"],
    );
    std::fs::write(p("trunc.safetensors"), &good[..good.len() / 2]).unwrap();
    refused(d.path(), &p("trunc.safetensors"), &["truncated"]);
    std::fs::write(
        p("text.safetensors"),
        b"{\"this is\": \"json, not safetensors\"}",
    )
    .unwrap();
    refused(
        d.path(),
        &p("text.safetensors"),
        &["not a safetensors file"],
    );
    let mut big = good.clone();
    big[..8].copy_from_slice(&(good.len() as u64 * 2).to_le_bytes());
    std::fs::write(p("big.safetensors"), big).unwrap();
    refused(
        d.path(),
        &p("big.safetensors"),
        &["header length is larger than the file"],
    );
    // a dtype safetensors does not know
    let header = br#"{"0.weight":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}"#;
    let mut q4 = (header.len() as u64).to_le_bytes().to_vec();
    q4.extend_from_slice(header);
    q4.push(0);
    std::fs::write(p("q4.safetensors"), q4).unwrap();
    refused(
        d.path(),
        &p("q4.safetensors"),
        &["dtype", "unknown variant `Q4`"],
    );
    // a dtype safetensors knows but weights are not
    let mut ints: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> = t
        .iter()
        .map(|(n, (s, v))| (n.as_str(), Dtype::F32, s.clone(), f32_bytes(v)))
        .collect();
    ints[0].1 = Dtype::I32;
    let int_name = ints[0].0.to_string();
    write_raw(&p("int.safetensors"), &ints);
    refused(
        d.path(),
        &p("int.safetensors"),
        &[&format!("wrong dtype `{int_name}`: I32")],
    );
    // a format the model's family does not have (GPT-2's names are the gpt's)
    let exp = write(d.path(), "nano.toml", TINY);
    let o = kiln(
        d.path(),
        &[
            "run",
            exp.to_str().unwrap(),
            "--quiet",
            "--run-dir",
            "never-nano",
            "--set",
            &format!("model.init_from=\"{}\"", p("a.safetensors").display()),
            "--set",
            "model.init_format=\"nanogpt\"",
        ],
    );
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("model `mlp` has no nanogpt names") && e.contains("model.init_format"),
        "{e}"
    );
    assert!(!d.path().join("never-nano").exists(), "nothing written");
    // a device would be read for ever; NaN weights are never meant
    refused(d.path(), Path::new("/dev/zero"), &["is not a regular file"]);
    let mut nan: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> = t
        .iter()
        .map(|(n, (s, v))| (n.as_str(), Dtype::F32, s.clone(), f32_bytes(v)))
        .collect();
    let nan_name = nan[0].0.to_string();
    nan[0].3[..4].copy_from_slice(&f32::NAN.to_le_bytes());
    write_raw(&p("nan.safetensors"), &nan);
    refused(
        d.path(),
        &p("nan.safetensors"),
        &["NaN or infinite", &format!("`{nan_name}` (1 of")],
    );
    // one wrong shape, one missing, one unexpected: all named at once, with the closest name
    let mut bad: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> = t
        .iter()
        .filter(|(n, _)| n.as_str() != "2.bias")
        .map(|(n, (s, v))| {
            let s = if n == "0.weight" {
                vec![s[1], s[0]]
            } else {
                s.clone()
            };
            (n.as_str(), Dtype::F32, s, f32_bytes(v))
        })
        .collect();
    bad.push(("2.bais", Dtype::F32, vec![3], f32_bytes(&[0.0; 3])));
    write_raw(&p("bad.safetensors"), &bad);
    refused(
        d.path(),
        &p("bad.safetensors"),
        &[
            "1 missing, 1 unexpected, 1 wrong shape",
            "missing     `2.bias` (closest in the file: `2.bais`)",
            "unexpected  `2.bais` (closest the model has: `2.bias`)",
            "wrong shape `0.weight`: [8, 16] in the file, the model needs [16, 8]",
        ],
    );
}

#[test]
fn a_checkpoint_of_the_old_format_is_refused_naming_the_version() {
    let d = kiln::testdir::tempdir().unwrap();
    let a = run(d.path(), TINY, "a", &["checkpoint.keep_last=1"]);
    let ckpt = newest_checkpoint(&a);
    // what kiln 0.1 wrote: no `format` in state.json, KILNF32 files; the manifest verifies
    let state = std::fs::read_to_string(ckpt.join("state.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&state).unwrap();
    v.as_object_mut().unwrap().remove("format");
    v["kiln_version"] = "0.0.9".into();
    let state = serde_json::to_vec_pretty(&v).unwrap();
    std::fs::write(ckpt.join("state.json"), &state).unwrap();
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join("MANIFEST.json")).unwrap())
            .unwrap();
    for f in m["files"].as_array_mut().unwrap() {
        if f["name"] == "state.json" {
            f["size"] = state.len().into();
            f["sha256"] = Sha256::digest(&state)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
                .into();
        }
    }
    std::fs::write(ckpt.join("MANIFEST.json"), serde_json::to_vec(&m).unwrap()).unwrap();
    let metrics = std::fs::read(a.join("metrics.jsonl")).unwrap();
    let o = kiln(d.path(), &["resume", a.to_str().unwrap(), "--quiet"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("written by kiln 0.0.9"), "{e}");
    assert!(e.contains("old binary format"), "{e}");
    assert_eq!(
        std::fs::read(a.join("metrics.jsonl")).unwrap(),
        metrics,
        "nothing changed"
    );
    let o = kiln(
        d.path(),
        &["export", a.to_str().unwrap(), "-o", "x.safetensors"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("written by kiln 0.0.9"),
        "{}",
        stderr(&o)
    );
    assert!(!d.path().join("x.safetensors").exists());
}

#[test]
fn export_checks_every_output_before_writing_any() {
    let d = kiln::testdir::tempdir().unwrap();
    let a = run(d.path(), TINY, "a", &[]);
    let a = a.to_str().unwrap();
    let bad = |args: &[&str], want: &str| {
        let mut all = vec!["export", a];
        all.extend(args);
        let o = kiln(d.path(), &all);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    };
    bad(
        &["-o", "no/such/dir/m.safetensors"],
        "`no/such/dir` does not exist",
    );
    bad(
        &["-o", "m.safetensors", "--probe", "nope/p.safetensors"],
        "`nope` does not exist",
    );
    bad(
        &["-o", "./s.safetensors", "--probe", "s.safetensors"],
        "give the probe its own file",
    );
    bad(
        &["-o", "a/checkpoints/step-00000008/model.safetensors"],
        "is inside the run directory",
    );
    std::os::unix::fs::symlink("target.safetensors", d.path().join("link.safetensors")).unwrap();
    bad(&["-o", "link.safetensors"], "not a regular file");
    // GPT-2's formats are the gpt family's own (`WeightAdapter::formats`): an mlp has none of them
    bad(
        &["-o", "m.safetensors", "--format", "nanogpt"],
        "--format nanogpt: model `mlp` has no nanogpt names (it has pytorch, burn) (the run's model.kind = \"mlp\")",
    );
    bad(
        &["-o", "hf", "--format", "hf-gpt2"],
        "--format hf-gpt2: model `mlp` has no hf-gpt2 names (it has pytorch, burn)",
    );
    // (a format is a name the model's family defines: a typo gets the closest)
    bad(
        &["-o", "m.safetensors", "--format", "pytorh"],
        "model `mlp` has no pytorh names (it has pytorch, burn); did you mean \"pytorch\"?",
    );
    assert!(!d.path().join("hf").exists(), "nothing written");
    assert!(!d.path().join("m.safetensors").exists(), "nothing written");
    assert!(!d.path().join("s.safetensors").exists(), "nothing written");
    assert!(
        !d.path().join("target.safetensors").exists(),
        "nothing written"
    );
}

#[test]
fn damaged_checkpoints_are_never_trained_over() {
    let d = kiln::testdir::tempdir().unwrap();
    let a = run(d.path(), TINY, "a", &["checkpoint.keep_last=1"]);
    let ckpt = newest_checkpoint(&a);
    // a manifest naming a file outside its directory is refused, not read
    let m = std::fs::read_to_string(ckpt.join("MANIFEST.json")).unwrap();
    std::fs::write(
        ckpt.join("MANIFEST.json"),
        m.replacen("\"optim.safetensors\"", "\"/dev/zero\"", 1),
    )
    .unwrap();
    let o = kiln(d.path(), &["ckpt", "list", a.to_str().unwrap()]);
    assert!(
        stdout(&o).contains("not a file of this directory"),
        "{}",
        stdout(&o)
    );
    // the only checkpoint is damaged: resume stops instead of starting over
    let o = kiln(d.path(), &["resume", a.to_str().unwrap(), "--quiet"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("no checkpoint in") && e.contains("verifies"),
        "{e}"
    );
    assert!(ckpt.exists(), "the damaged checkpoint is kept");
}

#[test]
fn sgd_momentum_is_saved_under_torchs_name_and_a_switch_to_adam_drops_it() {
    let d = kiln::testdir::tempdir().unwrap();
    let a = run(
        d.path(),
        TINY,
        "a",
        &["optim.momentum=0.9", "checkpoint.every_steps=4"],
    );
    let optim = tensors(&newest_checkpoint(&a).join("optim.safetensors"));
    let mut names: Vec<&String> = optim.keys().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "momentum_buffer.layers.0.bias",
            "momentum_buffer.layers.0.weight",
            "momentum_buffer.layers.1.bias",
            "momentum_buffer.layers.1.weight"
        ]
    );
    let before = crate::common::checkpoint_params(&a, &newest_checkpoint(&a));
    let o = kiln(
        d.path(),
        &[
            "resume",
            a.to_str().unwrap(),
            "--quiet",
            "--from",
            "step-00000004",
            "--set",
            "optim.kind=\"adamw\"",
        ],
    );
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(
        e.contains("optimizer is sgd but optim.kind is adamw"),
        "{e}"
    );
    let after = crate::common::checkpoint_params(&a, &newest_checkpoint(&a));
    assert_ne!(before, after, "adamw moved the parameters");
}

#[test]
fn a_resumed_run_continues_from_its_checkpoint_not_from_init_from() {
    let d = kiln::testdir::tempdir().unwrap();
    let src = run(d.path(), TINY, "src", &[]);
    let w = export(d.path(), &src, "w.safetensors", &[]);
    let b = run(
        d.path(),
        TINY,
        "b",
        &[
            &format!("model.init_from=\"{}\"", w.display()),
            "checkpoint.every_steps=4",
        ],
    );
    let end = crate::common::checkpoint_params(&b, &newest_checkpoint(&b));
    std::fs::remove_file(&w).unwrap();
    let o = kiln(
        d.path(),
        &[
            "resume",
            b.to_str().unwrap(),
            "--quiet",
            "--from",
            "step-00000004",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        crate::common::checkpoint_params(&b, &newest_checkpoint(&b)),
        end,
        "the resumed run ends where the uninterrupted one did"
    );
}

#[test]
fn tied_copies_that_differ_are_refused() {
    let g = kiln::testdir::tempdir().unwrap();
    corpus(g.path());
    let toml = GPT.replace("corpus.txt", g.path().join("corpus.txt").to_str().unwrap());
    let a = run(g.path(), &toml, "a", &[]);
    let full = tensors(&export(g.path(), &a, "a.safetensors", &[]));
    let list: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> = full
        .iter()
        .map(|(n, (s, v))| {
            let mut v = v.clone();
            if n == "lm_head.weight" {
                v[0] += 1.0;
            }
            (n.as_str(), Dtype::F32, s.clone(), f32_bytes(&v))
        })
        .collect();
    let file = g.path().join("differ.safetensors");
    write_raw(&file, &list);
    let exp = write(g.path(), "g.toml", &toml);
    let o = kiln(
        g.path(),
        &[
            "run",
            exp.to_str().unwrap(),
            "--quiet",
            "--run-dir",
            "never",
            "--set",
            &format!("model.init_from=\"{}\"", file.display()),
        ],
    );
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("`wte.weight` and `lm_head.weight` are one tied tensor in the model but differ in the file"),
        "{e}"
    );
    assert!(!g.path().join("never").exists());
}
