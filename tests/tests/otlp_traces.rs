//! `--otlp-traces-endpoint` (issue 38.4): one span per dial, sent over
//! OTLP/HTTP to a real receiver built from the protocol's generated Go
//! types (tests/otlpreceiver, go.opentelemetry.io/proto/otlp), which decodes
//! each export request as a collector's receiver does and prints its spans.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::PathBuf;

use integration_tests::client::{grpc_dial, grpc_dial_with};
use integration_tests::dest;
use integration_tests::konnectivity::{ServerOpts, Stack, http_get};
use integration_tests::procs::Proc;
use serde_json::Value;

/// Builds tests/otlpreceiver and starts it; returns it and its address.
async fn receiver(dir: &std::path::Path) -> (Proc, String) {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("otlpreceiver");
    let bin = dir.join("otlpreceiver");
    let out = tokio::process::Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(".")
        .current_dir(&src)
        .output()
        .await
        .expect("go is needed (scripts/test requires it)");
    assert!(
        out.status.success(),
        "go build otlpreceiver: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut p = Proc::spawn_path(&bin, &[]);
    let l = p.wait_line("listening ").await;
    let addr = l.trim().trim_start_matches("listening ").to_string();
    (p, addr)
}

/// The next `n` spans the receiver printed, by close cause.
async fn spans(p: &mut Proc, n: usize) -> HashMap<String, Value> {
    let mut out = HashMap::new();
    while out.len() < n {
        let l = p.wait_line("\"trace_id\"").await;
        let v: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"));
        out.insert(
            v["attributes"]["konnectivity.close_cause"]
                .as_str()
                .unwrap()
                .to_string(),
            v,
        );
    }
    out
}

#[tokio::test]
async fn each_dial_is_a_span_that_joins_the_callers_trace() {
    let dir = tempfile::tempdir().unwrap();
    let (mut rx, addr) = receiver(dir.path()).await;
    let stack = Stack::start(ServerOpts {
        otlp_traces: Some(format!("http://{addr}")),
        ..Default::default()
    })
    .await;
    let echo = dest::echo().await;
    let mut t = grpc_dial_with(
        &stack.server.frontend,
        &echo.to_string(),
        &[(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )],
    )
    .await
    .unwrap();
    t.write(b"ping").await;
    assert_eq!(t.read_exact(4).await, b"ping");
    let (_, listing) = http_get(stack.server.admin_addr, "/debug/connections").await;
    let listing: Value = serde_json::from_str(&listing).unwrap();
    let agent_id = listing["live"][0]["upstream"].as_str().unwrap().to_string();
    let dial_id = t.dial_id.to_string();
    assert_eq!(t.close().await.as_deref(), Some(""));
    let (_keep, refused) = dest::refused();
    grpc_dial(&stack.server.frontend, &refused.to_string())
        .await
        .err()
        .unwrap();

    let got = spans(&mut rx, 2).await;
    let ok = &got["client_closed"];
    assert_eq!(ok["service"], "proxy-server", "{ok:#}");
    assert_eq!(ok["name"], "konnectivity.dial");
    assert_eq!(ok["kind"], "SPAN_KIND_SERVER");
    assert_eq!(ok["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736", "{ok:#}");
    assert_eq!(ok["parent_span_id"], "00f067aa0ba902b7", "{ok:#}");
    assert_eq!(ok["span_id"].as_str().unwrap().len(), 16);
    assert_eq!(ok["status"], "STATUS_CODE_UNSET");
    let a = &ok["attributes"];
    assert_eq!(a["konnectivity.agent_id"], agent_id.as_str(), "{ok:#}");
    assert_eq!(a["konnectivity.dial_id"], dial_id.as_str());
    assert_eq!(a["konnectivity.frontend"], "grpc");
    assert_eq!(a["server.address"], echo.to_string().as_str());
    // Timings: the dial answered, then the first byte back, in order.
    let dial: u64 = a["konnectivity.dial_duration_ns"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let first: u64 = a["konnectivity.first_byte_ns"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(dial <= first, "{ok:#}");
    assert!(ok["start_unix_nano"].as_u64().unwrap() <= ok["end_unix_nano"].as_u64().unwrap());

    let failed = &got["dial_failed"];
    assert_eq!(failed["status"], "STATUS_CODE_ERROR", "{failed:#}");
    assert_eq!(failed["parent_span_id"], "", "{failed:#}");
    let trace = failed["trace_id"].as_str().unwrap();
    assert_eq!(trace.len(), 32);
    assert_ne!(trace, "4bf92f3577b34da6a3ce929d0e0e4736");
    assert!(
        failed["attributes"]["konnectivity.close_reason"]
            .as_str()
            .unwrap()
            .contains("connection refused"),
        "{failed:#}"
    );
    assert!(
        failed["attributes"]
            .get("konnectivity.first_byte_ns")
            .is_none()
    );
}
