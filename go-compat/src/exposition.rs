//! The lines of client_golang's text exposition format 0.0.4 (`# HELP`,
//! `# TYPE`, samples), shared by the registry ([`crate::gometrics`]) and the
//! families computed at scrape time ([`crate::procstat`]).

use std::fmt::Write as _;

use crate::gofmt::go_float;

/// `# HELP` and `# TYPE` lines; HELP escaped as client_golang escapes it.
pub fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// One sample line; `le` goes after the series' own labels.
pub fn sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &[(&'static str, String)],
    le: Option<&str>,
    value: String,
) {
    out.push_str(name);
    out.push_str(suffix);
    let pairs = labels
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        .chain(le.map(|l| ("le", l)));
    let mut first = true;
    for (k, v) in pairs {
        out.push(if first { '{' } else { ',' });
        first = false;
        let v = v
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        let _ = write!(out, "{k}=\"{v}\"");
    }
    if !first {
        out.push('}');
    }
    out.push(' ');
    out.push_str(&value);
    out.push('\n');
}

/// A family computed at scrape time (the process collector's).
#[derive(Debug, Clone)]
pub struct ConstFamily {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: &'static str,
    pub value: f64,
}

impl ConstFamily {
    pub(crate) fn write(&self, out: &mut String) {
        header(out, self.name, self.help, self.kind);
        sample(out, self.name, "", &[], None, go_float(self.value));
    }
}
