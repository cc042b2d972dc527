//! The `kiln` binary: parses the command line, runs the command, prints errors and owns the
//! exit codes (0 ok, 1 the run failed, 2 bad input).

use clap::Parser;

fn main() {
    let cli = kiln::cli::Cli::parse();
    let code = match kiln::cli::dispatch(cli) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    };
    std::process::exit(code);
}

/// Large tensors are allocated and freed every step; the system allocator returns them to the
/// OS each time (page faults dominated a profile), mimalloc keeps and reuses them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
