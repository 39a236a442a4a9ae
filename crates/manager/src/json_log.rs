//! JSON log lines with every field at the top level, as controller-runtime's zap logger writes
//! them: `{"timestamp":..,"level":..,"target":..,"controller":"memcached","namespace":"ns",
//! "name":"m","message":..}`, or with zap's own key names (`log_keys: zap`):
//! `{"ts":1733400000.123,"level":"info","logger":..,"msg":..,"controller":..}`.
//!
//! tracing-subscriber's own JSON format nests the current span's fields in a `span` object and
//! adds the span's name there under `name`, so the reconcile span's `name` field (the object's)
//! appeared twice in one object and most JSON readers kept only the span's name. Here the
//! fields of every span in scope come first, outermost first, then the event's own; a field
//! repeated further in wins, and the span names are not written.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use crate::config::LogKeys;

/// Formats each event as one flat JSON object (see the module documentation). Spans' fields
/// must be recorded with [`JsonFields`].
#[derive(Clone, Copy, Debug)]
pub struct FlatJson {
    keys: LogKeys,
}

impl Default for FlatJson {
    fn default() -> Self {
        Self::with_keys(LogKeys::Tracing)
    }
}

impl FlatJson {
    /// Lines with `keys`' names for the time, level, logger and message.
    pub fn with_keys(keys: LogKeys) -> Self {
        Self { keys }
    }
}

impl<S> FormatEvent<S, JsonFields> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = Map::new();
        let now = k8s_openapi::jiff::Timestamp::now();
        let level = *event.metadata().level();
        match self.keys {
            LogKeys::Tracing => {
                line.insert("timestamp".into(), Value::String(now.to_string()));
                line.insert("level".into(), Value::String(level.to_string()));
            }
            LogKeys::Zap => {
                // zap's epoch time encoder: seconds, with the fraction.
                #[allow(clippy::cast_precision_loss)] // microseconds of the epoch fit
                let seconds = now.as_microsecond() as f64 / 1e6;
                line.insert("ts".into(), seconds.into());
                line.insert("level".into(), Value::String(zap_level(level).into()));
            }
        }
        for span in ctx.event_scope().into_iter().flat_map(|s| s.from_root()) {
            let extensions = span.extensions();
            let Some(fields) = extensions.get::<FormattedFields<JsonFields>>() else {
                continue;
            };
            // A span without fields records an empty string, not `{}`.
            if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(fields) {
                line.extend(fields);
            }
        }
        event.record(&mut Fields(&mut line));
        let target = Value::String(event.metadata().target().to_owned());
        match self.keys {
            LogKeys::Tracing => {
                line.insert("target".into(), target);
            }
            LogKeys::Zap => {
                line.insert("logger".into(), target);
                if let Some(message) = line.remove("message") {
                    line.insert("msg".into(), message);
                }
            }
        }
        let text = serde_json::to_string(&line).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// zap's name of a level: it has no trace, and its debug is logr's first verbosity.
fn zap_level(level: tracing::Level) -> &'static str {
    match level {
        tracing::Level::ERROR => "error",
        tracing::Level::WARN => "warn",
        tracing::Level::INFO => "info",
        tracing::Level::DEBUG | tracing::Level::TRACE => "debug",
    }
}

/// Collects an event's fields into a JSON object.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Fields<'_> {
    fn put(&mut self, field: &Field, value: Value) {
        self.0.insert(field.name().to_owned(), value);
    }
}

impl Visit for Fields<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        let number = serde_json::Number::from_f64(value)
            .map_or_else(|| Value::String(value.to_string()), Value::Number);
        self.put(field, number);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, value.to_string().into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, format!("{value:?}").into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    /// A writer that keeps what the subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn lines(captured: &Captured) -> Vec<Value> {
        let bytes = captured
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        String::from_utf8(bytes)
            .expect("utf-8")
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
            .collect()
    }

    #[test]
    fn span_fields_and_event_fields_share_one_flat_object() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson::default())
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let outer = tracing::info_span!("manager", replica = "a");
            let _outer = outer.enter();
            let span = tracing::info_span!(
                "reconcile",
                controller = "memcached",
                namespace = "ns",
                name = "m"
            );
            let _entered = span.enter();
            tracing::warn!(ready = 2, done = true, ratio = 0.5, "status changed");
            tracing::info_span!("empty").in_scope(|| tracing::info!(replica = "b", "inner"));
        });
        let lines = lines(&captured);
        let first = &lines[0];
        assert_eq!(first["name"], "m", "the object's name, not the span's");
        assert_eq!(first["namespace"], "ns");
        assert_eq!(first["controller"], "memcached");
        assert_eq!(first["replica"], "a");
        assert_eq!(first["message"], "status changed");
        assert_eq!(first["level"], "WARN");
        assert_eq!(first["ready"], 2);
        assert_eq!(first["done"], true);
        assert_eq!(first["ratio"], 0.5);
        assert!(first.get("span").is_none());
        assert!(
            first["timestamp"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z'))
        );
        assert_eq!(lines[1]["replica"], "b", "the event's own field wins");
    }

    #[test]
    fn zap_keys_name_the_time_level_logger_and_message_as_zap_does() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson::with_keys(LogKeys::Zap))
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info_span!("reconcile", controller = "memcached")
                .in_scope(|| tracing::warn!(ready = 2, "status changed"));
        });
        let lines = lines(&captured);
        let line = &lines[0];
        assert_eq!(line["msg"], "status changed");
        assert_eq!(line["level"], "warn");
        assert_eq!(line["controller"], "memcached");
        assert_eq!(line["ready"], 2);
        assert!(line["logger"].as_str().is_some_and(|l| !l.is_empty()));
        assert!(line["ts"].as_f64().is_some_and(|ts| ts > 1.7e9), "{line}");
        for tracing_key in ["timestamp", "message", "target"] {
            assert!(line.get(tracing_key).is_none(), "{tracing_key} in {line}");
        }
    }
}
