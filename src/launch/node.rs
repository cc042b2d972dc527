//! A node of a multi-node job (`launch.nnodes` > 1): it prepares, joins the rendezvous, agrees
//! with node 0 on the run directory and the checkpoint to continue from, and trains. With
//! `launch.max_restarts` > 0 the process is the node's agent (`node_agent`, below), and this
//! worker runs as its child.

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};

use super::execute::{execute, take_run_dir, Entry};
use super::prepare::Prepared;
use super::resume::{prepare_resume, Resumption};
use crate::config::{Config, Resolved};
use crate::error::{Error, Result};
use crate::rundir::{claim_run_dir, lock_run_dir, newest_unfinished, RunLock};
use crate::ui;

/// Where a multi-node job runs (node 0 decides; the other nodes follow what it publishes).
pub(super) enum Target {
    /// A new run: in this directory (which must not hold a run), or the next free one.
    New(Option<PathBuf>),
    /// `--resume`: the newest unfinished run of the experiment, else a new one.
    Newest,
    /// `kiln resume DIR [--from step-N]`.
    Dir(PathBuf, Option<String>),
}

/// Node 0's run directory: held by this process (its guard), except by a worker under its
/// agent, which holds it for every round.
pub(super) struct Chosen {
    pub dir: PathBuf,
    pub lock: Option<RunLock>,
    /// Whether the run continues there, and from which checkpoint (`None`: the newest verified
    /// one).
    pub resume: bool,
    pub from: Option<String>,
}

/// Node 0's run directory, whether it continues a run there, and from which checkpoint.
/// Within a job with restarts the agent has fixed the directory (`KILN_WORKER_RUN_DIR`) and
/// later rounds always continue.
pub(super) fn node0_dir(target: &Target, c: &Config, round: usize) -> Result<Chosen> {
    // a worker under its agent: the agent chose (and holds) the directory
    if let Some(d) = std::env::var_os("KILN_WORKER_RUN_DIR") {
        let d = PathBuf::from(d);
        let started = d.join("config.toml").is_file();
        let (resume, from) = match target {
            _ if round > 0 => (true, None),
            Target::Dir(_, from) => (true, from.clone()),
            Target::Newest => (started, None),
            Target::New(_) => (false, None),
        };
        return Ok(Chosen {
            dir: d,
            lock: None,
            resume,
            from,
        });
    }
    let out = Path::new(&c.experiment.output_dir);
    let held = |lock: RunLock, resume: bool, from: Option<String>| Chosen {
        dir: lock.dir().to_path_buf(),
        lock: Some(lock),
        resume,
        from,
    };
    Ok(match target {
        Target::New(Some(d)) => held(take_run_dir(d)?.0, false, None),
        Target::New(None) => held(claim_run_dir(out, &c.experiment.name)?.0, false, None),
        Target::Newest => match newest_unfinished(out, &c.experiment.name) {
            Some(d) => held(lock_run_dir(&d)?, true, None),
            None => held(claim_run_dir(out, &c.experiment.name)?.0, false, None),
        },
        Target::Dir(d, from) => held(lock_run_dir(d)?, true, from.clone()),
    })
}

/// One node of a multi-node job. With `launch.max_restarts` > 0 this process is the node's
/// agent: it runs the node's worker as a child and restarts the whole job (every node's agent
/// does the same) from the newest verified checkpoint when a worker dies.
pub(super) fn run_node(r: &Resolved, target: &Target, quiet: bool) -> Result<()> {
    let c = &r.config;
    // bad input stops this node before it claims a directory or joins the job
    // (`init_from` too: a resumed job whose node 0 finds no checkpoint starts from it)
    let prepared = Prepared::new(r, false)?;
    let (token, generated) =
        crate::rendezvous::token(c, std::env::var("KILN_JOB_TOKEN").ok()).map_err(Error::Usage)?;
    if generated {
        ui::note(&format!(
            "job token: {token}\n  = give it to the other nodes: KILN_JOB_TOKEN={token}"
        ));
    }
    match std::env::var("KILN_WORKER_ROUND")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        Some(round) => node_worker(target, quiet, r, &token, round, prepared),
        None if c.launch.max_restarts > 0 => {
            // the agent trains nothing: its worker prepares again in its own process
            drop(prepared);
            node_agent(target, c, &token)
        }
        None => node_worker(target, quiet, r, &token, 0, prepared),
    }
}

/// The worker of restart round `round`: rendezvous, agree on the run directory (node 0 picks
/// it) and, after a restart, on the checkpoint to continue from; train.
fn node_worker(
    target: &Target,
    quiet: bool,
    r: &Resolved,
    token: &str,
    round: usize,
    prepared: Prepared,
) -> Result<()> {
    let c = &r.config;
    // node 0 checks its directory before it serves the store: bad input stops it early
    let chosen = if c.launch.node_rank == 0 {
        Some(node0_dir(target, c, round)?)
    } else {
        None
    };
    let mut job = crate::rendezvous::join(c, c.strategy.devices.count(), token, round)?;
    let t = std::time::Duration::from_secs(c.launch.rendezvous_timeout_secs);
    // node 0 holds its directory until the session ends
    let mut held = None;
    let (run_dir, resume) = if let Some(Chosen {
        dir,
        lock,
        resume: resuming,
        from,
    }) = chosen
    {
        held = lock;
        fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating run directory {}", dir.display()), e))?;
        let abs = dir.canonicalize().unwrap_or(dir);
        let resume = if resuming {
            Some(prepare_resume(&abs, r, from.as_deref(), quiet)?)
        } else {
            None
        };
        let from = resume
            .as_ref()
            .and_then(|res| res.from.as_ref())
            .map(|(p, _)| p.display().to_string())
            .unwrap_or_default();
        job.client.set("resume_from", &from)?;
        job.client.set("run_dir", &abs.display().to_string())?;
        (abs, resume)
    } else {
        let keys = ["run_dir".to_string(), "resume_from".to_string()];
        let v = match job.client.wait(&keys, t)? {
            Ok(v) => v,
            Err(_) => {
                return Err(Error::Usage(
                    "node 0 never published the run directory".into(),
                ))
            }
        };
        let resume = match v.get(1).filter(|p| !p.is_empty()) {
            Some(p) => Some(Resumption {
                from: Some((
                    PathBuf::from(p),
                    crate::checkpoint::read_state(Path::new(p)).map_err(Error::Checkpoint)?,
                )),
            }),
            None if round > 0 => Some(Resumption { from: None }),
            None => None,
        };
        (PathBuf::from(&v[0]), resume)
    };
    let entry = Entry {
        run_dir: &run_dir,
        resume,
        job: Some(job),
        prepared: Some(prepared),
    };
    let result = execute(r, entry, quiet);
    drop(held);
    result
}

// The restart agent of a multi-node node (`launch.max_restarts` > 0, like torchrun's agent):
// it runs the node's worker as a child process and, when a worker dies, starts the next round
// (every node's agent does the same, so the whole job restarts from its newest verified
// checkpoint). A stop request goes on to the worker; a worker that refused its input or was
// preempted is not restarted.

/// The agent: runs rounds of the worker until one succeeds or no restarts are left.
pub(super) fn node_agent(target: &Target, c: &Config, token: &str) -> Result<()> {
    let node = c.launch.node_rank;
    let max = c.launch.max_restarts;
    let run_dir = if node == 0 {
        let Chosen { dir, lock, .. } = node0_dir(target, c, 0)?;
        fs::create_dir_all(dir.join("logs"))
            .map_err(|e| Error::io(format!("creating run directory {}", dir.display()), e))?;
        // (held for every round: the workers run in it under this agent)
        Some((dir.canonicalize().unwrap_or(dir), lock))
    } else {
        None
    };
    let exe = std::env::current_exe().map_err(|e| Error::io("finding the kiln executable", e))?;
    for round in 0..=max {
        // asked to stop: no new round (its worker could die of the signal before it handles it)
        if crate::train::preempt::requested().is_some() {
            return Err(Error::Preempted(format!(
                "node {node}: asked to stop; not starting the worker again"
            )));
        }
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(std::env::args_os().skip(1))
            .env("KILN_WORKER_ROUND", round.to_string())
            .env("KILN_JOB_TOKEN", token);
        if let Some((d, _)) = &run_dir {
            cmd.env("KILN_WORKER_RUN_DIR", d);
        }
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl is async-signal-safe; the worker dies with its agent.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| Error::io("starting the node's worker", e))?;
        // a stop request to the agent goes on to its worker as SIGTERM (a second SIGINT to
        // the worker would stop it at once; SIGTERM never does)
        let mut forwarded = false;
        let status = loop {
            if let Some(s) = child
                .try_wait()
                .map_err(|e| Error::io("waiting for the node's worker", e))?
            {
                break s;
            }
            if !forwarded && crate::train::preempt::requested().is_some() {
                forwarded = true;
                // SAFETY: kill(2) on our own child's pid.
                unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        if status.success() {
            return Ok(());
        }
        if status.code() == Some(crate::train::preempt::EXIT_PREEMPTED)
            || (crate::train::preempt::requested().is_some() && status.code().is_none())
        {
            return Err(Error::Preempted(format!(
                "node {node}: the worker stopped with a checkpoint (preempted); not restarting"
            )));
        }
        if crate::train::preempt::requested().is_some() {
            return Err(Error::Invalid(format!(
                "node {node}: the worker exited with status {} while stopping; not restarting",
                status.code().unwrap_or(-1)
            )));
        }
        if status.code() == Some(2) {
            return Err(Error::Usage(format!(
                "node {node}: the worker rejected its input (see above); not restarting"
            )));
        }
        let cause = match status.code() {
            Some(code) => format!("exited with status {code}"),
            None => {
                use std::os::unix::process::ExitStatusExt;
                format!("was killed by signal {}", status.signal().unwrap_or(0))
            }
        };
        if round == max {
            return Err(Error::Invalid(format!(
                "node {node}: the worker {cause}, and no restarts are left (launch.max_restarts = {max})"
            )));
        }
        let line = format!(
            "node {node}: the worker {cause}; restarting the job from the newest verified checkpoint (restart {} of {max})",
            round + 1
        );
        ui::note(&line);
        if let Some((d, _)) = &run_dir {
            use std::io::Write as _;
            if let Ok(mut f) = crate::rundir::open_no_follow(
                OpenOptions::new().create(true).append(true),
                &d.join("logs/restarts.log"),
            ) {
                let _ = writeln!(f, "{line}");
            }
        }
    }
    Ok(())
}
