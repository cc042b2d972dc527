//! The launchers' environment as config: torchrun's and Slurm's variables become `launch.*`
//! keys (layers 5 to 7 of `load`'s stack), each with the variable named as its source.

use figment::value::Value;
use figment::Metadata;

use super::load::{nest, parse_value, Stack, DEFAULT_SOURCE};
use super::slurm_syntax::first_host;

/// Whether torchrun's agent started this process (`torchrun --no-python ... kiln run`).
pub fn under_torchrun(var: &dyn Fn(&str) -> Option<String>) -> bool {
    var("WORLD_SIZE").is_some()
        && (var("TORCHELASTIC_RUN_ID").is_some() || var("LOCAL_RANK").is_some())
}

/// Whether this process is a task of an `srun` step of several tasks that nobody gave a
/// rendezvous address (`MASTER_ADDR`): a bare `srun kiln run`, whose node 0 and port kiln
/// derives from the step (and whose job token `rendezvous` derives).
pub fn bare_srun(var: &dyn Fn(&str) -> Option<String>) -> bool {
    let tasks = var("SLURM_STEP_NUM_TASKS")
        .or_else(|| var("SLURM_NTASKS"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(1);
    var("WORLD_SIZE").is_none()
        && var("MASTER_ADDR").is_none()
        && var("SLURM_STEP_ID").is_some()
        && var("SLURM_PROCID").is_some()
        && tasks > 1
}

impl Stack<'_> {
    /// torchrun (one process per rank: each is one kiln node) and Slurm: inside an `srun` step
    /// each task is one kiln node (one task per node, or several on one host); outside a step
    /// (a batch script, `salloc`) the allocation's nodes.
    pub(super) fn launcher(&mut self, var: &dyn Fn(&str) -> Option<String>) {
        let step_tasks = if var("SLURM_STEP_NUM_TASKS").is_some() {
            "SLURM_STEP_NUM_TASKS"
        } else {
            "SLURM_NTASKS"
        };
        // torchrun's agent holds MASTER_PORT, so kiln's store takes the port after
        let torchrun = under_torchrun(var);
        let launchers: &[(&str, &str)] = if var("WORLD_SIZE").is_some() {
            &[
                ("WORLD_SIZE", "nnodes"),
                ("RANK", "node_rank"),
                ("MASTER_ADDR", "master_addr"),
                ("MASTER_PORT", "master_port"),
                ("LOCAL_RANK", "local_rank"),
            ]
        } else if var("SLURM_STEP_ID").is_some() && var("SLURM_PROCID").is_some() {
            &[
                (step_tasks, "nnodes"),
                ("SLURM_PROCID", "node_rank"),
                ("MASTER_ADDR", "master_addr"),
                ("MASTER_PORT", "master_port"),
            ]
        } else {
            &[
                ("SLURM_NNODES", "nnodes"),
                ("SLURM_NODEID", "node_rank"),
                ("MASTER_ADDR", "master_addr"),
                ("MASTER_PORT", "master_port"),
            ]
        };
        for (name, key) in launchers {
            let Some(value) = var(name) else { continue };
            let parts = vec!["launch".to_string(), key.to_string()];
            let (v, source) = match *key {
                "master_addr" => (Value::from(value.clone()), format!("environment variable {name}")),
                // (65535 + 1 is past the last port: said as the out-of-range value it is,
                // never the agent's own port)
                "master_port" if torchrun => match value.trim().parse::<u16>() {
                    Ok(p) => (
                        Value::from(u32::from(p) + 1),
                        format!("environment variable {name} + 1 (torchrun's agent serves its own store on {name})"),
                    ),
                    _ => (parse_value(&value), format!("environment variable {name}")),
                },
                _ => (parse_value(&value), format!("environment variable {name}")),
            };
            self.push(Metadata::named(source), nest(&parts, v));
        }
    }

    /// Inside an `srun` step without MASTER_ADDR / MASTER_PORT (what Lightning does): node 0 is
    /// the first host of the step's node list, the port is derived from the job and step ids.
    pub(super) fn bare_srun(&mut self, var: &dyn Fn(&str) -> Option<String>) {
        let nodelist = var("SLURM_STEP_NODELIST").or_else(|| var("SLURM_JOB_NODELIST"));
        let derived = [
            (
                "master_addr",
                var("MASTER_ADDR")
                    .is_none()
                    .then(|| nodelist.as_deref().and_then(first_host))
                    .flatten()
                    .map(Value::from),
                "the first host of SLURM_STEP_NODELIST",
            ),
            (
                "master_port",
                var("MASTER_PORT")
                    .is_none()
                    .then(|| {
                        let id = |k: &str| var(k).and_then(|v| v.trim().parse::<u64>().ok());
                        Some(
                            20000
                                + (id("SLURM_JOB_ID")? + id("SLURM_STEP_ID").unwrap_or(0)) % 20000,
                        )
                    })
                    .flatten()
                    .map(Value::from),
                "20000 + (SLURM_JOB_ID + SLURM_STEP_ID) % 20000",
            ),
        ];
        for (key, value, source) in derived {
            // a value the file, the environment (`KILN_LAUNCH__...`) or an earlier layer set
            // wins: only what nobody set is derived
            let unset = self
                .figment
                .find_metadata(&format!("launch.{key}"))
                .is_none_or(|m| m.name == DEFAULT_SOURCE);
            if let Some(v) = value.filter(|_| unset) {
                self.push(
                    Metadata::named(source),
                    nest(&["launch".to_string(), key.to_string()], v),
                );
            }
        }
    }

    /// Each process torchrun starts is one kiln node of one device (its LOCAL_RANK's GPU);
    /// with one process per host (`--nproc-per-node 1`) the process keeps the file's devices,
    /// kiln's own one-process-per-node layout.
    pub(super) fn torchrun_devices(&mut self, var: &dyn Fn(&str) -> Option<String>) {
        let several_local = var("LOCAL_WORLD_SIZE")
            .and_then(|v| v.trim().parse::<usize>().ok())
            .is_none_or(|n| n > 1);
        if under_torchrun(var) && several_local {
            self.push(
                Metadata::named("torchrun (one device per process)"),
                nest(
                    &["strategy".to_string(), "devices".to_string()],
                    Value::from(1u64),
                ),
            );
        }
    }
}
