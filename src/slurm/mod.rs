//! Layer: slurm (above launch; below sweep and cli).
//!
//! Slurm: `kiln submit` writes an sbatch script into a new run directory and submits it; the
//! script runs `srun kiln resume RUN_DIR` with one task per kiln node (ranks from Slurm, node
//! 0's store on the job's first host at a port derived from the job id, the job token in a
//! user-only file), passes a stop signal on to kiln, and requeues itself when kiln stops with a
//! checkpoint, so the job continues where it stopped. `kiln status` reads the job's state from
//! `squeue`, `scontrol` and `sacct`. Sweeps submit their trials as one job array (`array_script`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::config::{self, Config, Resolved, SlurmConfig};
use crate::error::{Error, Result};
use crate::rundir::{choose_run_dir, claim_run_dir, stored_config_for_elsewhere};
use crate::train::preempt::EXIT_PREEMPTED;
use crate::ui;

mod query;
#[cfg(test)]
use query::{from_scontrol, task_in};
pub use query::{query, JobState};

/// What `kiln submit` was asked besides the config (whose `[slurm]` holds the job's shape).
#[derive(Debug, Clone, Default)]
pub struct SubmitOptions {
    /// Print the script (and the sbatch command) and submit nothing.
    pub dry_run: bool,
    /// Options given after `--`, passed to `sbatch` as they are.
    pub extra: Vec<String>,
}

/// `slurm/job.json` in a submitted run directory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobRecord {
    pub job_id: String,
    pub job_name: String,
    /// Seconds since the Unix epoch.
    pub submitted: f64,
    pub script: PathBuf,
    pub nodes: usize,
    pub tasks_per_node: usize,
}

/// Quotes `s` for bash.
pub fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+=:,@%".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A job name sbatch takes as it is: letters, digits, `.`, `_`, `-`.
pub fn job_name(prefix: &str, name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    format!("{prefix}{clean}")
}

/// A path as an `#SBATCH` option value: double-quoted, with Slurm's `%` patterns escaped
/// (`keep` names the patterns meant, e.g. `%j`).
fn sbatch_path(path: &str, keep: &[&str]) -> String {
    let mut out = path.replace('%', "%%");
    for k in keep {
        out = out.replace(&k.replace('%', "%%"), k);
    }
    format!("\"{}\"", out.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The `#SBATCH` header lines of a job of this shape.
fn header(s: &SlurmConfig, name: &str, gpus: Option<usize>, output: &str) -> Vec<String> {
    let mut h = vec![
        format!("--job-name={name}"),
        format!("--nodes={}", s.nodes),
        format!("--ntasks-per-node={}", s.tasks_per_node),
    ];
    if let Some(g) = gpus.filter(|g| *g > 0) {
        h.push(format!("--gpus-per-node={g}"));
    }
    if let Some(c) = s.cpus_per_task {
        h.push(format!("--cpus-per-task={c}"));
    }
    if let Some(t) = &s.time {
        h.push(format!("--time={t}"));
    }
    if let Some(p) = &s.partition {
        h.push(format!("--partition={p}"));
    }
    if let Some(a) = &s.account {
        h.push(format!("--account={a}"));
    }
    h.push(
        if s.requeue {
            "--requeue"
        } else {
            "--no-requeue"
        }
        .into(),
    );
    // to the batch script, which passes it on to kiln and knows then to requeue the job
    h.push(format!("--signal=B:USR1@{}", s.signal_secs));
    h.push("--open-mode=append".into());
    h.push(format!("--output={output}"));
    h.extend(s.sbatch_args.iter().cloned());
    h.into_iter().map(|l| format!("#SBATCH {l}")).collect()
}

/// GPUs per node: `[slurm] gpus_per_node`, else the experiment's devices on CUDA.
fn gpus_per_node(c: &Config) -> Option<usize> {
    c.slurm.gpus_per_node.or(match c.backend.device {
        crate::config::Device::Cuda => Some(c.strategy.devices.count() * c.slurm.tasks_per_node),
        crate::config::Device::Cpu | crate::config::Device::Wgpu => None,
    })
}

/// The body that runs `kiln resume "$RUN_DIR"` under srun, passes stop signals on and requeues
/// after a stop with a checkpoint.
fn body(
    kiln: &Path,
    s: &SlurmConfig,
    devices: usize,
    loaders: usize,
    segment: Option<&Segment>,
) -> String {
    // the task's CPUs shared by its ranks (backend.threads is per rank), less each rank's data
    // loader threads
    let (threads_line, srun_cpus, threads) = if s.cpus_per_task.is_some() {
        (
            format!(
                "threads=$(( SLURM_CPUS_PER_TASK / {}{} ))\n[ \"$threads\" -ge 1 ] || threads=1\n",
                devices.max(1),
                if loaders > 0 {
                    format!(" - {loaders}")
                } else {
                    String::new()
                }
            ),
            " --cpus-per-task=\"$SLURM_CPUS_PER_TASK\"",
            " --set \"backend.threads=$threads\"",
        )
    } else {
        (String::new(), "", "")
    };
    let requeue = if s.requeue {
        format!(
            r#"# stopped with a checkpoint before the time limit (USR1): requeue to continue. After
# SIGTERM Slurm itself requeues (preemption, scontrol requeue) or the job was cancelled.
if [ "$rc" -eq {EXIT_PREEMPTED} ] && [ "$stop" = USR1 ]; then
  echo "kiln: stopped with a checkpoint; requeueing job $SLURM_JOB_ID to continue in $RUN_DIR"
  scontrol requeue "$SLURM_JOB_ID" || echo "kiln: scontrol requeue failed: continue with \`kiln resume $RUN_DIR\`"
fi
"#
        )
    } else {
        String::new()
    };
    format!(
        r#"KILN={kiln}
# node 0's rendezvous store: the job's first host, at a port derived from the job id
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))
export MASTER_ADDR MASTER_PORT
echo "kiln: job $SLURM_JOB_ID (restart ${{SLURM_RESTART_COUNT:-0}}) on $SLURM_JOB_NODELIST: $RUN_DIR"
# a stop signal to this script (USR1 before the time limit or from scancel --signal=USR1
# --batch; TERM from a requeue, a preemption or scancel) goes on to kiln
pid=""
stop=""
# shellcheck disable=SC2317,SC2034  # called from the traps; `stop` is read when requeueing
forward() {{ stop="$1"; if [ -n "$pid" ]; then kill -"$1" "$pid" 2>/dev/null; fi; }}
trap 'forward USR1' USR1
trap 'forward TERM' TERM
{guard}# every start, and every start after a requeue, continues from the newest verified checkpoint
{threads_line}srun --ntasks-per-node={tasks}{srun_cpus} --kill-on-bad-exit=0 "$KILN" resume "$RUN_DIR" --quiet{threads}{pause} &
pid=$!
while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done
wait "$pid"
rc=$?
pid=""
{requeue}{advance}exit "$rc"
"#,
        kiln = sh_quote(&kiln.display().to_string()),
        pause = segment.map_or(String::new(), |g| format!(
            " --set train.pause_at_step={}",
            g.pause_at
        )),
        guard = segment.map_or(String::new(), |g| format!(
            r#"# an asha segment: it runs only while the sweep's ledger has this job for it (a job
# requeued after its segment was recorded, or one whose submission was never recorded,
# stops here)
SWEEP_DIR={dir}
TRIAL={trial}
if [ -n "$stop" ]; then echo "kiln: stopped by $stop before the segment started"; exit 0; fi
verdict=$("$KILN" sweep advance "$SWEEP_DIR" --trial "$TRIAL" --job "$SLURM_ARRAY_JOB_ID" --check) || exit
if [ "$verdict" != run ]; then
  echo "kiln: job $SLURM_ARRAY_JOB_ID is not trial $TRIAL's segment in the sweep's ledger (any more); not running it"
  exit 0
fi
if [ -n "$stop" ]; then echo "kiln: stopped by $stop before the segment started"; exit 0; fi
"#,
            dir = sh_quote(&g.sweep_dir.display().to_string()),
            trial = sh_quote(g.trial),
        )),
        advance = segment.map_or(String::new(), |_| {
            r#"# the segment ended by itself, or reached its rung as a stop came: record it and submit
# the sweep's next segments (none after a TERM: a cancel or a preemption; the requeued
# job or the next submission goes on)
if [ "$rc" -eq 0 ] || [ -z "$stop" ]; then
  if [ "$stop" = TERM ]; then only=(--record-only); else only=(); fi
  "$KILN" sweep advance "$SWEEP_DIR" --trial "$TRIAL" --job "$SLURM_ARRAY_JOB_ID" --exit "$rc" "${only[@]}" ||
    echo "kiln: the sweep did not advance; continue it with: kiln sweep --resume \"$SWEEP_DIR\""
else
  echo "kiln: stopped by $stop; a requeued job goes on, else continue the sweep with: kiln sweep --resume \"$SWEEP_DIR\""
fi
"#
            .to_string()
        }),
        tasks = s.tasks_per_node,
    )
}

/// The sbatch script of one run.
pub fn run_script(c: &Config, kiln: &Path, run_dir: &Path, extra: &[String]) -> String {
    let s = &c.slurm;
    let dir = run_dir.display().to_string();
    let name = job_name("kiln-", &c.experiment.name);
    let mut out = format!(
        "#!/bin/bash\n# Written by kiln {} (`kiln submit`): trains experiment {name} in $RUN_DIR.\n",
        env!("CARGO_PKG_VERSION"),
    );
    // the log's directory: the name pattern `%j` is Slurm's, any other `%` is the path's
    let output = sbatch_path(&format!("{dir}/logs/"), &[]);
    let output = format!("{}slurm-%j.out\"", &output[..output.len() - 1]);
    for l in header(s, &name, gpus_per_node(c), &output) {
        out.push_str(&l);
        out.push('\n');
    }
    if !extra.is_empty() {
        let e: Vec<String> = extra.iter().map(|a| sh_quote(a)).collect();
        out.push_str(&format!(
            "# more sbatch options, given on its command line: {}\n",
            e.join(" ")
        ));
    }
    out.push_str(&format!("\nRUN_DIR={}\n", sh_quote(&dir)));
    out.push_str(&body(
        kiln,
        s,
        c.strategy.devices.count(),
        c.data.workers,
        None,
    ));
    out
}

/// An asha sweep's segment as a one-task array: the trial trains to its rung and pauses there
/// (`pause_at`; 0 runs to the end), then `kiln sweep advance` records it and submits what comes
/// next.
pub struct Segment<'a> {
    pub sweep_dir: &'a Path,
    pub trial: &'a str,
    pub pause_at: usize,
}

/// The sbatch script of a sweep's job array: array index i runs the trial in `dirs[i]`, at
/// most `parallel` at once.
pub fn array_script(
    c: &Config,
    kiln: &Path,
    sweep_dir: &Path,
    trials: &[(usize, PathBuf)],
    parallel: usize,
    segment: Option<&Segment>,
) -> String {
    let s = &c.slurm;
    let name = job_name(
        "kiln-sweep-",
        &sweep_dir
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    let indices: Vec<String> = trials.iter().map(|(i, _)| i.to_string()).collect();
    let mut out = format!(
        "#!/bin/bash\n# Written by kiln {} (`kiln sweep --executor slurm`): the trials of sweep {name}.\n",
        env!("CARGO_PKG_VERSION"),
    );
    out.push_str(&format!(
        "#SBATCH --array={}%{}\n",
        indices.join(","),
        parallel.max(1)
    ));
    let output = sbatch_path(&format!("{}/logs/", sweep_dir.display()), &[]);
    let output = format!("{}slurm-%A_%a.out\"", &output[..output.len() - 1]);
    for l in header(s, &name, gpus_per_node(c), &output) {
        out.push_str(&l);
        out.push('\n');
    }
    out.push_str("\ncase \"$SLURM_ARRAY_TASK_ID\" in\n");
    for (i, d) in trials {
        out.push_str(&format!(
            "  {i}) RUN_DIR={} ;;\n",
            sh_quote(&d.display().to_string())
        ));
    }
    out.push_str(
        "  *) echo \"kiln: no trial for array index $SLURM_ARRAY_TASK_ID\" >&2; exit 2 ;;\nesac\n",
    );
    out.push_str(&body(
        kiln,
        s,
        c.strategy.devices.count(),
        c.data.workers,
        segment,
    ));
    out
}

/// Runs `sbatch --parsable [extra] script`: the job id, or exit 2 with sbatch's own message.
pub fn sbatch(script: &Path, extra: &[String]) -> Result<String> {
    let mut cmd = Command::new("sbatch");
    // a job submitting the next (an asha segment) or a submission from inside an allocation:
    // the new job gets its own SLURM_* values, and one left over (SLURM_MEM_PER_CPU,
    // SLURM_CPUS_PER_TASK) would be read as a request by srun in it
    if std::env::var_os("SLURM_JOB_ID").is_some() {
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            let keep = ["SLURM_CONF", "SLURM_CLUSTERS"].contains(&k.as_ref());
            if (k.starts_with("SLURM_") && !keep) || k == "MASTER_ADDR" || k == "MASTER_PORT" {
                cmd.env_remove(k.as_ref());
            }
        }
        // a cancel of this job signals every process of it: an sbatch killed after the
        // controller took the job would leave a job no ledger records, so it finishes (it
        // takes well under Slurm's KillWait; an ignored signal stays ignored across exec)
        use std::os::unix::process::CommandExt;
        // SAFETY: between fork and exec, only async-signal-safe signal(2) calls.
        unsafe {
            cmd.pre_exec(|| {
                for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
                    libc::signal(sig, libc::SIG_IGN);
                }
                Ok(())
            });
        }
    }
    let out = cmd
        .arg("--parsable")
        .args(extra)
        .arg(script)
        .output()
        .map_err(|e| {
            Error::Usage(format!(
                "cannot run `sbatch` ({e}): kiln submits through Slurm's sbatch\n  = help: run this on a machine of the cluster (a login node) with Slurm on PATH; `kiln submit --dry-run` prints the script without it"
            ))
        })?;
    if !out.status.success() {
        let msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(Error::Usage(format!(
            "sbatch refused the job: {}",
            if msg.is_empty() {
                format!("exit status {}", out.status.code().unwrap_or(-1))
            } else {
                msg
            }
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let id = text
        .trim()
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::Invalid(format!(
            "sbatch printed no job id (`{}`)",
            text.trim()
        )));
    }
    Ok(id)
}

/// Whether `sbatch` can be run (on PATH).
pub fn have_sbatch() -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("sbatch").is_file()))
        .unwrap_or(false)
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Writes `text` to `path` readable by the user only.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

/// Writes a new job token to `path`, readable by the user only.
pub fn write_token(path: &Path) -> Result<()> {
    write_private(path, &new_token()?)
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

fn new_token() -> Result<String> {
    crate::rendezvous::token::generate().map_err(|e| Error::io("generating a job token", e))
}

/// The kiln executable the job runs (this one).
pub fn kiln_exe() -> Result<PathBuf> {
    let exe = std::env::current_exe().map_err(|e| Error::io("finding the kiln executable", e))?;
    Ok(exe.canonicalize().unwrap_or(exe))
}

/// `kiln submit`: checks the experiment as a run on `nodes x tasks_per_node` kiln nodes would,
/// writes the run directory (config, token, script) and submits the script. With `dry_run`
/// it prints the script and writes nothing.
pub fn submit(r: &Resolved, o: &SubmitOptions) -> Result<()> {
    let c = &r.config;
    let s = &c.slurm;
    let nnodes = s.nodes * s.tasks_per_node;
    job_shape_ok(r, o, nnodes)?;
    // the run as the job will see it: its node count and a token file in the run directory
    let out_abs = absolute(Path::new(&c.experiment.output_dir).to_path_buf())?;
    let run_dir = choose_run_dir(&out_abs, &c.experiment.name);
    let mut job_cfg = r.clone();
    job_cfg.config.launch.nnodes = nnodes;
    job_cfg.config.launch.node_rank = 0;
    let token_path = run_dir.join("slurm/token");
    if nnodes > 1 {
        job_cfg.config.launch.token_file = Some(token_path.display().to_string());
    }
    config::validate(&job_cfg)?;
    crate::launch::check(&job_cfg)?;
    let kiln = kiln_exe()?;
    let script = run_script(&job_cfg.config, &kiln, &run_dir, &o.extra);
    if o.dry_run {
        let mut cmd = vec!["sbatch".to_string(), "--parsable".into()];
        cmd.extend(o.extra.iter().map(|a| sh_quote(a)));
        cmd.push(sh_quote(
            &run_dir.join("slurm/job.sbatch").display().to_string(),
        ));
        ui::note(&format!(
            "dry run: nothing written or submitted; `{}` would submit this script:",
            cmd.join(" ")
        ));
        crate::ui::out_raw(&script);
        return Ok(());
    }
    if !have_sbatch() {
        return Err(Error::Usage(
            "`sbatch` is not on PATH: kiln submits through Slurm's sbatch\n  = help: run this on a machine of the cluster (a login node); `kiln submit --dry-run` prints the script without it".into(),
        ));
    }
    // the directory is claimed by creating it (another submission or run may have taken the
    // name meanwhile): the script and config name the one claimed
    let (lock, made) = claim_run_dir(&out_abs, &c.experiment.name)?;
    let claimed = lock.dir().to_path_buf();
    let (run_dir, token_path, script) = if claimed == run_dir {
        (run_dir, token_path, script)
    } else {
        let token_path = claimed.join("slurm/token");
        if nnodes > 1 {
            job_cfg.config.launch.token_file = Some(token_path.display().to_string());
        }
        let script = run_script(&job_cfg.config, &kiln, &claimed, &o.extra);
        (claimed, token_path, script)
    };
    // write everything, submit, and take it all back if sbatch refuses; the job, which may
    // start at once, takes the directory's lock, so this process lets go of it first
    drop(lock);
    let result = write_and_submit(&run_dir, &job_cfg, &token_path, &script, &o.extra);
    // the job is submitted: its directory stays, whatever happens to its record
    let result = result.and_then(|id| {
        crate::rundir::write_json(
            &run_dir.join("slurm/job.json"),
            &JobRecord {
                job_id: id.clone(),
                job_name: job_name("kiln-", &c.experiment.name),
                submitted: now(),
                script: run_dir.join("slurm/job.sbatch"),
                nodes: s.nodes,
                tasks_per_node: s.tasks_per_node,
            },
        )
        .map_err(|e| {
            Error::Invalid(format!(
                "Slurm job {id} is submitted and runs in {}, but its record could not be written ({e}); `kiln status` will not know the job",
                run_dir.display()
            ))
        })
        .map(|_| id)
    });
    match result {
        Ok(id) => {
            ui::out(&format!(
                "submitted Slurm job {id}: {} node(s) x {} task(s); run dir: {}",
                s.nodes,
                s.tasks_per_node,
                run_dir.display()
            ));
            ui::note(&format!(
                "  = `kiln status {}` shows the job; its output is in logs/slurm-{id}.out",
                run_dir.display()
            ));
            Ok(())
        }
        Err(e @ Error::Invalid(_)) => Err(e),
        Err(e) => {
            // the claimed directory, then (only when empty) what claiming it created above it
            let _ = fs::remove_dir_all(&run_dir);
            if let Some(root) = made.filter(|m| *m != run_dir) {
                for a in run_dir.ancestors().skip(1) {
                    if fs::remove_dir(a).is_err() || a == root {
                        break;
                    }
                }
            }
            Err(e)
        }
    }
}

/// What stops a submission up front: a line break in an sbatch option, several tasks per node
/// on CUDA, several nodes with a one-process strategy.
fn job_shape_ok(r: &Resolved, o: &SubmitOptions, nnodes: usize) -> Result<()> {
    let c = &r.config;
    for a in &o.extra {
        if a.contains(['\n', '\r']) {
            return Err(Error::Usage(format!(
                "the sbatch option {a:?} after `--` holds a line break"
            )));
        }
    }
    if c.slurm.tasks_per_node > 1 && c.backend.device.needs_gpus() {
        return Err(Error::Usage(format!(
            "`slurm.tasks_per_node` = {} with backend.device = \"cuda\": one kiln process drives all of a node's GPUs\n  = help: use tasks_per_node = 1 and strategy.devices = the GPUs per node",
            c.slurm.tasks_per_node
        )));
    }
    if nnodes > 1 && c.strategy.kind == crate::config::StrategyKind::Single {
        return Err(Error::Usage(format!(
            "the job has {nnodes} kiln nodes (slurm.nodes / --nodes x slurm.tasks_per_node / --tasks-per-node), but strategy.kind = \"single\" runs in one process\n  = help: use strategy.kind = \"ddp\" or \"fsdp\" across nodes, or one node"
        )));
    }
    Ok(())
}

/// `path` from the working directory (a job runs elsewhere).
pub fn absolute(path: PathBuf) -> Result<PathBuf> {
    if path.is_absolute() {
        return Ok(path);
    }
    Ok(std::env::current_dir()
        .map_err(|e| Error::io("finding the working directory", e))?
        .join(path))
}

/// Writes the job's directory (logs/, slurm/, config.toml, the token, the script) and submits
/// the script (the caller has let go of the directory: the job takes its lock).
fn write_and_submit(
    run_dir: &Path,
    job_cfg: &Resolved,
    token_path: &Path,
    script: &str,
    extra: &[String],
) -> Result<String> {
    let slurm_dir = run_dir.join("slurm");
    fs::create_dir_all(run_dir.join("logs"))
        .and_then(|_| fs::create_dir_all(&slurm_dir))
        .map_err(|e| Error::io(format!("creating {}", slurm_dir.display()), e))?;
    crate::rundir::replace_file(
        &run_dir.join("config.toml"),
        config::to_toml(&stored_config_for_elsewhere(job_cfg)).as_bytes(),
    )
    .map_err(|e| Error::io(format!("writing {}/config.toml", run_dir.display()), e))?;
    write_private(token_path, &new_token()?)
        .map_err(|e| Error::io(format!("writing {}", token_path.display()), e))?;
    let script_path = slurm_dir.join("job.sbatch");
    fs::write(&script_path, script)
        .map_err(|e| Error::io(format!("writing {}", script_path.display()), e))?;
    sbatch(&script_path, extra)
}

/// `kiln status RUN_DIR`: the Slurm job's state (when it was submitted) and the run's own.
pub fn status(run_dir: &Path) -> Result<String> {
    if !run_dir.join("config.toml").is_file() {
        return Err(Error::Usage(format!(
            "`{}` is not a kiln run directory (no config.toml); pass the directory `kiln submit` or `kiln run` printed",
            run_dir.display()
        )));
    }
    let mut lines = Vec::new();
    let job: Option<JobRecord> = fs::read_to_string(run_dir.join("slurm/job.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    if let Some(j) = &job {
        match query(&j.job_id) {
            Err(why) => lines.push(format!(
                "job {} ({}): Slurm could not be asked: {why}",
                j.job_id, j.job_name
            )),
            Ok(Some(st)) => {
                let mut l = format!(
                    "job {} ({}): {} [{}]",
                    j.job_id,
                    j.job_name,
                    st.word(),
                    st.state
                );
                if let Some(r) = &st.reason {
                    l.push_str(&format!(", reason: {r}"));
                }
                if st.restarts > 0 {
                    l.push_str(&format!(", requeued {} time(s)", st.restarts));
                }
                if let Some(n) = &st.nodes {
                    l.push_str(&format!(", nodes {n}"));
                }
                if let Some(e) = &st.elapsed {
                    l.push_str(&format!(", run time {e}"));
                }
                if st.word() == "failed" {
                    if let Some(x) = &st.exit_code {
                        l.push_str(&format!(", exit code {x}"));
                    }
                }
                lines.push(l);
            }
            Ok(None) => lines.push(format!(
                "job {} ({}): no longer known to Slurm (squeue, scontrol, sacct); the run's own state follows",
                j.job_id, j.job_name
            )),
        }
    }
    lines.push(run_line(run_dir));
    if let Some(j) = &job {
        lines.push(format!(
            "log: {}",
            run_dir
                .join(format!("logs/slurm-{}.out", j.job_id))
                .display()
        ));
    }
    Ok(lines.join("\n") + "\n")
}

/// The run's own state: its summary, else its last metrics line; its newest checkpoint.
fn run_line(run_dir: &Path) -> String {
    let summary = crate::rundir::SummaryFile::read(run_dir).map(|s| s.json);
    let last = crate::rundir::MetricsFile::last_line(run_dir);
    let mut l = match &summary {
        Some(s) => {
            let status = s["status"].as_str().unwrap_or("?");
            let mut l = format!("run: {status} at step {}", s["steps"]);
            if let Some(loss) = s["final_loss"].as_f64() {
                l.push_str(&format!(", loss {loss:.4}"));
            }
            if let Some(by) = s["stopped_by"].as_str() {
                l.push_str(&format!(" (stopped by {by})"));
            }
            if let Some(e) = s["error"].as_str() {
                l.push_str(&format!(": {}", e.lines().next().unwrap_or("")));
            }
            l
        }
        None => match &last {
            Some(m) => format!(
                "run: in progress or stopped, last logged step {} loss {:.4}",
                m["step"],
                m["loss"].as_f64().unwrap_or(f64::NAN)
            ),
            None => "run: not started".to_string(),
        },
    };
    // the newest finished checkpoint by name (not verified: that reads every byte; `kiln ckpt
    // verify` does)
    if let Ok(store) = crate::rundir::checkpoint_store(run_dir) {
        let newest = fs::read_dir(&store.dir).ok().and_then(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    n.strip_prefix("step-")
                        .is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                })
                .max()
        });
        if let Some(n) = newest {
            l.push_str(&format!("; newest checkpoint {n}"));
        }
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_task_ids_cover_their_tasks() {
        assert!(task_in("3", "3") && !task_in("3", "4"));
        assert!(task_in("2-5%1", "4") && !task_in("2-5%1", "6"));
        assert!(task_in("1,4-6", "5") && !task_in("1,4-6", "2"));
        assert!(task_in("0-9:2", "4") && !task_in("0-9:2", "5"));
        // the record of a one-task array cancelled while pending
        assert!(task_in("4294967294", "0"));
        assert!(!task_in("x", "1") && !task_in("3", "x"));
    }

    #[test]
    fn quoting_and_indices() {
        assert_eq!(sh_quote("/a/b-c_1.toml"), "/a/b-c_1.toml");
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote(""), "''");
    }

    #[test]
    fn states_in_kiln_words() {
        let st = |s: &str, restarts| JobState {
            state: s.into(),
            restarts,
            ..JobState::default()
        };
        assert_eq!(st("PENDING", 0).word(), "pending");
        assert_eq!(st("PENDING", 1).word(), "requeued");
        assert_eq!(st("RUNNING", 0).word(), "running");
        assert_eq!(st("COMPLETED", 0).word(), "done");
        assert_eq!(st("CANCELLED by 0", 0).word(), "failed");
        assert_eq!(st("TIMEOUT", 0).word(), "failed");
        assert!(st("REQUEUED", 1).live() && !st("COMPLETED", 0).live());
        let f = from_scontrol("JobId=5 JobName=x JobState=PENDING Reason=BeginTime Restarts=2 ExitCode=0:0 NodeList=(null)").unwrap();
        assert_eq!(
            (f.word(), f.reason.as_deref(), f.nodes),
            ("requeued", Some("BeginTime"), None)
        );
    }
}
