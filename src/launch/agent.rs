//! The restart agent of a multi-node node (`launch.max_restarts` > 0, like torchrun's agent):
//! it runs the node's worker as a child process and, when a worker dies, starts the next round
//! (every node's agent does the same, so the whole job restarts from its newest verified
//! checkpoint). A stop request goes on to the worker; a worker that refused its input or was
//! preempted is not restarted.

use std::fs::{self, OpenOptions};

use super::node::{node0_dir, Target};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::ui;

/// The agent: runs rounds of the worker until one succeeds or no restarts are left.
pub(super) fn node_agent(target: &Target, c: &Config, token: &str) -> Result<()> {
    let node = c.launch.node_rank;
    let max = c.launch.max_restarts;
    let run_dir = if node == 0 {
        let (dir, _, _) = node0_dir(target, c, 0)?;
        fs::create_dir_all(dir.join("logs"))
            .map_err(|e| Error::io(format!("creating run directory {}", dir.display()), e))?;
        Some(dir.canonicalize().unwrap_or(dir))
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
        if let Some(d) = &run_dir {
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
        if let Some(d) = &run_dir {
            use std::io::Write as _;
            if let Ok(mut f) = super::run_dir::open_no_follow(
                OpenOptions::new().create(true).append(true),
                &d.join("logs/restarts.log"),
            ) {
                let _ = writeln!(f, "{line}");
            }
        }
    }
    Ok(())
}
