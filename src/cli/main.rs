//! The whole command line as a function, for the `kiln` binary and for a user's own binary
//! that registers model families of its own: `std::process::exit(kiln::cli::main_with(registry))`.

use clap::Parser;

use super::{dispatch, Cli};
use crate::model::{self, Registry};

/// Runs kiln's command line with the model families of `registry`: parses the arguments, runs
/// the command, prints an error (if any) and returns the exit code (0 ok, 1 the run failed,
/// 2 bad input, 75 stopped by a signal with a checkpoint, 130 a second Ctrl-C). Sweep trials re-run the same executable, so they see the same families.
pub fn main_with(registry: Registry) -> i32 {
    main_with_args(registry, std::env::args_os())
}

/// `main_with`, on the given arguments (the first is the program name) instead of the
/// process's: for a program that embeds kiln's command line behind its own.
pub fn main_with_args<I, T>(registry: Registry, args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    model::install(registry);
    // this is the process's main: it may set what libraries read from the environment
    crate::backend::own_process_env();
    let cli = Cli::parse_from(args);
    let reads_only = cli.command.reads_only();
    quiet_on_closed_stdout(reads_only);
    // NCCL and the CUDA toolkit loadable (a re-exec with them on the library path), before any
    // thread, socket or token exists
    #[cfg(feature = "cuda")]
    if let Some(warning) = crate::cuda::prepare_environment() {
        eprintln!("{warning}");
    }
    let result = dispatch(cli);
    // stdout that failed (a full disk, a closed pipe): the work is done and its files are
    // whole; a read-only command whose reader stopped reading succeeded, any other says so
    let stdout = crate::ui::stdout_error()
        .filter(|(kind, _)| !(reads_only && *kind == std::io::ErrorKind::BrokenPipe))
        .map(|(_, why)| why);
    match result {
        Ok(()) => match stdout {
            None => 0,
            Some(why) => {
                eprintln!("error: writing to stdout failed: {why}\n  = help: the command finished its work, but what it printed was lost; check where stdout goes (a full disk, a closed pipe)");
                1
            }
        },
        Err(e @ crate::Error::Preempted(_)) => {
            eprintln!(
                "kiln: {}",
                crate::ui::printable(&crate::config::redact(&e.to_string()))
            );
            e.exit_code()
        }
        Err(e) => {
            // (a name quoted from a file never drives the terminal)
            // (nor a password in a URL an error quotes)
            eprintln!(
                "error: {}",
                crate::ui::printable(&crate::config::redact(&e.to_string()))
            );
            if let Some(why) = stdout {
                eprintln!("error: writing to stdout failed as well: {why}");
            }
            e.exit_code()
        }
    }
}

/// A `println!` left anywhere (a dependency's) that fails panics; the panic then ends the
/// process as `ui::out` would: a read-only command whose reader closed the pipe (`| head`)
/// quietly with 0, as ripgrep does, anything else with exit 1 naming stdout, never a panic
/// message. (SIGPIPE stays ignored so that sockets keep returning errors rather than killing
/// the process.)
fn quiet_on_closed_stdout(reads_only: bool) {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // (a panic caught and reported as an error by whoever caught it)
        if crate::panic::is_quiet() {
            return;
        }
        let msg = info.payload_as_str().unwrap_or("");
        if msg.starts_with("failed printing to stdout") {
            if reads_only && msg.contains("Broken pipe") {
                std::process::exit(0);
            }
            eprintln!("error: writing to stdout failed: {msg}");
            std::process::exit(1);
        }
        default_hook(info);
    }));
}
