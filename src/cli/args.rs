//! The command-line definition and dispatch.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use super::{
    bench, check, ckpt, data, env, eval, export, init, report, resume, run, sample, submit, sweep,
    tokenize, track,
};

use crate::config::{self, Resolved};
use crate::Result;

#[derive(Debug, Parser)]
#[command(
    name = "kiln",
    version,
    about = "Run deep-learning experiments described in TOML"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate an experiment without training and print the resolved config with the source of
    /// every value.
    Check(ConfigArgs),
    /// Train an experiment.
    Run(run::RunArgs),
    /// Continue a run in place from its newest verified checkpoint.
    Resume(resume::ResumeArgs),
    /// Submit an experiment to Slurm: an sbatch script in a new run directory that requeues
    /// itself after a preemption or before its time limit and continues where it stopped.
    Submit(submit::SubmitArgs),
    /// Show a run's state: its Slurm job's (pending, running, requeued, done, failed, why) and
    /// its own (step, loss, newest checkpoint).
    Status(submit::StatusArgs),
    /// Evaluate a run's checkpoint on its evaluation data (or other data of the same shape):
    /// prints the metrics and keeps them in the run's `evals/`.
    Eval(eval::EvalArgs),
    /// Write a run's weights as a safetensors file PyTorch (or Burn) loads.
    Export(export::ExportArgs),
    /// Write one HTML file of plots for runs (overlaid) or a sweep: curves, time per phase,
    /// memory per rank, ranked trials.
    Report(report::ReportArgs),
    /// Inspect a run's checkpoints.
    #[command(subcommand)]
    Ckpt(ckpt::CkptCommand),
    /// Run every trial of an experiment's `[sweep]`; resumable, with a results table.
    Sweep(sweep::SweepArgs),
    /// Show kiln's version, backends, CPU threads, CUDA driver, GPUs and NCCL, and what to fix;
    /// with an experiment file (or run directory), the NCCL variables its run would export.
    Env(env::EnvArgs),
    /// Write a commented experiment file from a template.
    Init(init::InitArgs),
    /// Measure training throughput (steps/s, samples/s) on the CPU backends.
    Bench(bench::BenchArgs),
    /// Generate text from a language model run's checkpoint (gpt, llama: every language model), streaming it to stdout.
    Sample(sample::SampleArgs),
    /// Tokenize a text file into nanoGPT-format token files (`data.kind = "tokens"`).
    Tokenize(tokenize::TokenizeArgs),
    /// See what an experiment trains on: `kiln data preview` (its rows, in order) and `kiln
    /// data stats` (its documents and tokens counted).
    #[command(subcommand)]
    Data(data::DataCommand),
    /// Experiment tracking: `kiln track push RUN` sends a run's metrics to MLflow.
    #[command(subcommand)]
    Track(track::TrackCommand),
}

impl Command {
    /// Whether the command only reads and prints: then a reader that closes the pipe early
    /// (`kiln ckpt list RUN | head`) ends it with success. A command that trains or writes
    /// files exits 1 when its stdout fails, after it has finished its work.
    pub fn reads_only(&self) -> bool {
        match self {
            Command::Check(_)
            | Command::Status(_)
            | Command::Ckpt(_)
            | Command::Env(_)
            | Command::Data(_)
            | Command::Sample(_) => true,
            Command::Init(a) => a.list,
            Command::Sweep(a) => a.command.is_some(),
            _ => false,
        }
    }
}

/// An experiment file and its overrides.
#[derive(Debug, Args, Clone)]
pub struct ConfigArgs {
    /// The experiment TOML file.
    pub file: PathBuf,
    /// Override a key, e.g. `--set optim.lr=3e-3` (the value is parsed as TOML).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// The command's own flags that set config keys (`--nnodes`), typed: the top layer.
    #[arg(skip)]
    pub flags: Vec<config::Flag>,
}

impl ConfigArgs {
    /// Resolves the config from the file, the `KILN_` environment and the `--set` flags.
    pub fn resolve(&self) -> Result<Resolved> {
        let env: Vec<(String, String)> = std::env::vars().collect();
        Ok(config::load_with_flags(
            &self.file,
            &env,
            &self.sets,
            &self.flags,
        )?)
    }
}

/// Runs a parsed command line.
pub fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Check(a) => check::check(&a),
        Command::Run(a) => {
            crate::train::preempt::install();
            run::run(&a)
        }
        Command::Resume(a) => {
            crate::train::preempt::install();
            resume::resume(&a)
        }
        Command::Submit(a) => submit::submit(&a),
        Command::Status(a) => submit::status(&a),
        Command::Eval(a) => eval::eval(&a),
        Command::Export(a) => export::export(&a),
        Command::Report(a) => report::report(&a),
        Command::Ckpt(c) => ckpt::ckpt(&c),
        Command::Sweep(a) => sweep::sweep(&a),
        Command::Env(a) => env::env(&a),
        Command::Init(a) => init::init(&a),
        Command::Bench(a) => bench::bench(&a),
        Command::Sample(a) => sample::sample(&a),
        Command::Tokenize(a) => tokenize::tokenize(&a),
        Command::Data(c) => data::data(&c),
        Command::Track(c) => track::track(&c),
    }
}
