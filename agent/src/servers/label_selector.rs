//! Kubernetes label selectors as `--lease-label-selector` takes them
//! (upstream after v0.36.0, #868: apimachinery's `labels.Parse`):
//! `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a)`, `k`, `!k`, `k>1`,
//! `k<1`, comma-separated, all of them must hold. The agent checks the flag
//! here so a typo fails at start naming the flag; the string itself goes to
//! the API server, which parses it the same way.

/// Why a selector was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(String);

fn err(msg: impl Into<String>) -> SelectorError {
    SelectorError(msg.into())
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Not,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    Comma,
    Open,
    Close,
}

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Token::Ident(s) => write!(f, "{s:?}"),
            Token::Not => f.write_str("'!'"),
            Token::Eq => f.write_str("'='"),
            Token::DoubleEq => f.write_str("'=='"),
            Token::NotEq => f.write_str("'!='"),
            Token::Gt => f.write_str("'>'"),
            Token::Lt => f.write_str("'<'"),
            Token::Comma => f.write_str("','"),
            Token::Open => f.write_str("'('"),
            Token::Close => f.write_str("')'"),
        }
    }
}

/// A token as an error names it; `None` is the end of the selector.
fn shown(t: Option<&Token>) -> String {
    t.map_or_else(|| "the end".to_string(), Token::to_string)
}

fn special(c: char) -> bool {
    matches!(c, '!' | '=' | ',' | '(' | ')' | '<' | '>')
}

fn lex(s: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        if special(c) {
            chars.next();
            let next_eq = chars.peek() == Some(&'=');
            out.push(match c {
                '!' if next_eq => {
                    chars.next();
                    Token::NotEq
                }
                '!' => Token::Not,
                '=' if next_eq => {
                    chars.next();
                    Token::DoubleEq
                }
                '=' => Token::Eq,
                ',' => Token::Comma,
                '(' => Token::Open,
                ')' => Token::Close,
                '<' => Token::Lt,
                _ => Token::Gt,
            });
            continue;
        }
        let mut ident = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_whitespace() || special(c) {
                break;
            }
            ident.push(c);
            chars.next();
        }
        out.push(Token::Ident(ident));
    }
    out
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters.
fn valid_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A DNS-1123 subdomain: lower-case labels joined by dots, at most 253.
fn valid_prefix(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.first()
                    .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && b.last()
                    .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

fn check_key(key: &str) -> Result<(), SelectorError> {
    let ok = match key.split_once('/') {
        Some((prefix, name)) => valid_prefix(prefix) && valid_name(name),
        None => valid_name(key),
    };
    if ok {
        Ok(())
    } else {
        Err(err(format!(
            "{key:?} is not a valid label key (a name of at most 63 alphanumerics, '-', '_' or '.', optionally after a DNS subdomain and '/')"
        )))
    }
}

fn check_value(value: &str) -> Result<(), SelectorError> {
    if value.is_empty() || valid_name(value) {
        Ok(())
    } else {
        Err(err(format!(
            "{value:?} is not a valid label value (empty, or at most 63 alphanumerics, '-', '_' or '.', beginning and ending with an alphanumeric)"
        )))
    }
}

/// Checks `s` as apimachinery's `labels.Parse` does; an empty selector
/// (blank) selects everything.
pub fn validate(s: &str) -> Result<(), SelectorError> {
    let tokens = lex(s);
    let mut it = tokens.into_iter().peekable();
    if it.peek().is_none() {
        return Ok(());
    }
    loop {
        requirement(&mut it)?;
        match it.next() {
            None => return Ok(()),
            Some(Token::Comma) => {}
            Some(t) => return Err(err(format!("found {t}, expected ',' or the end"))),
        }
    }
}

fn requirement(
    it: &mut std::iter::Peekable<std::vec::IntoIter<Token>>,
) -> Result<(), SelectorError> {
    if it.peek() == Some(&Token::Not) {
        it.next();
        return match it.next() {
            Some(Token::Ident(k)) => check_key(&k),
            other => Err(err(format!(
                "found {} after '!', expected a key",
                shown(other.as_ref())
            ))),
        };
    }
    let key = match it.next() {
        Some(Token::Ident(k)) => k,
        other => {
            return Err(err(format!(
                "found {}, expected a key",
                shown(other.as_ref())
            )));
        }
    };
    check_key(&key)?;
    match it.peek().cloned() {
        None | Some(Token::Comma) => Ok(()),
        Some(Token::Eq | Token::DoubleEq | Token::NotEq) => {
            it.next();
            match it.peek() {
                Some(Token::Ident(_)) => match it.next() {
                    Some(Token::Ident(v)) => check_value(&v),
                    _ => Ok(()),
                },
                // `k=` selects the empty value.
                None | Some(Token::Comma) => Ok(()),
                Some(t) => Err(err(format!("found {t}, expected a value"))),
            }
        }
        Some(Token::Gt | Token::Lt) => {
            it.next();
            match it.next() {
                Some(Token::Ident(v)) if v.parse::<i64>().is_ok() => Ok(()),
                other => Err(err(format!(
                    "found {}, expected an integer after '<' or '>'",
                    shown(other.as_ref())
                ))),
            }
        }
        Some(Token::Ident(op)) if op == "in" || op == "notin" => {
            it.next();
            if it.next() != Some(Token::Open) {
                return Err(err(format!("expected '(' after {op:?}")));
            }
            let mut values = 0;
            loop {
                match it.next() {
                    Some(Token::Ident(v)) => {
                        check_value(&v)?;
                        values += 1;
                        match it.next() {
                            Some(Token::Comma) => {}
                            Some(Token::Close) => break,
                            None => {
                                return Err(err(format!(
                                    "{key:?} {op} (…: the value list has no ')'"
                                )));
                            }
                            other => {
                                return Err(err(format!(
                                    "found {} in a value list",
                                    shown(other.as_ref())
                                )));
                            }
                        }
                    }
                    None => {
                        return Err(err(format!("{key:?} {op} (…: the value list has no ')'")));
                    }
                    Some(Token::Close) if values == 0 => {
                        return Err(err(format!("{key:?} {op} (): the value list is empty")));
                    }
                    other => {
                        return Err(err(format!(
                            "found {} in a value list",
                            shown(other.as_ref())
                        )));
                    }
                }
            }
            Ok(())
        }
        Some(t) => Err(err(format!(
            "found {t} after {key:?}, expected an operator"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::validate;

    #[test]
    fn upstreams_syntax_is_accepted() {
        for ok in [
            "",
            "   ",
            "k8s-app=konnectivity-server",
            "k8s-app==konnectivity-server",
            "k8s-app=konnectivity-server,tier!=canary",
            "k8s-app in (konnectivity-server, konnectivity-server-2)",
            "env notin (test)",
            "app.kubernetes.io/name",
            "!deprecated",
            "replicas>1",
            "replicas<10",
            "k=",
            "example.com/role=proxy",
        ] {
            assert_eq!(validate(ok), Ok(()), "{ok:?}");
        }
    }

    #[test]
    fn malformed_selectors_are_refused_with_the_reason() {
        for bad in [
            "=x",
            "a in (",
            "a in ()",
            "a in (b",
            "a notin x",
            "a,,b",
            "a=b=c",
            "-a=b",
            "a=-b",
            "Example.com/a=b",
            "a>b",
            "!",
            "a b",
        ] {
            assert!(validate(bad).is_err(), "{bad:?} was accepted");
        }
        let long = format!("a={}", "v".repeat(64));
        assert!(validate(&long).is_err(), "a value of 64 characters");
        let e = validate("a in ()").err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("\"a\" in (): the value list is empty"));
    }
}
