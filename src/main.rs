//! The `kiln` binary: kiln's command line with the built-in model families. It owns the process
//! exit code (0 ok, 1 the run failed, 2 bad input), which `kiln::cli::main_with` returns after
//! printing any error.

fn main() {
    std::process::exit(kiln::cli::main_with(kiln::model::Registry::builtin()));
}

/// Large tensors are allocated and freed every step; the system allocator returns them to the
/// OS each time (page faults dominated a profile), mimalloc keeps and reuses them. The counting
/// wrapper attributes every byte to the rank that allocated it (`summary.json`'s
/// `memory[r].peak_bytes`).
#[global_allocator]
static GLOBAL: kiln::memory::Counting<mimalloc::MiMalloc> =
    kiln::memory::Counting(mimalloc::MiMalloc);
