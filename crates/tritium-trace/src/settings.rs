//! Trace settings with Triton's semantics (`src/tracer.cc`, `src/command_line_parser.cc` and
//! the trace extension in `triton-inference-server/server`): the level, sampling rate and count,
//! log frequency, file and mode; the `--trace-config` flag syntax; and the updates of the trace
//! extension, with Triton's error texts.

use std::fmt;

/// How traces are recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Triton's JSON trace file (`--trace-config triton,file=...`).
    Triton,
    /// OpenTelemetry spans exported over OTLP/HTTP.
    OpenTelemetry,
}

impl Mode {
    /// The mode's name in settings (`triton`, `opentelemetry`).
    pub fn name(self) -> &'static str {
        match self {
            Mode::Triton => "triton",
            Mode::OpenTelemetry => "opentelemetry",
        }
    }

    fn parse(s: &str) -> Result<Mode, String> {
        match s {
            "triton" => Ok(Mode::Triton),
            "opentelemetry" => Ok(Mode::OpenTelemetry),
            other => Err(format!("invalid value for trace mode option: {other}")),
        }
    }
}

/// What is traced: nothing (`OFF`), timestamps, tensors, or both (Triton's bit set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Level(u8);

impl Level {
    /// Tracing disabled.
    pub const OFF: Level = Level(0);
    /// Timestamps of the request's activities.
    pub const TIMESTAMPS: Level = Level(1);
    /// Tensors (accepted; tritium records timestamps only).
    pub const TENSORS: Level = Level(2);

    /// Whether nothing is traced.
    pub fn is_off(self) -> bool {
        self.0 == 0
    }

    /// Whether timestamps are traced.
    pub fn timestamps(self) -> bool {
        self.0 & Level::TIMESTAMPS.0 != 0
    }

    /// Both levels' bits.
    pub fn with(self, other: Level) -> Level {
        Level(self.0 | other.0)
    }

    /// The level's names as settings list them (`["OFF"]`, `["TIMESTAMPS", "TENSORS"]`).
    pub fn names(self) -> Vec<String> {
        if self.is_off() {
            return vec!["OFF".into()];
        }
        let mut names = Vec::new();
        if self.timestamps() {
            names.push("TIMESTAMPS".into());
        }
        if self.0 & Level::TENSORS.0 != 0 {
            names.push("TENSORS".into());
        }
        names
    }

    /// A level on the command line (Triton's `ParseTraceLevelOption`, case-insensitive).
    pub fn parse_flag(s: &str) -> Result<Level, String> {
        match s.to_ascii_lowercase().as_str() {
            "false" | "off" => Ok(Level::OFF),
            "true" | "on" | "min" | "max" | "timestamps" => Ok(Level::TIMESTAMPS),
            "tensors" => Ok(Level::TENSORS),
            other => Err(format!("invalid value for trace level option: {other}")),
        }
    }
}

/// One trace setting (the server's, or a model's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// What is traced.
    pub level: Level,
    /// One request in `rate` is traced (0: only requests that carry a trace context).
    pub rate: u32,
    /// How many more traces are taken (-1: no limit).
    pub count: i32,
    /// Triton mode: write the file every `log_frequency` traces (0: at shutdown).
    pub log_frequency: u32,
    /// Triton mode: the trace file.
    pub file: String,
    /// The mode.
    pub mode: Mode,
    /// The mode's own options as the settings list them (`url`, `resource`, `bsp_*`).
    pub options: Vec<(String, String)>,
}

impl Default for Settings {
    /// Triton's defaults: `OFF`, rate 1000, count -1, log frequency 0, no file, triton mode.
    fn default() -> Self {
        Settings {
            level: Level::OFF,
            rate: 1000,
            count: -1,
            log_frequency: 0,
            file: String::new(),
            mode: Mode::Triton,
            options: Vec::new(),
        }
    }
}

impl Settings {
    /// Why this setting cannot trace (Triton's `invalid_reason_`), or `None`.
    pub fn invalid_reason(&self) -> Option<&'static str> {
        if self.level.is_off() {
            Some("tracing is disabled")
        } else if self.rate == 0 {
            Some("sample rate must be non-zero")
        } else if self.mode == Mode::Triton && self.file.is_empty() {
            Some("trace file name is not given")
        } else {
            None
        }
    }

    /// Whether the setting samples requests (Triton's `Valid()`).
    pub fn valid(&self) -> bool {
        self.invalid_reason().is_none() && self.count != 0
    }

    /// The setting as the trace extension answers it, in Triton's order: `trace_level` (a list),
    /// `trace_rate`, `trace_count`, in triton mode `log_frequency` and `trace_file`, then
    /// `trace_mode` and the mode's options. Every value but `trace_level`'s is one string.
    pub fn view(&self) -> Vec<(String, Vec<String>)> {
        let mut out = vec![
            ("trace_level".to_string(), self.level.names()),
            ("trace_rate".to_string(), vec![self.rate.to_string()]),
            ("trace_count".to_string(), vec![self.count.to_string()]),
        ];
        if self.mode == Mode::Triton {
            out.push(("log_frequency".into(), vec![self.log_frequency.to_string()]));
            out.push(("trace_file".into(), vec![self.file.clone()]));
        }
        out.push(("trace_mode".into(), vec![self.mode.name().to_string()]));
        for (k, v) in &self.options {
            out.push((k.clone(), vec![v.clone()]));
        }
        out
    }
}

/// The OpenTelemetry exporter's settings (`--trace-config opentelemetry,...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelOptions {
    /// Where spans are POSTed (OTLP/HTTP, protobuf).
    pub url: String,
    /// Resource attributes; `service.name` is `triton-inference-server` unless given.
    pub resource: Vec<(String, String)>,
    /// Spans waiting for export at most; more are dropped (and counted).
    pub max_queue_size: usize,
    /// The longest a span waits before its batch is sent.
    pub schedule_delay_ms: u64,
    /// Spans per export request at most.
    pub max_export_batch_size: usize,
}

impl Default for OtelOptions {
    /// The OpenTelemetry SDK's defaults, as Triton uses them.
    fn default() -> Self {
        OtelOptions {
            url: "http://localhost:4318/v1/traces".into(),
            resource: Vec::new(),
            max_queue_size: 2048,
            schedule_delay_ms: 5000,
            max_export_batch_size: 512,
        }
    }
}

/// The tracing flags, parsed: the server's setting and the exporter's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceFlags {
    /// The global setting.
    pub settings: Settings,
    /// The exporter's options (used in opentelemetry mode).
    pub otel: OtelOptions,
    /// Warnings Triton prints for the flags (deprecated flags, overridden values).
    pub warnings: Vec<String>,
}

/// The deprecated single-purpose flags (`--trace-file`, `--trace-level`, ...).
#[derive(Debug, Clone, Default)]
pub struct LegacyFlags {
    /// `--trace-file`.
    pub file: Option<String>,
    /// `--trace-level`, each occurrence.
    pub level: Vec<String>,
    /// `--trace-rate`.
    pub rate: Option<i64>,
    /// `--trace-count`.
    pub count: Option<i64>,
    /// `--trace-log-frequency`.
    pub log_frequency: Option<i64>,
}

/// A `--trace-config` or legacy trace flag Triton would refuse, with its text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FlagError(pub String);

/// Parses an integer as Triton's `ParseOption<int>` (`std::stoi`, whole string).
fn flag_int(s: &str) -> Result<i64, String> {
    s.trim().parse::<i32>().map(i64::from).map_err(|_| format!("invalid value for integer option: {s}"))
}

/// The flags as Triton's `PostProcessTraceArgs` combines them: `--trace-config` values
/// (`[<mode>,]<setting>=<value>`, repeatable) override the deprecated flags, `level=OFF`
/// anywhere disables tracing, and the mode's own settings apply only in that mode.
pub fn parse_flags(configs: &[String], legacy: &LegacyFlags) -> Result<TraceFlags, FlagError> {
    let mut s = Settings::default();
    let mut warnings = Vec::new();
    let mut explicit_off = false;
    let mut global = Vec::new();
    let mut triton = Vec::new();
    let mut otel_settings = Vec::new();
    for arg in configs {
        let (mode, setting, value) = split_config(arg)?;
        match mode {
            None => global.push((setting, value)),
            Some(Mode::Triton) => triton.push((setting, value)),
            Some(Mode::OpenTelemetry) => otel_settings.push((setting, value)),
        }
    }
    let bad = |prefix: &str, setting: &str, why: String| {
        FlagError(format!("Bad option: \"--trace-config {prefix}{setting}\".\n{why}"))
    };
    for level in &legacy.level {
        warnings.push(
            "'--trace-level' has been deprecated and will be removed in a future release; use '--trace-config level=<OFF|TIMESTAMPS|TENSORS>' instead"
                .into(),
        );
        let parsed = Level::parse_flag(level).map_err(|e| FlagError(format!("Bad option: \"--trace-level\".\n{e}")))?;
        explicit_off |= parsed.is_off();
        s.level = s.level.with(parsed);
    }
    if let Some(rate) = legacy.rate {
        warnings.push("'--trace-rate' has been deprecated; use '--trace-config rate=<rate value>' instead".into());
        s.rate = rate as u32;
    }
    if let Some(count) = legacy.count {
        warnings.push("'--trace-count' has been deprecated; use '--trace-config count=<count value>' instead".into());
        s.count = count as i32;
    }
    for (setting, value) in &global {
        match setting.as_str() {
            "rate" => s.rate = flag_int(value).map_err(|e| bad("", setting, e))? as u32,
            "count" => s.count = flag_int(value).map_err(|e| bad("", setting, e))? as i32,
            "level" => {
                let parsed = Level::parse_flag(value).map_err(|e| bad("", setting, e))?;
                explicit_off |= parsed.is_off();
                s.level = s.level.with(parsed);
            }
            "mode" => s.mode = Mode::parse(value).map_err(|e| bad("", setting, e))?,
            _ => {}
        }
    }
    let mut otel = OtelOptions::default();
    match s.mode {
        Mode::Triton => {
            if let Some(file) = &legacy.file {
                warnings.push(
                    "'--trace-file' has been deprecated; use '--trace-config triton,file=<filepath>' instead".into(),
                );
                s.file = file.clone();
            }
            if let Some(f) = legacy.log_frequency {
                warnings.push(
                    "'--trace-log-frequency' has been deprecated; use '--trace-config triton,log-frequency=<value>' instead"
                        .into(),
                );
                s.log_frequency = f as u32;
            }
            for (setting, value) in &triton {
                match setting.as_str() {
                    "file" => s.file = value.clone(),
                    "log-frequency" => {
                        s.log_frequency = flag_int(value).map_err(|e| bad("triton,", setting, e))? as u32
                    }
                    _ => {}
                }
            }
        }
        Mode::OpenTelemetry => {
            if legacy.file.is_some() {
                warnings
                    .push("'--trace-file' is deprecated and will be ignored with opentelemetry tracing mode".into());
            }
            if legacy.log_frequency.is_some() {
                warnings.push(
                    "'--trace-log-frequency' is deprecated and will be ignored with opentelemetry tracing mode".into(),
                );
            }
            let uint = |setting: &str, value: &str| -> Result<u64, FlagError> {
                value.trim().parse::<u32>().map(u64::from).map_err(|_| {
                    bad("opentelemetry,", setting, format!("invalid value for unsigned integer option: {value}"))
                })
            };
            for (setting, value) in &otel_settings {
                match setting.as_str() {
                    "url" => otel.url = value.clone(),
                    "resource" => {
                        let (k, v) = value.split_once('=').unwrap_or((value.as_str(), ""));
                        otel.resource.push((k.to_string(), v.to_string()));
                    }
                    "bsp_max_queue_size" => otel.max_queue_size = uint(setting, value)? as usize,
                    "bsp_schedule_delay" => otel.schedule_delay_ms = uint(setting, value)?,
                    "bsp_max_export_batch_size" => otel.max_export_batch_size = uint(setting, value)? as usize,
                    _ => {}
                }
                if !setting.starts_with("bsp_") {
                    s.options.push((setting.clone(), value.clone()));
                }
            }
            if otel.max_export_batch_size > otel.max_queue_size {
                return Err(FlagError(format!(
                    "Bad option: \"--trace-config opentelemetry,bsp_max_export_batch_size\".\nbsp_max_export_batch_size ({}) must be less than or equal to bsp_max_queue_size ({})",
                    otel.max_export_batch_size, otel.max_queue_size
                )));
            }
            s.options.push(("bsp_max_queue_size".into(), otel.max_queue_size.to_string()));
            s.options.push(("bsp_schedule_delay".into(), otel.schedule_delay_ms.to_string()));
            s.options.push(("bsp_max_export_batch_size".into(), otel.max_export_batch_size.to_string()));
        }
    }
    if explicit_off {
        s.level = Level::OFF;
    }
    Ok(TraceFlags { settings: s, otel, warnings })
}

/// Splits one `--trace-config` value as Triton's `ParseTraceConfigOption`.
fn split_config(arg: &str) -> Result<(Option<Mode>, String, String), FlagError> {
    let format = || FlagError(format!("--trace-config option format is '<trace mode>,<setting>=<value>'. Got {arg}"));
    let (mode, rest) = match arg.find(',') {
        Some(0) => {
            return Err(FlagError(format!(
                "No trace mode specified. --trace-config option format is <trace mode>,<setting>=<value> or <setting>=<value>. Got {arg}"
            )))
        }
        Some(i) if !arg[..i].contains('=') => {
            let mode = Mode::parse(&arg[..i]).map_err(|e| FlagError(format!("Bad option: \"--trace-config\".\n{e}")))?;
            (Some(mode), &arg[i + 1..])
        }
        _ => (None, arg),
    };
    let (setting, value) = rest.split_once('=').ok_or_else(format)?;
    if setting.is_empty() || value.is_empty() {
        return Err(format());
    }
    Ok((mode, setting.to_string(), value.to_string()))
}

/// A change to one field of a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Change<T> {
    /// Left as it is.
    #[default]
    Keep,
    /// Cleared: the fallback (the global setting, for a model) applies again.
    Clear,
    /// Set.
    Set(T),
}

/// An update of the trace extension (`POST .../trace/setting`, gRPC `TraceSetting`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Update {
    /// `trace_level`.
    pub level: Change<Level>,
    /// `trace_rate`.
    pub rate: Change<u32>,
    /// `trace_count`.
    pub count: Change<i32>,
    /// `log_frequency`.
    pub log_frequency: Change<u32>,
}

/// One setting's new value in an update request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateValue {
    /// JSON `null` or an empty gRPC value list: clear the setting.
    Clear,
    /// The values (one for every setting but `trace_level`).
    Values(Vec<String>),
}

/// Why an update or a read of the settings was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    /// Triton's `UNSUPPORTED` (the trace file cannot be changed over the network).
    #[error("{0}")]
    Unsupported(String),
    /// Triton's `INVALID_ARG`.
    #[error("{0}")]
    Invalid(String),
}

/// Parses an integer as `std::stoi` does (leading blanks, a sign, the digits that follow,
/// anything after them ignored), with Triton's texts for no number and for one out of the
/// `int` range (`range` is how Triton's text states the range).
fn stoi(name: &str, value: &str, range: &str) -> Result<i64, SettingError> {
    let t = value.trim_start();
    let (sign, digits) = match t.as_bytes().first() {
        Some(b'-') => (-1i64, &t[1..]),
        Some(b'+') => (1, &t[1..]),
        _ => (1, t),
    };
    let end = digits.bytes().position(|b| !b.is_ascii_digit()).unwrap_or(digits.len());
    if end == 0 {
        return Err(SettingError::Invalid(format!("Unable to parse '{name}', got: {value}")));
    }
    let n = digits[..end].parse::<i64>().ok().map(|n| n * sign).filter(|n| i32::try_from(*n).is_ok());
    n.ok_or_else(|| {
        SettingError::Invalid(format!("Unable to parse '{name}', value is out of range [ {range} ], got: {value}"))
    })
}

/// An update from its named values, with Triton's checks and texts (unknown names are
/// ignored, as Triton does).
pub fn parse_update(values: &[(String, UpdateValue)]) -> Result<Update, SettingError> {
    let mut update = Update::default();
    let get = |name: &str| values.iter().find(|(k, _)| k == name).map(|(_, v)| v);
    if get("trace_file").is_some() {
        return Err(SettingError::Unsupported(
            "trace file location can not be updated through network protocol".into(),
        ));
    }
    if let Some(v) = get("trace_level") {
        update.level = match v {
            UpdateValue::Clear => Change::Clear,
            UpdateValue::Values(levels) => {
                let mut level = Level::OFF;
                let mut any = false;
                for l in levels {
                    match l.as_str() {
                        "OFF" if levels.len() == 1 => any = true,
                        "OFF" => {
                            return Err(SettingError::Invalid("Expect only one trace level 'OFF' is specified".into()))
                        }
                        "TIMESTAMPS" => (level, any) = (level.with(Level::TIMESTAMPS), true),
                        "TENSORS" => (level, any) = (level.with(Level::TENSORS), true),
                        _ => {}
                    }
                }
                if any {
                    Change::Set(level)
                } else {
                    Change::Keep
                }
            }
        };
    }
    let u32_range = format!("{}, {}", u32::MIN, u32::MAX);
    let one = |name: &str| -> Result<Option<Option<String>>, SettingError> {
        match get(name) {
            None => Ok(None),
            Some(UpdateValue::Clear) => Ok(Some(None)),
            Some(UpdateValue::Values(v)) if v.len() == 1 => Ok(Some(Some(v[0].clone()))),
            Some(UpdateValue::Values(_)) => Err(SettingError::Invalid(format!("expect only 1 value for '{name}'"))),
        }
    };
    update.rate = match one("trace_rate")? {
        None => Change::Keep,
        Some(None) => Change::Clear,
        Some(Some(v)) => Change::Set(stoi("trace_rate", &v, &u32_range)? as u32),
    };
    update.count = match one("trace_count")? {
        None => Change::Keep,
        Some(None) => Change::Clear,
        Some(Some(v)) => {
            let n = stoi("trace_count", &v, &format!("-1, {}", i32::MAX))?;
            if n < -1 {
                return Err(SettingError::Invalid(format!(
                    "Unable to parse 'trace_count'. Expecting value >= -1, got: {v}"
                )));
            }
            Change::Set(n as i32)
        }
    };
    update.log_frequency = match one("log_frequency")? {
        None => Change::Keep,
        Some(None) => Change::Clear,
        Some(Some(v)) => Change::Set(stoi("log_frequency", &v, &u32_range)? as u32),
    };
    Ok(update)
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(configs: &[&str]) -> Result<TraceFlags, FlagError> {
        parse_flags(&configs.iter().map(|s| s.to_string()).collect::<Vec<_>>(), &LegacyFlags::default())
    }

    #[test]
    fn trace_config_sets_the_global_and_mode_settings() {
        let f = flags(&[
            "mode=opentelemetry",
            "rate=1",
            "level=TIMESTAMPS",
            "count=5",
            "opentelemetry,url=http://127.0.0.1:9/v1/traces",
            "opentelemetry,resource=team=ml",
            "opentelemetry,bsp_schedule_delay=50",
            "triton,file=/ignored",
        ])
        .expect("valid");
        assert_eq!(f.settings.mode, Mode::OpenTelemetry);
        assert_eq!((f.settings.rate, f.settings.count), (1, 5));
        assert!(f.settings.level.timestamps());
        assert_eq!(f.settings.file, "");
        assert_eq!(f.otel.url, "http://127.0.0.1:9/v1/traces");
        assert_eq!(f.otel.resource, vec![("team".to_string(), "ml".to_string())]);
        assert_eq!(f.otel.schedule_delay_ms, 50);
        let keys: Vec<_> = f.settings.view().into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "trace_level",
                "trace_rate",
                "trace_count",
                "trace_mode",
                "url",
                "resource",
                "bsp_max_queue_size",
                "bsp_schedule_delay",
                "bsp_max_export_batch_size"
            ]
        );
    }

    #[test]
    fn triton_mode_and_legacy_flags() {
        let legacy = LegacyFlags {
            file: Some("/tmp/old.json".into()),
            level: vec!["TIMESTAMPS".into()],
            rate: Some(7),
            ..Default::default()
        };
        let f = parse_flags(&["rate=3".into(), "triton,log-frequency=2".into()], &legacy).expect("valid");
        assert_eq!((f.settings.rate, f.settings.log_frequency), (3, 2));
        assert_eq!(f.settings.file, "/tmp/old.json");
        assert!(f.settings.valid());
        assert!(!f.warnings.is_empty());
        // level=OFF anywhere wins.
        let f = flags(&["level=TIMESTAMPS", "level=OFF"]).expect("valid");
        assert!(f.settings.level.is_off());
        assert_eq!(f.settings.invalid_reason(), Some("tracing is disabled"));
    }

    #[test]
    fn bad_trace_config_values_are_refused_with_tritons_texts() {
        let err = |a: &str| flags(&[a]).expect_err(a).0;
        assert!(err(",rate=1").starts_with("No trace mode specified."));
        assert_eq!(err("rate"), "--trace-config option format is '<trace mode>,<setting>=<value>'. Got rate");
        assert_eq!(err("rate="), "--trace-config option format is '<trace mode>,<setting>=<value>'. Got rate=");
        assert!(err("jaeger,url=x").contains("invalid value for trace mode option: jaeger"));
        assert!(err("level=LOUD").contains("invalid value for trace level option: loud"));
        assert!(err("rate=often").contains("Bad option: \"--trace-config rate\""));
    }

    fn values(pairs: &[(&str, Option<&[&str]>)]) -> Vec<(String, UpdateValue)> {
        pairs
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    None => UpdateValue::Clear,
                    Some(v) => UpdateValue::Values(v.iter().map(|s| s.to_string()).collect()),
                };
                (k.to_string(), v)
            })
            .collect()
    }

    #[test]
    fn updates_parse_as_triton_parses_them() {
        let u = parse_update(&values(&[
            ("trace_level", Some(&["TIMESTAMPS", "TENSORS"])),
            ("trace_rate", Some(&["12abc"])),
            ("trace_count", None),
            ("unknown", Some(&["x"])),
        ]))
        .expect("valid");
        assert_eq!(u.level, Change::Set(Level::TIMESTAMPS.with(Level::TENSORS)));
        assert_eq!(u.rate, Change::Set(12));
        assert_eq!(u.count, Change::Clear);
        assert_eq!(u.log_frequency, Change::Keep);
        let err = |pairs: &[(&str, Option<&[&str]>)]| parse_update(&values(pairs)).expect_err("refused").to_string();
        assert_eq!(
            err(&[("trace_file", Some(&["/x"]))]),
            "trace file location can not be updated through network protocol"
        );
        assert_eq!(
            err(&[("trace_level", Some(&["OFF", "TIMESTAMPS"]))]),
            "Expect only one trace level 'OFF' is specified"
        );
        assert_eq!(err(&[("trace_rate", Some(&["often"]))]), "Unable to parse 'trace_rate', got: often");
        assert_eq!(
            err(&[("trace_rate", Some(&["99999999999"]))]),
            "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 99999999999"
        );
        assert_eq!(
            err(&[("trace_count", Some(&["-2"]))]),
            "Unable to parse 'trace_count'. Expecting value >= -1, got: -2"
        );
        assert_eq!(err(&[("log_frequency", Some(&["1", "2"]))]), "expect only 1 value for 'log_frequency'");
    }
}
