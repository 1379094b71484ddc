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

/// A log writer that keeps every line it is given, for tests that read what a binary would log
/// ([`subscriber`] writing to it; clones share the lines).
#[cfg(any(test, feature = "testing"))]
#[derive(Clone, Default)]
pub struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(any(test, feature = "testing"))]
impl Captured {
    /// The lines written so far.
    ///
    /// # Panics
    /// A writer panicked while holding the buffer, or wrote invalid UTF-8.
    pub fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().expect("captured lines").clone();
        String::from_utf8(bytes)
            .expect("log lines are UTF-8")
            .lines()
            .map(String::from)
            .collect()
    }
}

#[cfg(any(test, feature = "testing"))]
impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("captured lines poisoned"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(any(test, feature = "testing"))]
impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Installs [`subscriber`] in `format` with filter `level` for the current thread, writing into
/// a [`Captured`]: what a binary would log from code that runs on this thread (a current-thread
/// runtime's tasks), until the [`Capturing`] guard is dropped.
///
/// # Panics
/// `level` is not a valid filter.
#[cfg(any(test, feature = "testing"))]
pub fn capture(format: LogFormat, level: &str) -> (Captured, Capturing) {
    let out = Captured::default();
    let filter = filter(level).expect("a valid log filter");
    // A second live dispatcher beside the thread's: while `tracing` knows of one dispatcher
    // only, a span or event met first on another thread (a test running beside this one, with
    // none) asks that thread's default, none, and is cached as never enabled, for this thread
    // too; with two, it asks them all.
    let companion = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    let guard = tracing::subscriber::set_default(subscriber(format, filter, out.clone(), false));
    (
        out,
        Capturing {
            _default: guard,
            _companion: companion,
        },
    )
}

/// While it lives, [`capture`] captures this thread's lines.
#[cfg(any(test, feature = "testing"))]
pub struct Capturing {
    _default: tracing::subscriber::DefaultGuard,
    _companion: tracing::Dispatch,
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

    #[test]
    fn a_line_carries_its_spans_first_in_text_and_as_span_and_spans_in_json() {
        let log = |format| {
            let (out, _guard) = capture(format, "warn");
            tracing::error_span!("prepare", claim.uid = %"u1").in_scope(|| {
                tracing::error_span!("acquire", gpu = 0)
                    .in_scope(|| tracing::warn!(n = 1, "inside"));
            });
            tracing::warn!("outside");
            out.lines()
        };
        let text = log(LogFormat::Text);
        assert!(
            text[0].contains(" WARN prepare{claim.uid=u1}:acquire{gpu=0}: ")
                && text[0].ends_with("inside n=1"),
            "{text:?}"
        );
        assert!(!text[1].contains('{'), "no span outside: {text:?}");
        let json: Vec<serde_json::Value> = log(LogFormat::Json)
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let (outer, inner) = (
            serde_json::json!({"name": "prepare", "claim.uid": "u1"}),
            serde_json::json!({"name": "acquire", "gpu": 0}),
        );
        assert_eq!(json[0]["span"], inner, "the innermost: {json:?}");
        assert_eq!(
            json[0]["spans"],
            serde_json::json!([outer, inner]),
            "{json:?}"
        );
        assert_eq!(
            json[0]["fields"],
            serde_json::json!({"message": "inside", "n": 1})
        );
        assert!(json[1].get("spans").is_none(), "{json:?}");
    }
}
