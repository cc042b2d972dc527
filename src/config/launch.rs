//! `[launch]`: several node processes in one job, and their rendezvous.

use serde::{Deserialize, Serialize};

use super::error::ConfigError;
use super::load::Resolved;
use super::validate::*;
#[allow(unused_imports)]
use super::*;

/// `[launch]`: several node processes (machines, or processes on one machine) in one job. Also set
/// by `--nnodes/--node-rank/--master-addr/--master-port`, torchrun's `WORLD_SIZE`, `RANK`,
/// `MASTER_ADDR`, `MASTER_PORT` and Slurm's variables (inside `srun`: one kiln node per task,
/// `SLURM_NTASKS` and `SLURM_PROCID`; outside: `SLURM_NNODES` and `SLURM_NODEID`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LaunchConfig {
    /// Node processes in the job. Default: `1`.
    pub nnodes: usize,
    /// This process's node, 0..nnodes. Node 0 serves the rendezvous store. Default: `0`.
    pub node_rank: usize,
    /// Address of node 0's rendezvous store (it binds only this address). Default: `"127.0.0.1"`.
    pub master_addr: String,
    /// Port of the rendezvous store. Default: `29500`. Under torchrun, `MASTER_PORT` + 1
    /// (torchrun's agent serves its own store on `MASTER_PORT`).
    pub master_port: u16,
    /// The GPU of a process that a launcher starts one per GPU (torchrun's `LOCAL_RANK`): the
    /// process is one node of one device, GPU `local_rank` (of those `CUDA_VISIBLE_DEVICES`
    /// shows). Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_rank: Option<usize>,
    /// File holding the job token (else `KILN_JOB_TOKEN`; node 0 generates one when neither is
    /// set). Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// Seconds the rendezvous waits for every node. Default: `300`.
    pub rendezvous_timeout_secs: u64,
    /// Restarts of the whole job (from the newest verified checkpoint) after a node's worker
    /// dies, like torchrun `--max-restarts`. Default: `0`.
    pub max_restarts: usize,
    /// A node silent for this many seconds stops the job; 0 turns heartbeats off. Default: `10`.
    pub heartbeat_secs: u64,
}

impl Default for LaunchConfig {
    fn default() -> Self {
        LaunchConfig {
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            local_rank: None,
            token_file: None,
            rendezvous_timeout_secs: 300,
            max_restarts: 0,
            heartbeat_secs: 10,
        }
    }
}

/// The most nodes a job may have: the rendezvous store's replies (every node's ring address)
/// stay well inside its 1 MiB frames (issue 45, defect 25: from about 60,000 nodes node 0's
/// own request broke them).
pub const MAX_NODES: usize = 16_384;

impl LaunchConfig {
    /// At least one node, and this node's rank among them.
    pub(super) fn check(&self, r: &Resolved) -> Result<(), ConfigError> {
        let l = self;
        at_least(r, "launch.nnodes", l.nnodes, 1)?;
        if l.nnodes > MAX_NODES {
            return Err(r.range_error(
                "launch.nnodes",
                format!(
                    "`launch.nnodes` = {} is out of range: at most {MAX_NODES} (what one rendezvous store serves: its replies list every node's address)",
                    l.nnodes
                ),
                Some("is WORLD_SIZE (torchrun) or the task count (srun) meant to be the number of nodes, one kiln process each?".into()),
            ));
        }
        if l.node_rank >= l.nnodes {
            return Err(r.key_error(
                "launch.node_rank",
                format!(
                    "`launch.node_rank` = {} but `launch.nnodes` = {}: node ranks are 0..{}",
                    l.node_rank, l.nnodes, l.nnodes
                ),
                None,
            ));
        }
        // node 0's address, before a run waits on it (issue 45, defect 23: an empty or
        // malformed one failed only at the rendezvous, with the wrong help)
        // (untrimmed: the rendezvous connects to it as it is)
        let addr = l.master_addr.as_str();
        let host_char = |c: char| c.is_ascii_alphanumeric() || ".-_:[]%".contains(c);
        // whatever the node count (issue 58, defect 28: 80,000 characters passed `kiln check`
        // on one node); a host name has at most 253 bytes (RFC 1035), an IPv6 address fewer
        let bad = if addr.is_empty() {
            l.nnodes > 1
        } else {
            addr.len() > 253 || !addr.chars().all(host_char)
        };
        if bad {
            let why = if addr.len() > 253 {
                format!(" (it is {} bytes; a host name has at most 253)", addr.len())
            } else {
                String::new()
            };
            return Err(r.key_error(
                "launch.master_addr",
                format!(
                    "`launch.master_addr` = \"{}\" is not a host name or IP address{why}",
                    super::brief(&l.master_addr, 200).escape_debug()
                ),
                Some("set it (or MASTER_ADDR) to node 0's host name or IP address, the same on every node".into()),
            ));
        }
        Ok(())
    }
}
