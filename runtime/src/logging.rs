//! Logging of every DAS binary: `tracing` to stderr, text or JSON, a filter in `EnvFilter`
//! syntax. ANSI colours only when stderr is a terminal, so log files and `kubectl logs` carry
//! plain text that greps match.

use std::io::IsTerminal;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};

/// The log flags every binary takes.
#[derive(Args, Debug, Clone)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, env = "DAS_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Log filter (tracing `EnvFilter` syntax), e.g. `info` or `info,das_driver=debug`.
    #[arg(long, env = "DAS_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event: `<time> <LEVEL> <target>: <message> <key>=<value>…`.
    Text,
    /// One JSON object per event (`timestamp`, `level`, `fields`, `target`).
    Json,
}

/// The filter of `level`, or an error that says what is wrong and what is valid.
///
/// # Errors
/// `level` is not a valid `EnvFilter` directive list.
pub fn filter(level: &str) -> Result<tracing_subscriber::EnvFilter> {
    // EnvFilter takes a bare word as a target at every level (`verbose` would log only a
    // target named "verbose"): require a level in every directive.
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    for directive in level.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let without_spans: String = directive
            .split('[')
            .enumerate()
            .map(|(i, part)| {
                if i == 0 {
                    part
                } else {
                    part.split(']').nth(1).unwrap_or("")
                }
            })
            .collect();
        let lvl = without_spans.rsplit('=').next().unwrap_or("");
        if !LEVELS.contains(&lvl.to_ascii_lowercase().as_str()) {
            anyhow::bail!(
                "invalid log filter {level:?}: directive {directive:?} names no level; expected comma-separated directives such as `info`, `warn` or `info,das_driver=debug` (levels: error, warn, info, debug, trace, off)"
            );
        }
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(level)
        .with_context(|| {
            format!(
                "invalid log filter {level:?}: expected comma-separated directives such as `info`, `warn` or `info,das_driver=debug` (levels: error, warn, info, debug, trace, off)"
            )
        })
}

/// Installs the global subscriber for `args`.
///
/// # Errors
/// An invalid filter (see [`filter`]), or a subscriber already installed.
pub fn init(args: &LogArgs) -> Result<()> {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(&args.log_level)?)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let installed = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_filters_parse_and_bad_ones_say_what_is_valid() {
        for ok in ["info", "warn,das_driver=debug", "das_controller=trace"] {
            assert!(filter(ok).is_ok(), "{ok}");
        }
        for bad in ["loud", "info,=debug[", "das_driver=verbose"] {
            let e = format!("{:#}", filter(bad).unwrap_err());
            assert!(
                e.contains("invalid log filter") && e.contains("levels: error"),
                "{e}"
            );
        }
    }
}
