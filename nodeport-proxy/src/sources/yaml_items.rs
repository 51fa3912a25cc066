//! Splits a table file written the usual way (block YAML: `services:` and
//! `endpointSlices:` at column 0, each a block list) into one text per list
//! item, so a reload parses only the items whose text changed: at 20,000
//! Services a one-Service edit costs one item's parse, not the whole file's
//! (about half a second of CPU). Written by hand because no YAML crate
//! exposes item boundaries; it only finds boundaries, each item is parsed by
//! serde-saphyr, and anything but the plain layout (flow lists, documents,
//! directives, other keys, odd indentation) returns `None`, for the whole
//! file to be parsed as before.

/// The item texts of the two lists, each de-indented so that it parses on
/// its own as a one-item YAML list.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Items {
    pub services: Vec<String>,
    pub slices: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum List {
    Services,
    Slices,
}

/// Whether `line` carries no YAML content.
fn blank_or_comment(line: &str) -> bool {
    let t = line.trim_start_matches(' ');
    t.is_empty() || t.starts_with('#')
}

fn indentation(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// The top-level key a column-0 line opens, and whether it says `[]`.
fn top_key(line: &str) -> Option<(List, bool)> {
    let (key, rest) = line.split_once(':')?;
    // A colon opens a mapping only before a space or the line's end:
    // `services:#x` is one plain scalar to the parser, not a key.
    if !(rest.is_empty() || rest.starts_with(' ')) {
        return None;
    }
    let list = match key {
        "services" => List::Services,
        "endpointSlices" => List::Slices,
        _ => return None,
    };
    let rest = rest.trim();
    let rest = if rest.starts_with('#') {
        ""
    } else {
        rest.split_once(" #").map_or(rest, |(v, _)| v).trim()
    };
    match rest {
        "" => Some((list, false)),
        "[]" => Some((list, true)),
        _ => None,
    }
}

/// Whether the YAML parser could read `c` differently from this splitter: a
/// character YAML does not allow in a stream (the parser refuses the file,
/// even inside a comment this splitter skips), or a line break other than
/// LF (libyaml also breaks lines at CR, NEL, LS and PS; `str::lines` does
/// not).
fn not_plain(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{8}' | '\u{b}'..='\u{1f}' | '\u{7f}'..='\u{9f}'
        | '\u{2028}' | '\u{2029}' | '\u{fffe}' | '\u{ffff}')
}

/// `None` when `text` is not in the plain layout.
pub fn split(text: &str) -> Option<Items> {
    if text.contains(not_plain) {
        return None;
    }
    let mut items = Items::default();
    let mut seen: Vec<List> = Vec::new();
    let mut current: Option<List> = None;
    // Indentation of the current list's dashes, once known.
    let mut indent: Option<usize> = None;
    let mut item: Option<String> = None;
    let mut started = false;
    let flush = |items: &mut Items, list: Option<List>, item: &mut Option<String>| {
        if let (Some(l), Some(t)) = (list, item.take()) {
            match l {
                List::Services => items.services.push(t),
                List::Slices => items.slices.push(t),
            }
        }
    };
    for line in text.lines() {
        if line.contains('\t') && !blank_or_comment(line) {
            return None;
        }
        if !started && line == "---" {
            started = true;
            continue;
        }
        if blank_or_comment(line) {
            // Part of the item under way (a block scalar may hold an empty
            // line); between items it does not matter.
            if let Some(t) = item.as_mut() {
                // Kept where it may be a block scalar's content; a line left
                // of the item cannot be, and is dropped.
                let i = indent.unwrap_or(0);
                if indentation(line) >= i {
                    t.push_str(&line[i..]);
                }
                t.push('\n');
            }
            continue;
        }
        started = true;
        let ind = indentation(line);
        if ind == 0 && !line.starts_with('-') {
            flush(&mut items, current, &mut item);
            let (list, empty) = top_key(line)?;
            if seen.contains(&list) {
                return None;
            }
            seen.push(list);
            current = (!empty).then_some(list);
            indent = None;
            if empty {
                // Nothing may follow `[]` but the other key.
                current = None;
            }
            continue;
        }
        let list = current?;
        let rest = &line[ind..];
        let dash = rest == "-" || rest.starts_with("- ");
        match indent {
            None => {
                if !dash {
                    return None;
                }
                indent = Some(ind);
            }
            Some(i) if ind < i => return None,
            Some(_) => {}
        }
        let i = indent?;
        if ind == i {
            if !dash {
                return None;
            }
            flush(&mut items, Some(list), &mut item);
            item = Some(String::new());
        }
        let t = item.as_mut()?;
        t.push_str(&line[i..]);
        t.push('\n');
    }
    flush(&mut items, current, &mut item);
    Some(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_block_lists_at_either_indentation() {
        let text = "# routes\n---\nservices:\n- metadata: {name: a}\n  spec:\n    ports: []\n\n- metadata: {name: b}\nendpointSlices:   # slices\n  - metadata:\n      name: a-1\n    # a comment\n# at column 0\n    endpoints: []\n  - metadata: {name: b-1}\n";
        let items = split(text).unwrap_or_else(|| panic!("not split"));
        assert_eq!(
            items.services,
            [
                "- metadata: {name: a}\n  spec:\n    ports: []\n\n",
                "- metadata: {name: b}\n"
            ]
        );
        assert_eq!(
            items.slices,
            [
                "- metadata:\n    name: a-1\n  # a comment\n\n  endpoints: []\n",
                "- metadata: {name: b-1}\n"
            ]
        );
        assert_eq!(
            split("services: []\nendpointSlices: []\n"),
            Some(Items::default())
        );
    }

    #[test]
    fn anything_but_the_plain_layout_is_left_to_the_parser() {
        for text in [
            "services: [{metadata: {name: a}}]\n",
            "services:\n- a\nendpointslices: []\n",
            "services:\n- a\nservices:\n- b\n",
            "services:\n  - a\n - b\n",
            "services:\n  metadata: {}\n",
            "---\nservices: []\n---\nservices: []\n",
            "%YAML 1.2\n---\nservices: []\n",
            "services:\n\t- a\n",
            // Not a key: no space after the colon (found by table_file).
            "services:# s}]\n",
            "services:[]\n",
            // The parser refuses a control character even in a comment, and
            // reads a CR as a line break (found by the table_file target).
            "# a\u{b}b\nservices: []\n",
            "services:\n- a # x\r- b\n",
            "services:\n- a # x\u{2028}- b\n",
            "endpointSlices: []\n- a\n",
        ] {
            assert_eq!(split(text), None, "{text:?}");
        }
    }
}
