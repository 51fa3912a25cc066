//! `--enable-profiling`: `/debug/pprof/` on the admin port, as upstream's Go
//! binaries serve it (net/http/pprof), for the profiles a Rust process has:
//! `/debug/pprof/profile?seconds=N` is a CPU profile (default 30 s) in
//! pprof's protobuf format, which `go tool pprof` reads; `/debug/pprof/`
//! lists what is served; everything else there is 404 "Unknown profile", as
//! Go answers for a name it does not know.
//!
//! Sampling is pprof-rs's (SIGPROF timer, stacks symbolized in process).
//! The profile is encoded here with prost from profile.proto's messages
//! because pprof-rs's own encoder needs `protoc` at build time and an older
//! prost; the mapping from samples to messages follows pprof-rs's.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;

use crate::endpoints::reply::Reply;

/// Samples per second, Go's `runtime.SetCPUProfileRate` default.
const FREQUENCY: i32 = 100;
/// Longest profile one request may ask for.
pub const MAX_SECONDS: u64 = 600;
/// What Go's handler uses when `seconds` is missing, zero or not a number.
const DEFAULT_SECONDS: u64 = 30;

/// profile.proto (github.com/google/pprof/proto/profile.proto), the fields
/// a CPU profile needs.
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
    }
}

/// The string table: index 0 is the empty string, as the format requires.
#[derive(Default)]
struct Strings {
    index: HashMap<String, i64>,
    table: Vec<String>,
}

impl Strings {
    fn new() -> Strings {
        let mut s = Strings::default();
        s.id("");
        s
    }

    fn id(&mut self, s: &str) -> i64 {
        if let Some(i) = self.index.get(s) {
            return *i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

fn encode(report: &pprof::Report) -> Vec<u8> {
    use prost::Message;
    let mut strings = Strings::new();
    let mut functions: HashMap<String, u64> = HashMap::new();
    let (mut function, mut location, mut sample) = (Vec::new(), Vec::new(), Vec::new());
    let period = 1_000_000_000 / i64::from(report.timing.frequency.max(1));
    let thread = strings.id("thread");
    for (frames, count) in &report.data {
        let mut locs = Vec::new();
        // Leaf first, as pprof-rs collects them and the format wants.
        for symbol in frames.frames.iter().flatten() {
            let name = symbol.name();
            let id = match functions.get(&name) {
                Some(id) => *id,
                None => {
                    let id = function.len() as u64 + 1;
                    function.push(proto::Function {
                        id,
                        name: strings.id(&name),
                        system_name: strings.id(&symbol.sys_name()),
                        filename: strings.id(&symbol.filename()),
                    });
                    location.push(proto::Location {
                        id,
                        line: vec![proto::Line {
                            function_id: id,
                            line: i64::from(symbol.lineno()),
                        }],
                    });
                    functions.insert(name, id);
                    id
                }
            };
            locs.push(id);
        }
        let count = *count as i64;
        sample.push(proto::Sample {
            location_id: locs,
            value: vec![count, count.saturating_mul(period)],
            label: vec![proto::Label {
                key: thread,
                str: strings.id(&frames.thread_name_or_id()),
            }],
        });
    }
    let samples = proto::ValueType {
        r#type: strings.id("samples"),
        unit: strings.id("count"),
    };
    let cpu = proto::ValueType {
        r#type: strings.id("cpu"),
        unit: strings.id("nanoseconds"),
    };
    let profile = proto::Profile {
        sample_type: vec![samples, cpu.clone()],
        sample,
        location,
        function,
        time_nanos: report
            .timing
            .start_time
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0),
        duration_nanos: report.timing.duration.as_nanos() as i64,
        period_type: Some(cpu),
        period,
        string_table: strings.table,
    };
    profile.encode_to_vec()
}

/// Samples every thread for `seconds` and returns the encoded profile.
/// One profile at a time, as Go allows.
pub async fn cpu_profile(seconds: u64) -> Result<Vec<u8>, String> {
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
        .map_err(|e| format!("Could not enable CPU profiling: {e}"))?;
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let report = tokio::task::spawn_blocking(move || {
        let r = guard.report().build();
        drop(guard);
        r
    })
    .await
    .map_err(|e| format!("Could not build the CPU profile: {e}"))?
    .map_err(|e| format!("Could not build the CPU profile: {e}"))?;
    Ok(encode(&report))
}

/// Answers a request under `/debug/pprof`.
pub async fn handle(path: &str, query: Option<&str>) -> Reply {
    match path {
        "/debug/pprof" => Reply::redirect("/debug/pprof/".into()),
        "/debug/pprof/" => Reply {
            status: StatusCode::OK,
            content_type: "text/html; charset=utf-8",
            body: Bytes::from_static(INDEX.as_bytes()),
            location: None,
            render: None,
        },
        "/debug/pprof/profile" => {
            let seconds = query
                .into_iter()
                .flat_map(|q| q.split('&'))
                .find_map(|kv| kv.strip_prefix("seconds="))
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|s| *s > 0)
                .unwrap_or(DEFAULT_SECONDS);
            if seconds > MAX_SECONDS {
                return Reply::text(
                    StatusCode::BAD_REQUEST,
                    format!("profile duration exceeds the server's limit of {MAX_SECONDS} s\n"),
                );
            }
            match cpu_profile(seconds).await {
                Ok(body) => Reply {
                    status: StatusCode::OK,
                    content_type: "application/octet-stream",
                    body: body.into(),
                    location: None,
                    render: None,
                },
                Err(e) => Reply::text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
            }
        }
        _ => Reply::text(StatusCode::NOT_FOUND, "Unknown profile\n"),
    }
}

const INDEX: &str = "<html>\n<head>\n<title>/debug/pprof/</title>\n</head>\n<body>\n/debug/pprof/\n<br>\n<p>Set debug=1 as a query parameter to export in legacy text format</p>\n<br>\nTypes of profiles available:\n<table>\n<thead><td>Count</td><td>Profile</td></thead>\n<tr><td></td><td><a href='profile'>profile</a></td></tr>\n</table>\n<br>\n<p>\nprofile: CPU profile. You can specify the duration in the seconds GET parameter. After you get the profile file, use the go tool pprof command to investigate the profile.\n</p>\n</body>\n</html>\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cpu_profile_is_a_pprof_cpu_profile_and_one_runs_at_a_time() {
        use prost::Message;
        // Samples of the real binaries are checked with `go tool pprof` in
        // tests/tests/flag_semantics.rs; here the encoding and the lock.
        let (a, b) = tokio::join!(cpu_profile(1), cpu_profile(1));
        let bytes = a.unwrap_or_default();
        assert!(
            b.is_err_and(|e| e.starts_with("Could not enable CPU profiling")),
            "a second profile while one runs"
        );
        let p = proto::Profile::decode(bytes.as_slice()).unwrap_or_default();
        assert_eq!(p.string_table.first().map(String::as_str), Some(""));
        let name = |i: i64| p.string_table.get(i as usize).cloned().unwrap_or_default();
        let types: Vec<String> = p.sample_type.iter().map(|t| name(t.r#type)).collect();
        assert_eq!(types, ["samples", "cpu"]);
        assert_eq!(p.period, 10_000_000);
        assert!(p.duration_nanos >= 1_000_000_000, "{}", p.duration_nanos);
        assert!(
            p.sample
                .iter()
                .all(|s| s.value.len() == 2 && s.value[1] == s.value[0] * p.period)
        );
        assert!(cpu_profile(1).await.is_ok(), "the lock is given back");
    }
}
