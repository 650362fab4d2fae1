//! The JSON log line (`LOG_FORMAT=json`): one object per event, `timestamp`, `level`,
//! the event's fields flattened, `target`, and `spans` (names, outermost first) when
//! the event happened inside any. Numbers and booleans stay numbers and booleans, and
//! a field given as [`Json`] (a list, an object) is written as that JSON value, not as
//! a string.
//!
//! Why our own formatter: tracing's fields are strings, numbers, booleans or `Debug`
//! text; tracing-subscriber's JSON writes anything else as a string, and the way to
//! pass a structured value (`valuable`) needs the `tracing_unstable` cfg on every
//! build. Instead [`Json`] writes JSON text and marks, on its thread, that it did; the
//! visitor here clears the mark, formats the field, and reads the text back as JSON
//! when the mark is set. Text logs show the same JSON text (`errors=["a","b"]`).

use std::cell::Cell;
use std::fmt::{self, Write as _};

use serde::Serialize;
use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

thread_local! {
    /// Set by [`Json`]'s formatting: the text just written is a JSON value.
    static WROTE_JSON: Cell<bool> = const { Cell::new(false) };
}

/// A field value written as JSON: `errors = %Json(&messages)` is an array in JSON
/// logs. Serialised only when the event is emitted.
pub struct Json<T>(pub T);

impl<T: Serialize> fmt::Display for Json<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = serde_json::to_string(&self.0).map_err(|_| fmt::Error)?;
        WROTE_JSON.with(|mark| mark.set(true));
        f.write_str(&text)
    }
}

impl<T: Serialize> fmt::Debug for Json<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The JSON event formatter.
#[derive(Debug, Default)]
pub struct JsonLines {
    timer: SystemTime,
}

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut time = String::new();
        self.timer.format_time(&mut Writer::new(&mut time))?;
        let mut line = Line(String::with_capacity(256));
        line.0.push('{');
        line.field("timestamp", &Value::String(time), true);
        line.field("level", &Value::from(meta.level().as_str()), false);
        event.record(&mut line);
        line.field("target", &Value::from(meta.target()), false);
        if let Some(scope) = ctx.event_scope() {
            let spans: Vec<Value> = scope.from_root().map(|s| Value::from(s.name())).collect();
            line.field("spans", &Value::Array(spans), false);
        }
        line.0.push('}');
        writeln!(writer, "{}", line.0)
    }
}

/// The object being written, in field order.
struct Line(String);

impl Line {
    fn field(&mut self, name: &str, value: &Value, first: bool) {
        if !first {
            self.0.push(',');
        }
        // Serialising a string or a `Value` to a `String` cannot fail.
        let _ = write!(
            self.0,
            "{}:{}",
            Value::from(name),
            serde_json::to_string(value).unwrap_or_default()
        );
    }
}

impl Visit for Line {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.field(field.name(), &Value::from(value), false);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.field(field.name(), &Value::from(value), false);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.field(field.name(), &Value::from(value), false);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.field(field.name(), &Value::from(value), false);
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.field(field.name(), &Value::from(value), false);
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.field(field.name(), &Value::from(value.to_string()), false);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        WROTE_JSON.with(|mark| mark.set(false));
        let text = format!("{value:?}");
        let json = WROTE_JSON.with(|mark| mark.replace(false));
        // Text that only contains a `Json` value among other things does not parse,
        // and stays a string.
        let value = json
            .then(|| serde_json::from_str(&text).ok())
            .flatten()
            .unwrap_or(Value::String(text));
        self.field(field.name(), &value, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::sync::{Arc, Mutex};

    /// Captures what the subscriber writes.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn lines(emit: impl FnOnce()) -> Vec<Value> {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .event_format(JsonLines::default())
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    #[test]
    fn lists_are_arrays_numbers_are_numbers_and_debug_text_stays_a_string() {
        let errors = vec!["x.yaml:1: bad".to_owned(), "y.yaml:2: \"worse\"".to_owned()];
        let lines = lines(|| {
            tracing::warn!(
                event = "config_reload_failed",
                errors = %Json(&errors),
                wrapped = %format_args!("errors: {}", Json(&errors)),
                count = 2u64,
                ok = false,
                "reload failed: {}",
                errors.len()
            );
        });
        let line = &lines[0];
        assert_eq!(line["errors"], serde_json::json!(errors), "{line}");
        assert!(line["wrapped"].is_string(), "{line}");
        assert_eq!(line["count"], 2);
        assert_eq!(line["ok"], false);
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["message"], "reload failed: 2");
        assert_eq!(line["event"], "config_reload_failed");
        assert!(line["timestamp"].is_string());
        assert!(line["target"].as_str().unwrap().starts_with("tollgate"));
    }

    #[test]
    fn events_in_spans_name_them() {
        let lines = lines(|| {
            let _outer = tracing::info_span!("outer").entered();
            tracing::info!("inside");
        });
        assert_eq!(lines[0]["spans"], serde_json::json!(["outer"]));
    }
}
