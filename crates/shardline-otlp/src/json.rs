//! OTLP's JSON encoding of spans (`ExportTraceServiceRequest`): ids in hex, times in
//! nanoseconds since the epoch as decimal strings, attributes as key and string value.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::layer::Exported;

/// OTLP's span kind of an `otel.kind` field's value (the names the OpenTelemetry bridges of
/// `tracing` read, which Shardline's spans set: the caller of an ask a client, of a tell a
/// producer, the entity a server for an ask and a consumer for a tell); internal otherwise.
pub(crate) fn kind(otel_kind: &str) -> u8 {
    match otel_kind {
        "server" => 2,
        "client" => 3,
        "producer" => 4,
        "consumer" => 5,
        _ => 1,
    }
}

fn nanos(t: SystemTime) -> String {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()).to_string()
}

fn attribute(key: &str, value: &str) -> Value {
    json!({ "key": key, "value": { "stringValue": value } })
}

fn span(s: &Exported) -> Value {
    let mut v = json!({
        "traceId": s.trace_id,
        "spanId": s.span_id,
        "name": s.name,
        "kind": s.kind,
        "startTimeUnixNano": nanos(s.start),
        "endTimeUnixNano": nanos(s.end),
        "attributes": s.attributes.iter().map(|(k, v)| attribute(k, v)).collect::<Vec<_>>(),
    });
    if let Some(p) = &s.parent_id {
        v["parentSpanId"] = json!(p);
    }
    v
}

/// The request body for `spans` of `service`.
pub(crate) fn traces(service: &str, spans: &[Exported]) -> String {
    json!({
        "resourceSpans": [{
            "resource": { "attributes": [attribute("service.name", service)] },
            "scopeSpans": [{
                "scope": { "name": "shardline", "version": env!("CARGO_PKG_VERSION") },
                "spans": spans.iter().map(span).collect::<Vec<_>>(),
            }],
        }],
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_is_encoded_as_otlp_json_says() {
        let t = UNIX_EPOCH + std::time::Duration::from_nanos(1_700_000_000_123_456_789);
        let s = Exported {
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            span_id: "00f067aa0ba902b7".into(),
            parent_id: Some("1111111111111111".into()),
            name: "handle",
            kind: kind("server"),
            start: t,
            end: t + std::time::Duration::from_micros(5),
            attributes: vec![("entity", "acct-1".into())],
        };
        let v: Value = serde_json::from_str(&traces("accounts", &[s])).unwrap();
        let rs = &v["resourceSpans"][0];
        assert_eq!(rs["resource"]["attributes"][0]["value"]["stringValue"], "accounts");
        let span = &rs["scopeSpans"][0]["spans"][0];
        assert_eq!(span["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(span["parentSpanId"], "1111111111111111");
        assert_eq!(span["kind"], 2);
        assert_eq!(span["startTimeUnixNano"], "1700000000123456789");
        assert_eq!(span["endTimeUnixNano"], "1700000000123461789");
        assert_eq!(span["attributes"][0]["key"], "entity");
        let kinds = ["internal", "server", "client", "producer", "consumer", "anything"].map(kind);
        assert_eq!(kinds, [1, 2, 3, 4, 5, 1], "OTLP's SpanKind numbers");
    }
}
