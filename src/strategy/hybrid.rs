//! HSDP (`strategy.shard_size`): the shard and replica groups of one rank, split from the job's
//! collective before fsdp is built over them.

use crate::collective::{Collective, CollectiveError};
use crate::config::{Config, Mesh};

/// HSDP's groups of one rank (`strategy.shard_size`): the ranks it shards the model state
/// with, and the ranks that hold its shard in the other groups.
pub struct Hybrid {
    pub shard: Box<dyn Collective>,
    pub replica: Box<dyn Collective>,
}

/// Forms HSDP's groups (every rank calls it, before `build`): shard groups of `size`
/// consecutive ranks (ranks 0..size the first), replica groups of the ranks with the same place
/// in their shard group (torch's 2-D device mesh, replicate x shard). `None` when the run is
/// not HSDP.
pub fn hybrid_groups(
    c: &Config,
    comm: &mut dyn Collective,
) -> Result<Option<Hybrid>, CollectiveError> {
    let Some(size) = Mesh::over(c, comm.world()).hybrid() else {
        return Ok(None);
    };
    let r = comm.rank();
    let shard = comm.split(r / size, r)?;
    let replica = comm.split(r % size, r)?;
    Ok(Some(Hybrid { shard, replica }))
}
