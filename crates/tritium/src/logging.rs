//! Process logging: Triton's switches (`--log-info`, `--log-warning`, `--log-error`,
//! `--log-verbose`) and formats (`default`, `ISO8601`, `json`), changeable at run time through the
//! logging extension (`/v2/logging`, gRPC `LogSettings`), and `--log-file`, which only the command
//! line sets: a client that could name the file could make the server append to any file it can
//! write (Triton's CVE-2024-0087).

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use tracing::{Level, Metadata};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;
use tritium_server::{ErrorKind, InferError, LogControl, LogSettings, LogSettingsUpdate};
use tritium_sync::Locked;

const FORMAT_DEFAULT: u8 = 0;
const FORMAT_ISO8601: u8 = 1;
const FORMAT_JSON: u8 = 2;

fn format_code(name: &str) -> Option<u8> {
    match name {
        "default" => Some(FORMAT_DEFAULT),
        "ISO8601" | "iso8601" => Some(FORMAT_ISO8601),
        "json" => Some(FORMAT_JSON),
        _ => None,
    }
}

/// The switches every log line is checked against.
#[derive(Default)]
struct Switches {
    info: AtomicBool,
    warning: AtomicBool,
    error: AtomicBool,
    verbose: AtomicU32,
    format: AtomicU8,
}

impl Switches {
    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        match *meta.level() {
            Level::ERROR => self.error.load(Ordering::Relaxed),
            Level::WARN => self.warning.load(Ordering::Relaxed),
            Level::INFO => self.info.load(Ordering::Relaxed),
            Level::DEBUG => self.verbose.load(Ordering::Relaxed) >= 1,
            Level::TRACE => self.verbose.load(Ordering::Relaxed) >= 2,
        }
    }
}

/// Where log lines go: a file when one is set, else stderr.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Option<File>>>);

struct SinkWriter(Arc<Mutex<Option<File>>>);

impl Write for SinkWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &mut *self.0.locked() {
            Some(f) => f.write(buf),
            None => std::io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut *self.0.locked() {
            Some(f) => f.flush(),
            None => std::io::stderr().flush(),
        }
    }
}

impl<'a> MakeWriter<'a> for Sink {
    type Writer = SinkWriter;
    fn make_writer(&'a self) -> SinkWriter {
        SinkWriter(self.0.clone())
    }
}

/// The process's logging, installed once.
pub(crate) struct Logging {
    switches: Arc<Switches>,
    sink: Sink,
    settings: Mutex<LogSettings>,
}

impl Logging {
    fn new(settings: LogSettings) -> Result<Arc<Self>, InferError> {
        let file = if settings.log_file.is_empty() {
            None
        } else {
            Some(File::options().create(true).append(true).open(&settings.log_file).map_err(|e| {
                InferError::new(ErrorKind::InvalidArg, format!("cannot open log file '{}': {e}", settings.log_file))
            })?)
        };
        let logging = Arc::new(Self {
            switches: Arc::default(),
            sink: Sink(Arc::new(Mutex::new(file))),
            settings: Mutex::new(settings.clone()),
        });
        logging.apply(&settings)?;
        Ok(logging)
    }

    /// Installs the global subscriber with `settings`.
    pub(crate) fn install(settings: LogSettings) -> anyhow::Result<Arc<Self>> {
        let logging = Self::new(settings).map_err(|e| anyhow::anyhow!(e.message))?;
        let (text_switch, json_switch, level_switch) =
            (logging.switches.clone(), logging.switches.clone(), logging.switches.clone());
        let text = tracing_subscriber::fmt::layer()
            .with_target(false)
            .with_ansi(false)
            .with_writer(logging.sink.clone())
            .with_filter(filter_fn(move |_| text_switch.format.load(Ordering::Relaxed) != FORMAT_JSON));
        let json = tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_writer(logging.sink.clone())
            .with_filter(filter_fn(move |_| json_switch.format.load(Ordering::Relaxed) == FORMAT_JSON));
        // `filter_fn` caches each callsite's answer (a disabled `debug!` then costs one load on
        // the request path, where asking the switches at every event was 2% of the server's CPU);
        // `apply` has every callsite asked again when the switches change.
        tracing_subscriber::registry()
            .with(text)
            .with(json)
            .with(filter_fn(move |meta| level_switch.enabled(meta)))
            .try_init()
            .map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))?;
        Ok(logging)
    }

    fn apply(&self, s: &LogSettings) -> Result<(), InferError> {
        let format = format_code(&s.log_format).ok_or_else(|| {
            InferError::new(
                ErrorKind::InvalidArg,
                format!("invalid log format '{}': use default, ISO8601 or json", s.log_format),
            )
        })?;
        let sw = &self.switches;
        sw.info.store(s.log_info, Ordering::Relaxed);
        sw.warning.store(s.log_warning, Ordering::Relaxed);
        sw.error.store(s.log_error, Ordering::Relaxed);
        sw.verbose.store(s.log_verbose_level, Ordering::Relaxed);
        sw.format.store(format, Ordering::Relaxed);
        // Each callsite's cached answer (`filter_fn`) follows the new switches.
        tracing::callsite::rebuild_interest_cache();
        Ok(())
    }
}

impl LogControl for Logging {
    fn get(&self) -> LogSettings {
        self.settings.locked().clone()
    }

    fn update(&self, u: LogSettingsUpdate) -> Result<LogSettings, InferError> {
        let mut current = self.settings.locked();
        let mut next = current.clone();
        if let Some(v) = u.log_info {
            next.log_info = v;
        }
        if let Some(v) = u.log_warning {
            next.log_warning = v;
        }
        if let Some(v) = u.log_error {
            next.log_error = v;
        }
        if let Some(v) = u.log_verbose_level {
            next.log_verbose_level = v;
        }
        if let Some(v) = u.log_format {
            next.log_format = v;
        }
        self.apply(&next)?;
        *current = next.clone();
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_triton_names_plus_json() {
        assert_eq!(format_code("default"), Some(FORMAT_DEFAULT));
        assert_eq!(format_code("ISO8601"), Some(FORMAT_ISO8601));
        assert_eq!(format_code("json"), Some(FORMAT_JSON));
        assert_eq!(format_code("xml"), None);
    }

    fn settings() -> LogSettings {
        LogSettings {
            log_file: String::new(),
            log_info: true,
            log_warning: true,
            log_error: true,
            log_verbose_level: 0,
            log_format: "default".into(),
        }
    }

    #[test]
    fn updates_change_the_switches_and_bad_ones_change_nothing() {
        let logging = Logging::new(settings()).expect("new");
        let after = logging
            .update(LogSettingsUpdate { log_info: Some(false), log_verbose_level: Some(2), ..Default::default() })
            .expect("update");
        assert!(!after.log_info && after.log_verbose_level == 2);
        assert!(!logging.switches.info.load(Ordering::Relaxed));
        assert_eq!(logging.switches.verbose.load(Ordering::Relaxed), 2);
        let err = logging.update(LogSettingsUpdate {
            log_format: Some("xml".into()),
            log_info: Some(true),
            ..Default::default()
        });
        assert!(err.expect_err("bad format").message.contains("invalid log format 'xml'"));
        assert_eq!(logging.get(), after, "a refused update changes nothing");
    }

    #[test]
    fn the_log_file_is_set_at_start_and_kept_by_updates() {
        let dir = tempfile_dir();
        let file = dir.join("t.log");
        let logging =
            Logging::new(LogSettings { log_file: file.display().to_string(), ..settings() }).expect("new with a file");
        let after = logging.update(LogSettingsUpdate { log_info: Some(false), ..Default::default() }).expect("update");
        assert_eq!(after.log_file, file.display().to_string());
        let mut w = logging.sink.make_writer();
        w.write_all(b"hello\n").expect("write");
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "hello\n");
        let _ = std::fs::remove_dir_all(dir);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("tritium-log-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }
}
