//! The `kiln` binary: kiln's command line with the built-in model families. It owns the process
//! exit code (0 ok, 1 the run failed, 2 bad input), which `kiln::cli::main_with` returns after
//! printing any error.

fn main() {
    std::process::exit(kiln::cli::main_with(kiln::model::Registry::builtin()));
}

/// Large tensors are allocated and freed every step; the system allocator returns them to the
/// OS each time (page faults dominated a profile), mimalloc keeps and reuses them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
