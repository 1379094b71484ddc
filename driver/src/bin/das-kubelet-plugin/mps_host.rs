//! `das-kubelet-plugin mps-host`: the MPS host (`das_driver::mps::host`), a hidden subcommand
//! with flags of its own, so the image needs no binary of its own for it. Runs until SIGTERM or
//! SIGINT; the daemons it started run on (in its container, the runtime ends them with it).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use das_runtime::logging::LogArgs;
use das_runtime::process;

/// The MPS host: starts and reaps the MPS control daemons on the plugin's request
/// (docs/design.md §7, "MPS on a slice", "Who runs the daemons").
#[derive(Debug, Parser)]
#[command(name = "mps-host", bin_name = "das-kubelet-plugin mps-host")]
pub(crate) struct HostArgs {
    /// The plugin's state directory (the same path as the plugin's --state-dir): the host
    /// listens on `<state dir>/mps/host.sock` and starts only daemons whose files are under
    /// `<state dir>/mps/`.
    #[arg(long, env = "DAS_STATE_DIR")]
    pub(crate) state_dir: PathBuf,
    #[command(flatten)]
    pub(crate) log: LogArgs,
}

/// Runs the host with `argv` (the arguments after the subcommand).
pub(crate) fn main(argv: &[String]) -> ExitCode {
    let args = match HostArgs::try_parse_from(
        std::iter::once(format!(
            "das-kubelet-plugin {}",
            das_driver::mps::host::SUBCOMMAND
        ))
        .chain(argv.iter().cloned()),
    ) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    if let Err(code) = process::start("das-mps-host", &args.log) {
        return code;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = runtime.block_on(async {
        let mut shutdown = process::Shutdown::listen()?;
        das_driver::mps::host::server::Host::new(&args.state_dir)
            .serve(async move { shutdown.wait().await })
            .await?;
        Ok(ExitCode::SUCCESS)
    });
    process::exit_status(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_needs_the_state_dir() {
        let e = HostArgs::try_parse_from(["mps-host"]).unwrap_err();
        assert!(e.to_string().contains("--state-dir"), "{e}");
        let a = HostArgs::try_parse_from(["mps-host", "--state-dir", "/var/lib/das"]).unwrap();
        assert_eq!(a.state_dir, PathBuf::from("/var/lib/das"));
    }
}
