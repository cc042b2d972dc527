//! `[backend.nccl]` in the process environment: exported before NCCL loads (NCCL reads its
//! variables when the first communicator or id is made), the same on every node of a job.
//! Node 0's values (its `[backend.nccl]` and the `NCCL_*` variables of its environment) travel
//! through the rendezvous store; a node whose own environment says otherwise is told, and uses
//! the job's value.

use std::time::Duration;

use crate::config::{Config, NcclConfig, KNOWN_NCCL_VARS};
use crate::error::{Error, Result};
use crate::ui;

use crate::rendezvous::Job;

/// The store key node 0 publishes the job's NCCL variables under.
const KEY: &str = "nccl_env";

/// What this node's process will hold: (variable, value, where it comes from).
pub type Vars = Vec<(String, String, String)>;

/// The NCCL variables of a run of `c` on this node: its `[backend.nccl]`, then the `NCCL_*`
/// variables of this environment that the section does not set.
pub fn local_vars(c: &Config) -> Vars {
    let section = &c.backend.nccl;
    let mut vars = section.vars();
    let whole = section.with_environment(std::env::vars());
    for (var, value, _) in whole.vars() {
        if !section.sets(&var) {
            vars.push((var.clone(), value, format!("environment {var}")));
        }
    }
    vars
}

/// Exports the job's NCCL variables into this process (CUDA runs only; a CPU run never loads
/// NCCL). With `job`, node 0 publishes its variables and every other node takes them.
pub fn export(c: &Config, job: Option<&mut Job>, timeout: Duration) -> Result<NcclEnv> {
    if !c.backend.device.has_nccl() {
        return Ok(NcclEnv(()));
    }
    let (vars, node) = job_vars(c, job, timeout)?;
    if let Ok(v) = std::env::var("NCCL_COMM_BLOCKING") {
        ui::note(&format!("warning: NCCL_COMM_BLOCKING={v} in this environment is ignored: kiln creates communicators without blocking, so that strategy.timeout_secs can stop an init that hangs"));
        std::env::remove_var("NCCL_COMM_BLOCKING");
    }
    for line in disagreements(node, &vars, std::env::vars()) {
        ui::note(&line);
    }
    for (var, value, _) in &vars {
        // before any thread of this process calls into NCCL (which reads these at init)
        std::env::set_var(var, value);
    }
    Ok(NcclEnv(()))
}

/// Proof that the job's NCCL variables are in this process's environment: only [`export`]
/// makes one, and nothing that loads NCCL (a unique id, a communicator) runs without it.
pub struct NcclEnv(());

impl NcclEnv {
    /// Node 0 creates the job's NCCL unique id and publishes it; the other nodes read it.
    #[cfg(feature = "cuda")]
    pub fn share_id(&self, j: &mut Job, c: &Config) -> Result<crate::collective::nccl::Id> {
        share_nccl_id(j, c)
    }
}

/// The job's NCCL variables and this node's number: this node's own without `job`; node 0's,
/// published by node 0 and read by the others, with one.
fn job_vars(c: &Config, job: Option<&mut Job>, timeout: Duration) -> Result<(Vars, usize)> {
    let mine = local_vars(c);
    let (vars, node) = match job {
        None => (mine.clone(), 0),
        Some(j) if j.node == 0 => {
            let text = serde_json::to_string(&mine)
                .map_err(|e| Error::Usage(format!("encoding the NCCL settings: {e}")))?;
            j.client.set(KEY, &text)?;
            (mine.clone(), 0)
        }
        Some(j) => {
            let text = match j.client.wait(&[KEY.to_string()], timeout)? {
                Ok(v) => v.into_iter().next().unwrap_or_default(),
                Err(_) => {
                    return Err(Error::Usage(format!(
                        "node {}: node 0 never published the job's NCCL settings within {}s (launch.rendezvous_timeout_secs)",
                        j.node,
                        timeout.as_secs()
                    )))
                }
            };
            let vars: Vars = serde_json::from_str(&text).map_err(|e| {
                Error::Usage(format!(
                    "node {}: node 0's NCCL settings do not parse ({e}); are both nodes the same kiln version?",
                    j.node
                ))
            })?;
            (vars, j.node)
        }
    };
    Ok((vars, node))
}

/// What a node is told about its own environment: variables the job sets to another value,
/// and (on nodes other than 0) NCCL variables only this node has.
pub fn disagreements(
    node: usize,
    job: &Vars,
    env: impl IntoIterator<Item = (String, String)>,
) -> Vec<String> {
    let env: Vec<(String, String)> = env.into_iter().collect();
    let mut out = Vec::new();
    for (var, value, from) in job {
        if let Some((_, here)) = env.iter().find(|(k, v)| k == var && v != value) {
            let whose = if node == 0 {
                format!("`{from}`")
            } else {
                format!("the job's value (node 0's `{from}`)")
            };
            out.push(format!(
                "warning: node {node}: {var}={here} in this environment is replaced by {whose}: {var}={value}"
            ));
        }
    }
    if node > 0 {
        let known = NcclConfig::default().with_environment(env.iter().cloned());
        for (var, value, _) in known.vars() {
            if !job.iter().any(|(v, _, _)| *v == var) {
                out.push(format!(
                    "warning: node {node}: {var}={value} is set in this node's environment only (node 0 does not set it); it applies here alone\n  = help: put it in [backend.nccl] to make it the whole job's"
                ));
            }
        }
    }
    out
}

/// The NCCL variables of this environment and of `c` (when given), for `kiln env`: (variable,
/// value, source), the experiment's first.
pub fn report(c: Option<&Config>) -> Vars {
    match c {
        Some(c) => local_vars(c),
        None => local_vars(&Config::default()),
    }
}

/// `NCCL_*` variables of this environment that NCCL does not read, each with the closest one
/// it does.
pub fn unknown_in_environment() -> Vec<(String, Option<&'static str>)> {
    let mut out: Vec<(String, Option<&'static str>)> = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("NCCL_") && !KNOWN_NCCL_VARS.contains(&k.as_str()))
        .map(|k| {
            let near = crate::config::closest(&k, KNOWN_NCCL_VARS);
            (k, near)
        })
        .collect();
    out.sort();
    out
}

/// Node 0 creates the job's NCCL unique id and publishes it; the other nodes read it.
#[cfg(feature = "cuda")]
fn share_nccl_id(j: &mut Job, c: &Config) -> Result<crate::collective::nccl::Id> {
    use crate::collective::nccl;
    if j.node == 0 {
        let id = nccl::new_id().map_err(|e| Error::Train(e.into()))?;
        let hex: String = id
            .internal()
            .iter()
            .map(|b| format!("{:02x}", *b as u8))
            .collect();
        j.client.set("nccl_id", &hex)?;
        return Ok(id);
    }
    let t = std::time::Duration::from_secs(c.launch.rendezvous_timeout_secs);
    let hex = match j.client.wait(&["nccl_id".to_string()], t)? {
        Ok(v) => v.into_iter().next().unwrap_or_default(),
        Err(_) => return Err(Error::Usage("node 0 never published the NCCL id".into())),
    };
    let mut raw = [0 as std::ffi::c_char; 128];
    for (i, b) in raw.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2).unwrap_or("00"), 16).unwrap_or(0)
            as std::ffi::c_char;
    }
    Ok(nccl::Id::uninit(raw))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Device;

    fn v(items: &[(&str, &str, &str)]) -> Vars {
        items
            .iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
            .collect()
    }

    fn env(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn every_node_takes_node_0s_settings_through_the_store() {
        use crate::rendezvous::join;
        let port = crate::testdir::free_port();
        let cfg = |node, algo: &str| {
            let mut c = Config::default();
            c.backend.device = Device::Cuda;
            c.backend.nccl.algo = Some(algo.into());
            c.launch.nnodes = 2;
            c.launch.node_rank = node;
            c.launch.master_addr = "127.0.0.1".into();
            c.launch.master_port = port;
            c.launch.heartbeat_secs = 0;
            c.launch.rendezvous_timeout_secs = 30;
            c
        };
        let (c0, c1) = (cfg(0, "Ring"), cfg(1, "Tree"));
        let t = Duration::from_secs(30);
        let other = std::thread::spawn(move || {
            let mut j = join(&c1, 1, "tok", 0).unwrap();
            let got = job_vars(&c1, Some(&mut j), t).map_err(|e| e.to_string());
            j.finish(t);
            got
        });
        let mut j0 = join(&c0, 1, "tok", 0).unwrap();
        let (vars0, node0) = job_vars(&c0, Some(&mut j0), t).unwrap();
        let (vars1, node1) = other.join().unwrap().unwrap();
        j0.finish(t);
        assert_eq!((node0, node1), (0, 1));
        let algo = |v: &Vars| {
            v.iter()
                .find(|(k, _, _)| k == "NCCL_ALGO")
                .map(|(_, x, from)| (x.clone(), from.clone()))
        };
        assert_eq!(
            algo(&vars0),
            Some(("Ring".into(), "backend.nccl.algo".into()))
        );
        assert_eq!(algo(&vars1), algo(&vars0));
    }

    #[test]
    fn a_node_is_told_where_its_environment_disagrees_with_the_job() {
        let job = v(&[
            ("NCCL_ALGO", "Ring", "backend.nccl.algo"),
            ("NCCL_IB_HCA", "mlx5", "environment NCCL_IB_HCA"),
        ]);
        let here = env(&[
            ("NCCL_ALGO", "Tree"),
            ("NCCL_IB_HCA", "mlx5"),
            ("NCCL_SOCKET_IFNAME", "eth1"),
            ("NCCL_MADE_UP", "1"),
        ]);
        assert_eq!(
            disagreements(1, &job, here.clone()),
            [
                "warning: node 1: NCCL_ALGO=Tree in this environment is replaced by the job's value (node 0's `backend.nccl.algo`): NCCL_ALGO=Ring",
                "warning: node 1: NCCL_SOCKET_IFNAME=eth1 is set in this node's environment only (node 0 does not set it); it applies here alone\n  = help: put it in [backend.nccl] to make it the whole job's",
            ]
        );
        assert_eq!(
            disagreements(0, &job, here),
            ["warning: node 0: NCCL_ALGO=Tree in this environment is replaced by `backend.nccl.algo`: NCCL_ALGO=Ring"]
        );
    }
}
