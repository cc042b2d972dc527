//! Language models past bytes: `kiln tokenize` writes nanoGPT token files with GPT-2's BPE
//! (the ids of the whole text, split where `data.eval_fraction` splits), a text file tokenized
//! as it loads trains to the bits of its token files, and `kiln sample` encodes and decodes with
//! the run's tokenizer, with a KV cache that gives the tokens of running the whole context.

use std::path::Path;

use crate::common::{kiln, root, stderr, stdout, summary, write};
use crate::models::GPT;

/// The book's first 20,000 bytes.
fn book(dir: &Path) -> Vec<u8> {
    let text = std::fs::read(root().join("experiments/data/text/rust-book.txt")).unwrap();
    let text = text[..20_000].to_vec();
    std::fs::write(dir.join("book.txt"), &text).unwrap();
    text
}

fn ok(dir: &Path, args: &[&str]) -> std::process::Output {
    let o = kiln(dir, args);
    assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
    o
}

fn u16s(p: &Path) -> Vec<u32> {
    std::fs::read(p)
        .unwrap()
        .chunks(2)
        .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))
        .collect()
}

/// A small gpt over GPT-2's vocabulary.
fn gpt2_experiment(dir: &Path) {
    let task = GPT
        .replace("vocab_size = 256", "vocab_size = 50257")
        .replace("dim = 32", "dim = 16")
        .replace("corpus.txt", "book.txt");
    write(dir, "gpt2.toml", &task);
}

#[test]
fn tokenized_files_hold_gpt2_ids_and_train_like_the_text_tokenized_as_it_loads() {
    let d = kiln::testdir::tempdir().unwrap();
    let text = book(d.path());
    let o = ok(
        d.path(),
        &[
            "tokenize",
            "book.txt",
            "-o",
            "train.bin",
            "--eval-fraction",
            "0.2",
        ],
    );
    let out = stdout(&o);
    assert!(out.contains("vocab_size = 50257"), "{out}");
    assert!(
        out.contains("dtype = \"u16\"") && out.contains("tokenizer = \"gpt2\""),
        "{out}"
    );
    let t = kiln::data::tokenizer::Tokenizer::load("gpt2", Path::new(".")).unwrap();
    let (ids, _) = t.encode(&text).unwrap();
    let (train, val) = (
        u16s(&d.path().join("train.bin")),
        u16s(&d.path().join("val.bin")),
    );
    let held = (ids.len() as f64 * 0.2).round() as usize;
    assert_eq!(train, ids[..ids.len() - held]);
    assert_eq!(val, ids[ids.len() - held..]);
    assert_eq!(t.decode(&[train.clone(), val].concat()).unwrap(), text);
    // the text, tokenized as it loads, trains to the bits of the token files
    gpt2_experiment(d.path());
    let base = [
        "--quiet",
        "--set",
        "sampler.shuffle=false",
        "--set",
        "data.tokenizer=\"gpt2\"",
    ];
    let mut a = vec!["run", "gpt2.toml", "--run-dir", "text"];
    a.extend(base);
    ok(d.path(), &a);
    let mut a = vec![
        "run",
        "gpt2.toml",
        "--run-dir",
        "files",
        "--set",
        "data.kind=\"tokens\"",
        "--set",
        "data.path=\"train.bin\"",
    ];
    a.extend(base);
    // (eval_fraction of the text is the held-out file here)
    let split = GPT
        .replace("vocab_size = 256", "vocab_size = 50257")
        .replace("dim = 32", "dim = 16")
        .replace("eval_fraction = 0.2", "eval_path = \"val.bin\"");
    write(d.path(), "gpt2.toml", &split);
    ok(d.path(), &a);
    let (x, y) = (
        summary(&d.path().join("text")),
        summary(&d.path().join("files")),
    );
    assert_eq!(x["params_sha256"], y["params_sha256"]);
    assert_eq!(x["eval_loss"], y["eval_loss"]);
    // refusals: exit 2, nothing written
    for (args, want) in [
        (
            &[
                "tokenize",
                "book.txt",
                "-o",
                "x.bin",
                "--eval-fraction",
                "1",
            ][..],
            "--eval-fraction 1 is out of range",
        ),
        (
            &["tokenize", "nope.txt", "-o", "x.bin"][..],
            "cannot read the text file `nope.txt`",
        ),
        (
            &["tokenize", "book.txt", "-o", "x.bin", "--tokenizer", "gtp2"][..],
            "--tokenizer: `gtp2` is neither \"bytes\", \"gpt2\" nor a tokenizer.json file",
        ),
    ] {
        let o = kiln(d.path(), args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
    assert!(!d.path().join("x.bin").exists());
    // issue 45, defect 9: the ids never replace the text (-o or --eval-out), exit 2
    let text = std::fs::read(d.path().join("book.txt")).unwrap();
    for args in [
        &["tokenize", "book.txt", "-o", "book.txt"][..],
        &["tokenize", "book.txt", "-o", "./book.txt"][..],
        &[
            "tokenize",
            "book.txt",
            "-o",
            "y.bin",
            "--eval-fraction",
            "0.1",
            "--eval-out",
            "book.txt",
        ][..],
    ] {
        let o = kiln(d.path(), args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("is the text file being tokenized"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    assert_eq!(std::fs::read(d.path().join("book.txt")).unwrap(), text);
    assert!(!d.path().join("y.bin").exists());
    // issue 45, defect 10: a link planted as the temporary file is removed, its target left
    std::fs::write(d.path().join("precious"), b"keep me").unwrap();
    std::os::unix::fs::symlink("precious", d.path().join(".z.bin.kiln-tmp")).unwrap();
    // (and a killed tokenize's leftover: its pid is past any pid the kernel gives)
    std::fs::write(d.path().join(".z.bin.kiln-tmp-2147483647"), b"old ids").unwrap();
    let o = kiln(d.path(), &["tokenize", "book.txt", "-o", "z.bin"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(d.path().join("precious")).unwrap(),
        b"keep me"
    );
    assert!(d.path().join("z.bin").is_file());
    // (the temporary file is this process's own, `.z.bin.kiln-tmp-<pid>`, made exclusively,
    // and gone once renamed; the planted link and the dead process's leftover are removed)
    let left: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".z.bin.kiln-tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let o = kiln(
        d.path(),
        &["check", "gpt2.toml", "--set", "data.tokenizer=\"gtp2\""],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("did you mean \"gpt2\"?"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn sampling_with_the_kv_cache_gives_the_tokens_of_the_whole_context() {
    let d = kiln::testdir::tempdir().unwrap();
    book(d.path());
    write(
        d.path(),
        "t.toml",
        &GPT.replace("corpus.txt", "book.txt")
            .replace("max_steps = 3", "max_steps = 20"),
    );
    ok(
        d.path(),
        &["run", "t.toml", "--quiet", "--run-dir", "bytes"],
    );
    let sample = |extra: &[&str]| {
        let mut a = vec!["sample", "bytes", "--prompt", "fn main", "--tokens", "100"];
        a.extend(extra);
        ok(d.path(), &a).stdout
    };
    // past the block (32): the context drops to its last half and is run again, both ways
    for args in [
        &["--temperature", "0"][..],
        &["--temperature", "0.9", "--top-p", "0.9", "--seed", "4"][..],
    ] {
        let cached = sample(args);
        let mut no = args.to_vec();
        no.push("--no-cache");
        assert_eq!(cached, sample(&no), "{args:?}");
        assert_eq!(cached.len(), "fn main".len() + 100 + 1, "{args:?}");
    }
    // a stop sequence ends the text there
    let greedy = sample(&["--temperature", "0"]);
    // issue 30: a temperature so small that the scaled logits overflow f32 is greedy, not
    // the least likely token every time
    assert_eq!(sample(&["--temperature", "1e-45"]), greedy);
    let text = String::from_utf8_lossy(&greedy[7..]).into_owned();
    let stop: String = text.chars().skip(10).take(3).collect();
    let o = ok(
        d.path(),
        &[
            "sample",
            "bytes",
            "--prompt",
            "fn main",
            "--tokens",
            "100",
            "--temperature",
            "0",
            "--stop",
            &stop,
        ],
    );
    let got = String::from_utf8_lossy(&o.stdout).into_owned();
    let got = got.strip_suffix('\n').unwrap_or(&got);
    assert!(got.ends_with(&stop), "{got:?} ends with {stop:?}");
    assert!(got.len() < greedy.len());
    assert!(
        stderr(&o).contains("stopped at stop sequence"),
        "{}",
        stderr(&o)
    );
    for (args, want) in [
        (&["--top-p", "0"][..], "--top-p 0 must be in (0, 1]"),
        (
            &["--temperature=-1"][..],
            "--temperature -1 must be 0 (greedy) or above",
        ),
    ] {
        let mut a = vec!["sample", "bytes"];
        a.extend(args);
        let o = kiln(d.path(), &a);
        assert_eq!(o.status.code(), Some(2));
        assert!(stderr(&o).contains(want), "{}", stderr(&o));
    }
}

#[test]
fn a_gpt2_run_samples_through_its_tokenizer() {
    let d = kiln::testdir::tempdir().unwrap();
    book(d.path());
    gpt2_experiment(d.path());
    ok(
        d.path(),
        &[
            "run",
            "gpt2.toml",
            "--quiet",
            "--run-dir",
            "g",
            "--set",
            "data.tokenizer=\"gpt2\"",
        ],
    );
    let a = ok(
        d.path(),
        &[
            "sample",
            "g",
            "--prompt",
            "Hello world",
            "--tokens",
            "12",
            "--temperature",
            "0",
            "--ignore-eos",
        ],
    );
    let b = ok(
        d.path(),
        &[
            "sample",
            "g",
            "--prompt",
            "Hello world",
            "--tokens",
            "12",
            "--temperature",
            "0",
            "--ignore-eos",
            "--no-cache",
        ],
    );
    assert_eq!(a.stdout, b.stdout);
    assert!(a.stdout.starts_with(b"Hello world"));
    assert!(stderr(&a).starts_with("12 tokens in "), "{}", stderr(&a));
}

#[test]
fn weight_decay_spares_biases_and_norms_of_a_gpt_on_every_strategy() {
    let d = kiln::testdir::tempdir().unwrap();
    crate::models::corpus(d.path());
    write(d.path(), "t.toml", GPT);
    let run = |name: &str, sets: &[&str]| -> serde_json::Value {
        let mut a = vec![
            "run",
            "t.toml",
            "--quiet",
            "--run-dir",
            name,
            "--set",
            "optim.weight_decay=0.5",
        ];
        for s in sets {
            a.extend(["--set", s]);
        }
        ok(d.path(), &a);
        summary(&d.path().join(name))
    };
    let single = run("single", &["train.batch_size=8"]);
    let all = run("all", &["train.batch_size=8", "optim.decay=\"all\""]);
    assert_ne!(single["params_sha256"], all["params_sha256"]);
    for (name, sets) in [
        (
            "ddp",
            &[
                "train.batch_size=4",
                "strategy.kind=ddp",
                "strategy.devices=2",
            ][..],
        ),
        (
            "fsdp",
            &[
                "train.batch_size=4",
                "strategy.kind=fsdp",
                "strategy.devices=2",
                "strategy.unit=layer",
            ][..],
        ),
        (
            "fsdp-model",
            &[
                "train.batch_size=4",
                "strategy.kind=fsdp",
                "strategy.devices=2",
            ][..],
        ),
    ] {
        let s = run(name, sets);
        let (a, b) = (
            single["final_loss"].as_f64().unwrap(),
            s["final_loss"].as_f64().unwrap(),
        );
        assert!((a - b).abs() <= 1e-5 * a, "{name}: {b} vs single {a}");
    }
    let o = ok(
        d.path(),
        &["check", "t.toml", "--set", "optim.weight_decay=0.5"],
    );
    assert!(
        stdout(&o).contains("(optim.decay = \"matrices\"): ") && stdout(&o).contains(" not"),
        "{}",
        stdout(&o)
    );
}

/// Issue 45, defects 1 and 13: a tokenizer.json Hugging Face's `tokenizers` panics on (a BPE
/// merge of a token with itself) or quotes whole in its error (a 1 MiB `version`) is exit 2
/// naming the file, in a message of bounded length, with nothing written.
#[test]
fn a_tokenizer_json_tokenizers_cannot_use_is_exit_2_naming_it_briefly() {
    let d = kiln::testdir::tempdir().unwrap();
    book(d.path());
    let merges = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null,"model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"vocab":{"<|endoftext|>":0,"a":1},"merges":[["<|endoftext|>","<|endoftext|>"]]}}"#;
    std::fs::write(d.path().join("merges.json"), merges).unwrap();
    let huge = format!(
        r#"{{"version":"{}","model":{{"type":"BPE"}}}}"#,
        "v".repeat(1 << 20)
    );
    std::fs::write(d.path().join("huge.json"), huge).unwrap();
    for file in ["merges.json", "huge.json"] {
        let o = kiln(
            d.path(),
            &["tokenize", "book.txt", "-o", "x.bin", "--tokenizer", file],
        );
        let e = stderr(&o);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{file}: {}",
            &e[..e.len().min(2000)]
        );
        assert!(e.contains(file), "{file}: {}", &e[..e.len().min(2000)]);
        assert!(e.len() < 4000, "{file}: {} bytes of error", e.len());
        // kiln's error only: the panic it caught is not printed too
        assert!(!e.contains("panicked at"), "{file}: {e}");
    }
    assert!(!d.path().join("x.bin").exists());
}

/// Issue 45, defects 7 and 8: a tokenizer.json whose ids are sparse (3 entries, the largest id
/// 65,600) needs u32 token files and `model.vocab_size` above its largest id, not its entry
/// count: `kiln tokenize` wrote id 65,600 as u16 (64) and advised `vocab_size = 3`, and
/// `data.kind = "text"` with it passed the vocabulary check and panicked in the embedding.
#[test]
fn a_tokenizer_with_sparse_ids_is_sized_by_its_largest_id() {
    let d = kiln::testdir::tempdir().unwrap();
    let json = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,"model":{"type":"WordLevel","vocab":{"a":0,"[UNK]":1,"b":65600},"unk_token":"[UNK]"}}"#;
    std::fs::write(d.path().join("sparse.json"), json).unwrap();
    std::fs::write(d.path().join("ab.txt"), "a b ".repeat(300)).unwrap();
    let o = kiln(
        d.path(),
        &[
            "tokenize",
            "ab.txt",
            "-o",
            "ab.bin",
            "--tokenizer",
            "sparse.json",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.contains("u32") && out.contains("65601"), "{out}");
    let bytes = std::fs::read(d.path().join("ab.bin")).unwrap();
    let ids: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(&ids[..4], &[0, 65600, 0, 65600]);
    // text data with it: refused up front below the largest id
    std::fs::write(
        d.path().join("t.toml"),
        "[model]\nkind = \"gpt\"\nvocab_size = 300\nblock_size = 8\nlayers = 1\nheads = 1\ndim = 8\n\n[data]\nkind = \"text\"\npath = \"ab.txt\"\ntokenizer = \"sparse.json\"\n\n[train]\nmax_steps = 1\n",
    )
    .unwrap();
    let o = kiln(d.path(), &["run", "t.toml", "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("has 65601 tokens, but `model.vocab_size` = 300"),
        "{}",
        stderr(&o)
    );
    assert!(!d.path().join("runs").exists());
}

/// Issue 45, defect 14: a run records the files it reads (`inputs.json`: the tokenizer's
/// sha256, the data files' lengths and ends) and its tokenizer by absolute path. `kiln sample`
/// of the run directory finds a tokenizer given relative to the experiment file from anywhere,
/// and refuses one replaced since (it decoded with it, exit 0), as `kiln resume` refuses a
/// re-tokenized corpus or another tokenizer (it went on training on other ids).
#[test]
fn a_run_refuses_a_tokenizer_or_corpus_replaced_since_it_was_made() {
    let d = kiln::testdir::tempdir().unwrap();
    let exp = d.path().join("exp");
    std::fs::create_dir_all(&exp).unwrap();
    let tok = |b: &str| {
        format!(
            r#"{{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{{"type":"Whitespace"}},"post_processor":null,"decoder":null,"model":{{"type":"WordLevel","vocab":{{"a":0,"{b}":1,"c":2,"[UNK]":3}},"unk_token":"[UNK]"}}}}"#
        )
    };
    std::fs::write(exp.join("tok.json"), tok("b")).unwrap();
    std::fs::write(exp.join("abc.txt"), "a b c b a c ".repeat(100)).unwrap();
    std::fs::write(
        exp.join("t.toml"),
        "[model]\nkind = \"gpt\"\nvocab_size = 4\nblock_size = 8\nlayers = 1\nheads = 1\ndim = 8\n\n[data]\nkind = \"text\"\npath = \"abc.txt\"\ntokenizer = \"tok.json\"\n\n[train]\nmax_steps = 2\n\n[checkpoint]\nevery_steps = 2\n",
    )
    .unwrap();
    let o = kiln(
        d.path(),
        &["run", "exp/t.toml", "--quiet", "--run-dir", "run"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let inputs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.path().join("run/inputs.json")).unwrap())
            .unwrap();
    assert!(inputs["data.tokenizer"]["sha256"].is_string(), "{inputs}");
    // a relative tokenizer path, from another directory
    let elsewhere = d.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let o = kiln(
        &elsewhere,
        &["sample", "../run", "--tokens", "3", "--prompt", "a"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // the tokenizer replaced: sample and resume refuse, naming it
    std::fs::write(exp.join("tok.json"), tok("z")).unwrap();
    for args in [
        &["sample", "run", "--tokens", "3", "--prompt", "a"][..],
        &["resume", "run", "--quiet", "--set", "train.max_steps=4"][..],
    ] {
        let o = kiln(d.path(), args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("`data.tokenizer` =")
                && stderr(&o).contains("changed since the run was made"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    // restored, then the corpus re-written: resume refuses it
    std::fs::write(exp.join("tok.json"), tok("b")).unwrap();
    std::fs::write(exp.join("abc.txt"), "c b a ".repeat(200)).unwrap();
    let o = kiln(
        d.path(),
        &["resume", "run", "--quiet", "--set", "train.max_steps=4"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("`data.path` ="), "{}", stderr(&o));
    assert!(
        !d.path().join("run/checkpoints/step-00000004").exists(),
        "nothing trained"
    );
}

/// Issue 45, defect 12: `--eval-fraction` copies the held-out tail a buffer at a time (it read
/// the whole temporary file: 80 MB of ids for 40 MB of text). Under a 64 MiB data limit
/// (`RLIMIT_DATA`: heap and private mappings, not the mapped text) the tokenize succeeds; the
/// whole-file read alone would need more.
#[test]
fn the_held_out_tail_is_copied_in_bounded_memory() {
    let d = kiln::testdir::tempdir().unwrap();
    let line = "the kiln fires the clay and the clay becomes a pot\n";
    std::fs::write(
        d.path().join("big.txt"),
        line.repeat((40 << 20) / line.len()),
    )
    .unwrap();
    let mut cmd = crate::common::clean_cmd(
        std::path::Path::new(crate::common::KILN),
        d.path(),
        &[
            "tokenize",
            "big.txt",
            "-o",
            "big.bin",
            "--tokenizer",
            "bytes",
            "--eval-fraction",
            "0.9",
        ],
    );
    crate::common::limit(&mut cmd, libc::RLIMIT_DATA, 64 << 20);
    let o = cmd.output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::metadata(d.path().join("big.txt")).unwrap().len();
    let train = std::fs::metadata(d.path().join("big.bin")).unwrap().len();
    let held = std::fs::metadata(d.path().join("big.val.bin"))
        .unwrap()
        .len();
    assert_eq!(train + held, 2 * text, "every byte a u16 id");
    assert!(held > 8 * train, "{held} vs {train}");
}
