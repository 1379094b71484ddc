//! `kubectl-das`: the kubectl plugin of DAS (`kubectl das gpus|free|claims`); see the library's
//! docs for what each command shows.

// Product functions stay under 80 code lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

use std::process::ExitCode;

use clap::Parser;
use kubectl_das::{Cli, fetch, run, table};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = async {
        let client = fetch::client(cli.kubeconfig.as_deref(), cli.context.as_deref()).await?;
        run(&cli, &client).await
    }
    .await;
    match result {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            // Errors quote the API server too (node and profile names, its own messages).
            eprintln!("error: {}", table::escape(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}
