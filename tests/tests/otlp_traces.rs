//! `--otlp-traces-endpoint` (issue 38.4): one span per dial on the server
//! and one on the agent, the agent's a child of the server's, sent over
//! OTLP/HTTP to two real receivers, each test run against both: the
//! OpenTelemetry collector's own OTLP receiver
//! (tests/otlpcollector, go.opentelemetry.io/collector/receiver/otlpreceiver,
//! with a consumer that prints the spans it is handed) and one built from
//! the protocol's generated Go types (tests/otlpreceiver,
//! go.opentelemetry.io/proto/otlp). Both print each span as a JSON line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::PathBuf;

use integration_tests::certs::Pki;
use integration_tests::client::{grpc_dial, grpc_dial_with, open_stream};
use integration_tests::dest;
use integration_tests::konnectivity::{
    AgentOpts, ServerOpts, http_get, init_logging, start_agent, start_server,
};
use integration_tests::procs::Proc;
use konnectivity_proto::packet::Payload;
use konnectivity_proto::{Packet, PacketExt};
use serde_json::Value;

/// The receivers (Go programs under tests/) every test runs against.
const RECEIVERS: [&str; 2] = ["otlpcollector", "otlpreceiver"];

/// Builds tests/`name` and starts it; returns it and its address.
async fn receiver(dir: &std::path::Path, name: &str) -> (Proc, String) {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(name);
    let bin = dir.join(name);
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
        "go build {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut p = Proc::spawn_path(&bin, &[]);
    let l = p.wait_line("listening ").await;
    let addr = l.trim().trim_start_matches("listening ").to_string();
    (p, addr)
}

/// The next `n` spans the receiver printed, by service and close cause.
async fn spans(p: &mut Proc, n: usize) -> HashMap<(String, String), Value> {
    let mut out = HashMap::new();
    while out.len() < n {
        let l = p.wait_line("\"trace_id\"").await;
        let v: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"));
        let key = (
            v["service"].as_str().unwrap().to_string(),
            v["attributes"]["konnectivity.close_cause"]
                .as_str()
                .unwrap()
                .to_string(),
        );
        out.insert(key, v);
    }
    out
}

fn span<'a>(got: &'a HashMap<(String, String), Value>, service: &str, cause: &str) -> &'a Value {
    got.get(&(service.to_string(), cause.to_string()))
        .unwrap_or_else(|| panic!("no {service} span closed as {cause}: {got:#?}"))
}

#[tokio::test]
async fn each_dial_is_a_span_that_joins_the_callers_trace() {
    for name in RECEIVERS {
        one_trace_from_frontend_to_agent(name).await;
    }
}

async fn one_trace_from_frontend_to_agent(name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (mut rx, addr) = receiver(dir.path(), name).await;
    init_logging();
    let pki = Pki::new();
    let server = start_server(
        &pki,
        ServerOpts {
            otlp_traces: Some(format!("http://{addr}")),
            ..Default::default()
        },
    )
    .await;
    let agent = start_agent(
        &pki,
        server.agent_addr,
        AgentOpts {
            otlp_traces: Some(format!("http://{addr}")),
            ..Default::default()
        },
    )
    .await;
    agent.handle.wait_connected(1).await;
    server.handle.wait_for_agents(1).await;
    let echo = dest::echo().await;
    let mut t = grpc_dial_with(
        &server.frontend,
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
    let (_, listing) = http_get(server.admin_addr, "/debug/connections").await;
    let listing: Value = serde_json::from_str(&listing).unwrap();
    let agent_id = listing["live"][0]["upstream"].as_str().unwrap().to_string();
    let dial_id = t.dial_id.to_string();
    assert_eq!(t.close().await.as_deref(), Some(""));
    let (_keep, refused) = dest::refused();
    grpc_dial(&server.frontend, &refused.to_string())
        .await
        .err()
        .unwrap();

    // Two dials: a span each on the server and on the agent.
    let got = spans(&mut rx, 4).await;
    let ok = span(&got, "proxy-server", "client_closed");
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

    let failed = span(&got, "proxy-server", "dial_failed");
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

    // The agent's spans: children of the server's (its DIAL_REQ carries
    // the server span's traceparent), so with the frontend's traceparent
    // all three are one trace; the dial id names them too.
    let a_ok = span(&got, "proxy-agent", "client_closed");
    assert_eq!(a_ok["name"], "konnectivity.agent.dial");
    assert_eq!(
        a_ok["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736",
        "{a_ok:#}"
    );
    assert_eq!(a_ok["parent_span_id"], ok["span_id"], "{a_ok:#}");
    assert_ne!(a_ok["span_id"], ok["span_id"]);
    assert_eq!(
        a_ok["attributes"]["konnectivity.dial_id"],
        dial_id.as_str(),
        "{a_ok:#}"
    );
    assert_eq!(
        a_ok["attributes"]["network.peer.address"],
        echo.to_string().as_str()
    );
    assert!(a_ok["attributes"]["konnectivity.dial_duration_ns"].is_string());
    assert_eq!(
        a_ok["attributes"]["konnectivity.close_reason"],
        "closed by the server (CLOSE_REQ)"
    );
    let a_failed = span(&got, "proxy-agent", "dial_failed");
    assert_eq!(a_failed["status"], "STATUS_CODE_ERROR");
    // Without a frontend's traceparent: the server's new trace.
    assert_eq!(a_failed["trace_id"], failed["trace_id"], "{a_failed:#}");
    assert_eq!(
        a_failed["parent_span_id"], failed["span_id"],
        "{a_failed:#}"
    );
    assert_eq!(
        a_failed["attributes"]["konnectivity.dial_id"],
        failed["attributes"]["konnectivity.dial_id"]
    );
    drop(agent);
}

/// The trace context goes to the agent only when the server traces the
/// dial, and a frontend cannot set it: with tracing off on the server, a
/// DIAL_REQ whose frontend filled the extension field in reaches the agent
/// without it, and the agent's span starts a trace of its own.
#[tokio::test]
async fn only_a_tracing_server_gives_the_agent_a_parent() {
    for name in RECEIVERS {
        no_parent_from_a_server_not_tracing(name).await;
    }
}

async fn no_parent_from_a_server_not_tracing(name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (mut rx, addr) = receiver(dir.path(), name).await;
    init_logging();
    let pki = Pki::new();
    let server = start_server(&pki, ServerOpts::default()).await;
    let agent = start_agent(
        &pki,
        server.agent_addr,
        AgentOpts {
            otlp_traces: Some(format!("http://{addr}")),
            ..Default::default()
        },
    )
    .await;
    agent.handle.wait_connected(1).await;
    server.handle.wait_for_agents(1).await;
    let echo = dest::echo().await;
    let (tx, mut inbound) = open_stream(&server.frontend).await;
    let mut dial = Packet::dial_request("tcp", &echo.to_string(), 77);
    let forged = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    dial.set_traceparent(forged.into());
    tx.send(dial).await.unwrap();
    let connect = match inbound.message().await.unwrap() {
        Some(Packet {
            payload: Some(Payload::DialResponse(r)),
            ..
        }) if r.error.is_empty() => r.connect_id,
        other => panic!("want a DIAL_RSP: {other:?}"),
    };
    tx.send(Packet::close_request(connect)).await.unwrap();
    let got = spans(&mut rx, 1).await;
    let a = span(&got, "proxy-agent", "client_closed");
    assert_eq!(a["attributes"]["konnectivity.dial_id"], "77", "{a:#}");
    assert_eq!(a["parent_span_id"], "", "{a:#}");
    assert_ne!(a["trace_id"], "0af7651916cd43dd8448eb211c80319c", "{a:#}");
    drop(agent);
}
