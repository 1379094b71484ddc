//! Logging of every DAS binary: `tracing` to stderr, text or JSON, a filter in `EnvFilter`
//! syntax. ANSI colours only when stderr is a terminal, so log files and `kubectl logs` carry
//! plain text that greps match.

use std::io::IsTerminal;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;

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
    /// One human-readable line per event: `<time> <LEVEL> <spans>: <target>: <message>
    /// <key>=<value>…`, `<spans>` as `name{field=value …}` joined by `:` (none outside a span).
    Text,
    /// One JSON object per event (`timestamp`, `level`, `fields`, `target`, and the spans it is
    /// logged in: `span`, `spans`).
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

/// Installs the global subscriber for `args` ([`subscriber`] writing to stderr, colours only
/// when stderr is a terminal).
///
/// # Errors
/// An invalid filter (see [`filter`]), or a subscriber already installed.
pub fn init(args: &LogArgs) -> Result<()> {
    let ansi = std::io::stderr().is_terminal();
    let subscriber = subscriber(
        args.log_format,
        filter(&args.log_level)?,
        std::io::stderr,
        ansi,
    );
    subscriber
        .try_init()
        .map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))
}

/// The subscriber every binary logs through, writing lines in `format` through `writer`, with
/// ANSI colours when `ansi`. Text lines start with the spans the line is logged in
/// (`name{field=value …}:`, outermost first); JSON objects carry the innermost span as `span`
/// and all of them as `spans` (outermost first), each with its `name` and fields. Tests install
/// it for one thread with [`tracing::subscriber::set_default`] to read what a binary would log.
pub fn subscriber<W>(
    format: LogFormat,
    filter: tracing_subscriber::EnvFilter,
    writer: W,
    ansi: bool,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => Box::new(builder.finish()),
        LogFormat::Json => Box::new(builder.json().finish()),
    }
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
