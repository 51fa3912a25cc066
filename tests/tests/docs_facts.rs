//! The facts the docs quote that drift most easily, checked against where
//! they come from, so a change that makes one stale fails here:
//!
//! * flag defaults in the flag tables (README.md's proxy-server and
//!   proxy-agent tables, docs/nodeport-proxy.md's nodeport-proxy and
//!   tunnel-agent tables, docs/operations.md's "Defaults that differ")
//!   against what each binary's `--help` says its defaults are;
//! * exit statuses the docs state ("exits 1", "exit status 2") against what
//!   the binaries do: every such statement must be one this file checks;
//! * memory figures (KiB, MiB, GiB) quoted from RELIABILITY.md or
//!   BENCHMARKS.md in README.md, docs/ and the comments of deploy/'s
//!   manifests: a sentence that names RELIABILITY.md, BENCHMARKS.md or a
//!   benchmark row (P9, NPM, …) quotes only figures that file says (for a
//!   named row: that row or section). Derived figures are marked as such
//!   ("about", "~", "≈") and figures equal to a flag default of ours are
//!   configuration, not measurements; both are left alone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use go_compat::flags::{FlagError, FlagSet};

const BINARIES: [&str; 5] = [
    "proxy-server",
    "proxy-agent",
    "nodeport-proxy",
    "tunnel-agent",
    "lb-updater",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn flag_set(binary: &str) -> FlagSet {
    match binary {
        "proxy-server" => proxy_server::options::flags(),
        "proxy-agent" => proxy_agent::options::flags(),
        "nodeport-proxy" => nodeport_proxy::cli::flag_set(),
        "tunnel-agent" => tunnel_agent::cli::flag_set(),
        "lb-updater" => lb_updater::flags(),
        other => panic!("{other} is not one of ours"),
    }
}

/// (type, default) of every flag the binary's `--help` lists.
fn help_defaults(binary: &str) -> BTreeMap<String, (String, String)> {
    let out = std::process::Command::new(integration_tests::procs::binary(binary))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{binary} --help: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut flags = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        if let Some(decl) = line.strip_prefix("  ")
            && !decl.starts_with(' ')
        {
            let decl = decl.rsplit(", ").next().unwrap_or(decl);
            let mut words = decl.trim_start_matches('-').split(' ');
            let name = words.next().unwrap_or_default().to_string();
            let ty = words.next().unwrap_or("bool").to_string();
            current = Some((name, ty));
        } else if let Some((name, ty)) = current.take()
            && let Some(i) = line.rfind("(default ")
        {
            let default = line[i + 9..].trim_end_matches(')').to_string();
            flags.insert(name, (ty, default));
        }
    }
    assert!(flags.len() > 3, "{binary} --help: {text}");
    flags
}

// ------------------------------------------------------------ flag defaults

/// The table rows (cells, trimmed) under a heading matching `heading`,
/// up to the next heading of that level or above.
fn table_rows(text: &str, heading: &str) -> Vec<(usize, Vec<String>)> {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let mut on = false;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with('#') {
            let l = line.chars().take_while(|c| *c == '#').count();
            if line.starts_with(heading) {
                on = true;
            } else if l <= level {
                on = false;
            }
            continue;
        }
        if on && line.starts_with('|') && !line.starts_with("|---") {
            let cells = line
                .trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect();
            rows.push((i + 1, cells));
        }
    }
    rows
}

/// Flag names in backticks in a cell (`--flag`, `-flag`); an abbreviation
/// such as `-interval` after `-downstream-tcp-keepalive-time` is expanded.
fn cell_flags(cell: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (i, part) in cell.split('`').enumerate() {
        if i % 2 == 0 || !part.starts_with('-') || part.contains(' ') || part.contains('=') {
            continue;
        }
        let name = part.trim_start_matches('-').to_string();
        if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
            continue;
        }
        out.push(name);
    }
    out
}

fn expand(
    name: &str,
    previous: Option<&String>,
    known: &BTreeMap<String, (String, String)>,
) -> String {
    if known.contains_key(name) {
        return name.to_string();
    }
    if let Some(prev) = previous
        && let Some((stem, _)) = prev.rsplit_once('-')
    {
        let full = format!("{stem}-{name}");
        if known.contains_key(&full) {
            return full;
        }
    }
    name.to_string()
}

fn strip_bold(s: &str) -> String {
    s.replace("**", "")
}

/// The leading number of a cell (`10000`, `10,000`, `128 MiB`), in units.
fn leading_number(text: &str) -> Option<f64> {
    let t = text.trim_start();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == ',' || c == '_' || c == '.'))
        .unwrap_or(t.len());
    if end == 0 {
        return None;
    }
    let n: f64 = t[..end].replace([',', '_'], "").parse().ok()?;
    let rest = t[end..].trim_start();
    let unit = [("KiB", 1024.0), ("MiB", 1048576.0), ("GiB", 1073741824.0)]
        .iter()
        .find(|(u, _)| rest.starts_with(u))
        .map_or(1.0, |(_, m)| *m);
    Some(n * unit)
}

fn leading_duration(text: &str) -> Option<Duration> {
    let t = text.trim_start();
    let end = t
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == 'µ'))
        .unwrap_or(t.len());
    go_compat::duration::parse(&t[..end]).ok()
}

/// Whether the documented default `text` of `flag` is the binary's. `None`:
/// the text is prose, not a value of the flag's type, and is left alone.
fn same_default(ty: &str, default: &str, text: &str) -> Option<bool> {
    let text = strip_bold(text);
    let text = text.trim();
    match ty {
        "duration" => {
            let doc = leading_duration(text)?;
            Some(go_compat::duration::parse(default).ok() == Some(doc))
        }
        "int" | "float" => {
            let doc = leading_number(text)?;
            Some(default.parse::<f64>().ok() == Some(doc))
        }
        "bool" => {
            let word = text.split([' ', ',']).next()?;
            matches!(word, "true" | "false").then(|| word == default)
        }
        "string" => {
            let default = default.trim_matches('"');
            let doc = if text.starts_with("\"\"") || text.split([' ', ',']).next() == Some("all") {
                String::new()
            } else if let Some(rest) = text.strip_prefix('`') {
                rest.split('`').next()?.to_string()
            } else if !text.is_empty() && !text.contains(' ') {
                text.to_string()
            } else {
                return None;
            };
            Some(doc == default)
        }
        "strings" => text.starts_with("[]").then(|| default == "[]"),
        _ => None,
    }
}

/// One table: rows under `heading` of `file`, flags in column `flags`,
/// defaults in column `defaults`, for the binaries `which` names.
fn check_table(
    file: &str,
    heading: &str,
    flags_col: usize,
    defaults_col: usize,
    which: &dyn Fn(&[String]) -> Vec<String>,
    helps: &BTreeMap<&str, BTreeMap<String, (String, String)>>,
    problems: &mut Vec<String>,
) -> usize {
    let text = read(file);
    let rows = table_rows(&text, heading);
    assert!(!rows.is_empty(), "{file}: no table under {heading:?}");
    let mut checked = 0;
    for (line, cells) in rows {
        let (Some(fcell), Some(dcell)) = (cells.get(flags_col), cells.get(defaults_col)) else {
            continue;
        };
        let names = cell_flags(fcell);
        if names.is_empty() {
            continue;
        }
        let parts: Vec<&str> = dcell.split(", ").flat_map(|p| p.split(" / ")).collect();
        for binary in which(&cells) {
            let help = &helps[binary.as_str()];
            let mut previous = None;
            let mut full = Vec::new();
            for n in &names {
                let f = expand(n, previous, help);
                full.push(f);
                previous = full.last();
            }
            let pairs: Vec<(&String, &str)> = if parts.len() == full.len() {
                full.iter().zip(parts.iter().copied()).collect()
            } else if full.len() == 1 {
                vec![(&full[0], parts[0])]
            } else {
                Vec::new()
            };
            for f in &full {
                if !help.contains_key(f)
                    && matches!(
                        flag_set(&binary).parse([format!("--{f}")]),
                        Err(FlagError::Unknown(_))
                    )
                {
                    problems.push(format!("{file}:{line}: {binary} has no flag -{f}"));
                }
            }
            for (f, text) in pairs {
                let Some((ty, default)) = help.get(f) else {
                    continue;
                };
                match same_default(ty, default, text) {
                    Some(true) => checked += 1,
                    Some(false) => problems.push(format!(
                        "{file}:{line}: {binary} -{f}: the docs say {text:?}, --help says {default}"
                    )),
                    None => {}
                }
            }
        }
    }
    checked
}

#[test]
fn flag_defaults_in_the_docs_are_the_binaries() {
    let helps: BTreeMap<&str, _> = BINARIES.iter().map(|b| (*b, help_defaults(b))).collect();
    let one = |b: &'static str| move |_: &[String]| vec![b.to_string()];
    let named = |cells: &[String]| -> Vec<String> {
        cells[0]
            .split(',')
            .map(str::trim)
            .filter(|b| BINARIES.contains(b))
            .map(String::from)
            .collect()
    };
    let mut problems = Vec::new();
    let mut checked = 0;
    for (file, heading, binary) in [
        ("README.md", "## proxy-server flags", "proxy-server"),
        ("README.md", "## proxy-agent flags", "proxy-agent"),
        (
            "docs/nodeport-proxy.md",
            "## nodeport-proxy flags",
            "nodeport-proxy",
        ),
        ("docs/nodeport-proxy.md", "## tunnel-agent", "tunnel-agent"),
    ] {
        checked += check_table(file, heading, 0, 1, &one(binary), &helps, &mut problems);
    }
    checked += check_table(
        "docs/operations.md",
        "## Defaults that differ",
        1,
        2,
        &named,
        &helps,
        &mut problems,
    );
    assert!(
        problems.is_empty(),
        "flag defaults in the docs that are not the binaries' (fix the docs or the flag):\n{}",
        problems.join("\n")
    );
    assert!(checked > 100, "only {checked} documented defaults checked");
}

#[test]
fn the_default_checker_tells_values_from_prose() {
    assert_eq!(
        same_default("duration", "1h0m0s", "**1h** (upstream: 0)"),
        Some(true)
    );
    assert_eq!(same_default("duration", "15s", "30s"), Some(false));
    assert_eq!(same_default("int", "134217728", "128 MiB"), Some(true));
    assert_eq!(same_default("int", "10000", "10,000"), Some(true));
    assert_eq!(same_default("int", "8092", "8093"), Some(false));
    assert_eq!(same_default("string", "\"\"", "all"), Some(true));
    assert_eq!(same_default("string", "\"grpc\"", "`grpc`"), Some(true));
    assert_eq!(same_default("string", "\"127.0.0.1\"", "::"), Some(false));
    assert_eq!(
        same_default("string", "\"x\"", "env `X`, else a UUID"),
        None
    );
    assert_eq!(same_default("duration", "1s", "accepted, no effect"), None);
    assert_eq!(same_default("bool", "false", "true"), Some(false));
}

// ------------------------------------------------------------ exit statuses

/// Collapses runs of whitespace (a statement may wrap lines).
fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Byte offsets of "exit N", "exits N", "exit status N" in `text`.
fn exit_statements(text: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("exit") {
        if text[..i].ends_with(|c: char| c.is_ascii_alphanumeric()) {
            continue;
        }
        let rest = &text[i + 4..];
        let rest = rest.strip_prefix('s').unwrap_or(rest);
        let rest = rest.strip_prefix(" status").unwrap_or(rest);
        if rest
            .strip_prefix(' ')
            .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        {
            out.push(i);
        }
    }
    out
}

fn exit_code(binary: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(integration_tests::procs::binary(binary))
        .args(args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What a bad flag makes each binary exit with.
fn bad_flag(binary: &str) -> Option<i32> {
    exit_code(binary, &["--no-such-flag"]).0
}

/// proxy-server on a Unix socket, stopped with SIGTERM: its exit status,
/// and whether the socket is gone.
fn sigterm_exit() -> (Option<i32>, bool) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let pki = integration_tests::certs::Pki::new();
        let dir = tempfile::tempdir().unwrap();
        let (mut server, sock, _) =
            integration_tests::procs::server_on_socket(&pki, dir.path(), &[]).await;
        server.signal(15);
        let code = server.wait_exit().await;
        (code, !sock.exists())
    })
}

#[test]
fn exit_statuses_in_the_docs_are_the_binaries() {
    type Check = fn() -> Result<(), String>;
    fn statuses(binaries: &[&str], want: i32) -> Result<(), String> {
        for b in binaries {
            let got = bad_flag(b);
            if got != Some(want) {
                return Err(format!("{b} exits {got:?} on a bad flag"));
            }
        }
        Ok(())
    }
    fn ours_1() -> Result<(), String> {
        statuses(&["proxy-server", "proxy-agent"], 1)
    }
    fn kkp_2() -> Result<(), String> {
        statuses(&["nodeport-proxy", "tunnel-agent", "lb-updater"], 2)
    }
    fn both() -> Result<(), String> {
        ours_1().and(kkp_2())
    }
    fn no_source() -> Result<(), String> {
        let (code, err) = exit_code("nodeport-proxy", &[]);
        match code == Some(2) && err.contains("-config=FILE") && err.contains("-kubeconfig") {
            true => Ok(()),
            false => Err(format!("nodeport-proxy without a source: {code:?} {err}")),
        }
    }
    fn sigterm_0() -> Result<(), String> {
        match sigterm_exit() {
            (Some(0), true) => Ok(()),
            other => Err(format!(
                "proxy-server after SIGTERM: {other:?} (exit, socket gone)"
            )),
        }
    }
    fn validate_mode() -> Result<(), String> {
        let good = repo().join("tunnel-agent/testdata/kkp-envoy-agent.yaml");
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.yaml");
        let text = std::fs::read_to_string(&good).unwrap();
        std::fs::write(
            &bad,
            text.replacen("admin:", "admin:\n  no_such_field: 1", 1),
        )
        .unwrap();
        let validate = |f: &Path| {
            let out = std::process::Command::new(integration_tests::procs::binary("tunnel-agent"))
                .args(["--mode", "validate", "-c"])
                .arg(f)
                .output()
                .unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        };
        match (validate(&good), validate(&bad)) {
            ((Some(0), ok), (Some(1), _)) if ok.contains("OK") => Ok(()),
            other => Err(format!(
                "tunnel-agent --mode validate on a good and a bad file: {other:?}"
            )),
        }
    }
    // (file, a statement as it reads there, whitespace collapsed; what checks it)
    let claims: [(&str, &str, Check); 10] = [
        (
            "README.md",
            "prints the reason and exits 1, as upstream's commands do",
            ours_1,
        ),
        (
            "README.md",
            "nodeport-proxy, tunnel-agent and lb-updater exit 2",
            kkp_2,
        ),
        ("README.md", "remove the socket, exit 0", sigterm_0),
        (
            "docs/compatibility.md",
            "new dials fail `streamsetup`, exit 0)",
            sigterm_0,
        ),
        (
            "docs/operations.md",
            "exit status 1 for proxy-server and proxy-agent, 2 for the KKP binaries",
            both,
        ),
        (
            "docs/operations.md",
            "the socket is removed, exit 0",
            sigterm_0,
        ),
        (
            "docs/operations.md",
            "one of `-config`/`-kubeconfig` is required (exit 2 otherwise)",
            no_source,
        ),
        (
            "docs/nodeport-proxy.md",
            "the binary exits 2 naming the flags and opens no listener",
            no_source,
        ),
        (
            "docs/nodeport-proxy.md",
            "prints `configuration '<file>' OK` and exits 0, or prints the error and exits 1",
            validate_mode,
        ),
        (
            "docs/operations.md",
            "print `configuration '<file>' OK` and exit 0, else exit 1",
            validate_mode,
        ),
    ];
    let mut files: BTreeSet<String> = ["README.md".to_string()].into();
    for entry in std::fs::read_dir(repo().join("docs")).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "md") {
            files.insert(format!("docs/{}", p.file_name().unwrap().to_string_lossy()));
        }
    }
    let mut problems = Vec::new();
    for file in &files {
        let text = flat(&read(file));
        let spans: Vec<(usize, usize)> = claims
            .iter()
            .filter(|(f, _, _)| f == file)
            .filter_map(|(_, s, _)| text.find(s).map(|i| (i, i + s.len())))
            .collect();
        for at in exit_statements(&text) {
            if !spans.iter().any(|(a, b)| (*a..*b).contains(&at)) {
                let end = (at + 80).min(text.len());
                let end = (end..text.len())
                    .find(|i| text.is_char_boundary(*i))
                    .unwrap_or(text.len());
                problems.push(format!(
                    "{file}: \"…{}…\" states an exit status this test does not check: add it to `claims`",
                    &text[at..end]
                ));
            }
        }
    }
    for (file, statement, check) in claims {
        if !flat(&read(file)).contains(statement) {
            problems.push(format!(
                "{file} no longer says {statement:?}: update `claims`"
            ));
        } else if let Err(e) = check() {
            problems.push(format!("{file} says {statement:?}, but {e}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ------------------------------------------------------------ figures

const CITED: [&str; 2] = ["RELIABILITY.md", "BENCHMARKS.md"];

/// A figure with its unit (`MiB`, `KiB/s`, …) as written, commas dropped.
type Figure = (String, String);

/// The figures of `text`; with `skip_derived`, those marked as derived
/// ("about", "~", "≈" just before) are left out.
fn figures(text: &str, skip_derived: bool) -> Vec<Figure> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let is_num = |c: u8| c.is_ascii_digit() || c == b',' || c == b'.';
    while i < b.len() {
        let starts = b[i].is_ascii_digit()
            && (i == 0
                || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'.' || b[i - 1] == b','));
        if !starts {
            i += 1;
            continue;
        }
        let number = |from: usize| {
            let mut j = from;
            while j < b.len() && is_num(b[j]) {
                j += 1;
            }
            // A trailing comma or dot ends the sentence, not the number.
            while j > from && matches!(b[j - 1], b',' | b'.') {
                j -= 1;
            }
            j
        };
        let a_end = number(i);
        let mut nums = vec![(i, a_end)];
        let mut j = a_end;
        // A range: "52-57", "59.8–64.6".
        let after = &text[j..];
        let dash = ["-", "–", " – ", " - "]
            .iter()
            .find(|d| after.starts_with(**d));
        if let Some(d) = dash {
            let k = j + d.len();
            if k < b.len() && b[k].is_ascii_digit() {
                let e = number(k);
                nums.push((k, e));
                j = e;
            }
        }
        let rest = &text[j..];
        let rest = rest.strip_prefix(' ').unwrap_or(rest);
        let unit = ["KiB", "MiB", "GiB"].iter().find(|u| rest.starts_with(**u));
        if let Some(u) = unit {
            let tail = &rest[3..];
            let rate = tail.starts_with("/s");
            let tail = if rate { &tail[2..] } else { tail };
            if !tail.starts_with(|c: char| c.is_ascii_alphanumeric()) {
                let before = text[..i].trim_end();
                let derived = ["~", "≈", "about", "around", "roughly", "nearly"]
                    .iter()
                    .any(|m| before.ends_with(m));
                if !(skip_derived && derived) {
                    let unit = if rate {
                        format!("{u}/s")
                    } else {
                        u.to_string()
                    };
                    for (s, e) in nums {
                        out.push((text[s..e].replace(',', ""), unit.clone()));
                    }
                }
            }
        }
        i = j.max(i + 1);
    }
    out
}

/// Benchmark rows a sentence names (P9, NP, NPM).
fn row_ids(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| {
            *w == "NP"
                || *w == "NPM"
                || (w.len() > 1 && w.starts_with('P') && w[1..].chars().all(|c| c.is_ascii_digit()))
        })
        .map(String::from)
        .collect()
}

/// What BENCHMARKS.md says under one row id: its table rows and its
/// section, if it has one.
fn row_text(benchmarks: &str, id: &str) -> String {
    let mut out = String::new();
    let mut on = false;
    let row = format!("| {id} |");
    for line in benchmarks.lines() {
        if line.starts_with('#') {
            let title = line.trim_start_matches('#').trim_start();
            on = title
                .strip_prefix(id)
                .is_some_and(|r| !r.starts_with(|c: char| c.is_ascii_alphanumeric()));
            continue;
        }
        if on || line.starts_with(&row) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Whether `text` says `figure`: with its unit; or, in a benchmark's table
/// cells (which carry their unit in the header), a precise number alone.
fn says(text: &str, figure: &Figure, cells_too: bool) -> bool {
    if figures(text, false).contains(figure) {
        return true;
    }
    let (n, _) = figure;
    cells_too
        && n.contains('.')
        && text
            .replace(',', "")
            .match_indices(n.as_str())
            .any(|(i, _)| {
                let t = text.replace(',', "");
                let before = t[..i].chars().next_back();
                let after = t[i + n.len()..].chars().next();
                !before.is_some_and(|c| c.is_ascii_digit() || c == '.')
                    && !after.is_some_and(|c| c.is_ascii_digit())
            })
}

/// Sentences of `text`: split after ". " (not after a number's dot).
fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut start = 0;
    let b = text.as_bytes();
    for (i, _) in text.match_indices(". ") {
        if i > 0 && !b[i - 1].is_ascii_digit() {
            out.push(text[start..i + 1].to_string());
            start = i + 2;
        }
    }
    out.push(text[start..].to_string());
    out
}

/// The prose blocks of a Markdown file (paragraphs, list items, each
/// table cell; code blocks left out) or of a manifest's comments.
fn blocks(path: &str, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    let flush = |current: &mut Vec<&str>, out: &mut Vec<String>| {
        if !current.is_empty() {
            out.push(current.join(" "));
            current.clear();
        }
    };
    if path.ends_with(".yaml") || path.ends_with(".sh") {
        for line in text.lines() {
            match line.trim_start().strip_prefix('#') {
                Some(c) => current.push(c.trim()),
                None => flush(&mut current, &mut out),
            }
        }
        flush(&mut current, &mut out);
        return out;
    }
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            flush(&mut current, &mut out);
            continue;
        }
        if fenced {
            continue;
        }
        let t = line.trim_start();
        let item = t.starts_with("* ")
            || t.starts_with("- ")
            || t.split_once(". ")
                .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if t.is_empty() || t.starts_with('#') || t.starts_with('|') || item {
            flush(&mut current, &mut out);
        }
        if t.starts_with('|') {
            out.extend(t.trim_matches('|').split('|').map(|c| c.trim().to_string()));
        } else if !t.is_empty() && !t.starts_with('#') {
            current.push(t);
        }
    }
    flush(&mut current, &mut out);
    out
}

/// Every figure `sentence` quotes from RELIABILITY.md or BENCHMARKS.md
/// that the file (or the named benchmark row) does not say.
fn unsupported(
    sentence: &str,
    cited: &BTreeMap<&str, String>,
    defaults: &BTreeSet<u64>,
) -> Vec<Figure> {
    let ids = row_ids(sentence);
    let mut sources: Vec<&str> = CITED
        .iter()
        .copied()
        .filter(|f| sentence.contains(f))
        .collect();
    if !ids.is_empty() && !sources.contains(&"BENCHMARKS.md") {
        sources.push("BENCHMARKS.md");
    }
    if sources.is_empty() {
        return Vec::new();
    }
    let bytes = |(n, u): &Figure| -> Option<u64> {
        let m = match u.as_str() {
            "KiB" => 1u64 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            _ => return None,
        };
        let v: f64 = n.parse().ok()?;
        let b = v * m as f64;
        (b.fract() == 0.0).then_some(b as u64)
    };
    figures(sentence, true)
        .into_iter()
        .filter(|f| !bytes(f).is_some_and(|b| defaults.contains(&b)))
        .filter(|f| {
            !sources.iter().any(|s| {
                if *s == "BENCHMARKS.md" && !ids.is_empty() {
                    ids.iter().any(|id| says(&row_text(&cited[s], id), f, true))
                } else {
                    says(&cited[s], f, false)
                }
            })
        })
        .collect()
}

fn quoting_files() -> Vec<String> {
    let mut files = vec!["README.md".to_string()];
    let mut dirs = vec![repo().join("docs"), repo().join("deploy")];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p
                .extension()
                .is_some_and(|e| e == "md" || e == "yaml" || e == "sh")
            {
                files.push(p.strip_prefix(repo()).unwrap().display().to_string());
            }
        }
    }
    files.sort();
    files
}

/// Every byte count a flag of ours defaults to (configuration, not a
/// measurement, wherever it is quoted).
fn byte_defaults() -> BTreeSet<u64> {
    BINARIES
        .iter()
        .flat_map(|b| help_defaults(b).into_values())
        .filter(|(ty, _)| ty == "int")
        .filter_map(|(_, d)| d.parse().ok())
        .collect()
}

#[test]
fn figures_quoted_from_reliability_and_benchmarks_are_theirs() {
    let cited: BTreeMap<&str, String> = CITED.iter().map(|f| (*f, read(f))).collect();
    let defaults = byte_defaults();
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in quoting_files() {
        let text = read(&file);
        for block in blocks(&file, &text) {
            for sentence in sentences(&block) {
                if CITED.iter().any(|f| sentence.contains(f)) || !row_ids(&sentence).is_empty() {
                    checked += figures(&sentence, true).len();
                }
                for (n, u) in unsupported(&sentence, &cited, &defaults) {
                    problems.push(format!("{file}: {n} {u} in \"{sentence}\""));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "figures that cite RELIABILITY.md or BENCHMARKS.md (or a benchmark row) but are not there; \
         update them from the current files, or mark a derived one \"about\":\n{}",
        problems.join("\n")
    );
    assert!(checked > 50, "only {checked} quoted figures checked");
}

#[test]
fn the_figure_checker_finds_a_stale_figure() {
    let cited: BTreeMap<&str, String> = [
        ("RELIABILITY.md", "| memory | peak | 346.3 MiB |\n".to_string()),
        (
            "BENCHMARKS.md",
            "| P9 | proxy-server idle RSS | 12.7 MiB |\n| P7 | x | 1 | 2 | 11.5 / 15.4 |\n### NPM: per connection\n7.9 KiB NodePort\n".to_string(),
        ),
    ]
    .into();
    let defaults: BTreeSet<u64> = [128 << 20].into();
    let bad = |s: &str| unsupported(s, &cited, &defaults);
    assert!(bad("idle RSS 12.7 MiB (P9), 346.3 MiB peak (RELIABILITY.md)").is_empty());
    assert_eq!(
        bad("idle RSS 9.2 MiB (P9)"),
        vec![("9.2".into(), "MiB".into())]
    );
    assert_eq!(
        bad("peak 321 MiB (RELIABILITY.md)"),
        vec![("321".into(), "MiB".into())]
    );
    // A named row's figure must come from that row, not anywhere.
    assert_eq!(
        bad("7.9 KiB per connection (P9)"),
        vec![("7.9".into(), "KiB".into())]
    );
    assert!(bad("7.9 KiB per connection (NPM)").is_empty());
    assert!(
        bad("peaks of 11.5 MiB (P7)").is_empty(),
        "a table cell's number"
    );
    assert!(
        bad("about 460 MiB in all (BENCHMARKS.md)").is_empty(),
        "derived"
    );
    assert!(
        bad("the budget (128 MiB) beside it (P9)").is_empty(),
        "a flag default"
    );
    assert!(bad("a sentence citing nothing: 9.2 MiB").is_empty());
    assert_eq!(
        figures("peaks of 59.8–64.6 MiB, 5,000 x 1 GiB/s, 8.0 KiB.", false),
        vec![
            ("59.8".into(), "MiB".into()),
            ("64.6".into(), "MiB".into()),
            ("1".into(), "GiB/s".into()),
            ("8.0".into(), "KiB".into()),
        ]
    );
}
