//! Where things are in the source text: every key, value and table of the
//! file by dotted path (`node[1].cores[0]`) and byte span, so that an error
//! found by serde (which knows a span) or by a check after parsing (which
//! knows a path) can name both the field and the line.

use std::collections::BTreeMap;
use std::ops::Range;

use toml_edit::{ImDocument, Item, Table, Value};

/// The spans and paths of one parsed file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Locator {
    /// Every span with the path it belongs to (keys, values, tables).
    spans: Vec<(Range<usize>, String)>,
    /// The spans of tables, standard and inline, with their paths.
    tables: Vec<(Range<usize>, String)>,
    /// The line where each path first appears (its key, or its table header).
    lines: BTreeMap<String, usize>,
    /// Byte offset of the start of each line.
    line_starts: Vec<usize>,
}

impl Locator {
    /// Parses `text` for its layout. A syntax error comes back as toml_edit
    /// reports it.
    pub(crate) fn new(text: &str) -> Result<Locator, toml_edit::TomlError> {
        let doc = ImDocument::parse(text)?;
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        let mut loc = Locator {
            spans: Vec::new(),
            tables: Vec::new(),
            lines: BTreeMap::new(),
            line_starts,
        };
        loc.table(doc.as_table(), "");
        Ok(loc)
    }

    /// The 1-based line of a byte offset.
    pub(crate) fn line_of(&self, offset: usize) -> usize {
        self.line_starts.partition_point(|&s| s <= offset).max(1)
    }

    /// The path of the innermost key, value or table whose span holds
    /// `offset`; empty when none does (the top level).
    pub(crate) fn path_at(&self, offset: usize) -> &str {
        self.spans
            .iter()
            .filter(|(r, _)| r.start <= offset && offset < r.end.max(r.start + 1))
            .min_by_key(|(r, _)| r.len())
            .map_or("", |(_, p)| p.as_str())
    }

    /// The path of the table whose span is exactly `span`; empty when none
    /// is (the top level).
    pub(crate) fn table_spanning(&self, span: &Range<usize>) -> &str {
        self.tables
            .iter()
            .find(|(r, _)| r == span)
            .map_or("", |(_, p)| p.as_str())
    }

    /// Whether the file has `path` itself (not only a table around it).
    pub(crate) fn has(&self, path: &str) -> bool {
        self.lines.contains_key(path)
    }

    /// The line of `path`, or of the nearest enclosing path that is in the
    /// file (a field left to its default is reported at its table); 1 when
    /// nothing is.
    pub(crate) fn line(&self, path: &str) -> usize {
        let mut p = path;
        loop {
            if let Some(&l) = self.lines.get(p) {
                return l;
            }
            match p.rfind(['.', '[']) {
                Some(i) => p = &p[..i],
                None => return 1,
            }
        }
    }

    fn note(&mut self, span: Option<Range<usize>>, path: &str) {
        if let Some(span) = span {
            let line = self.line_of(span.start);
            let first = self.lines.entry(path.to_owned()).or_insert(line);
            *first = (*first).min(line);
            self.spans.push((span, path.to_owned()));
        }
    }

    fn note_table(&mut self, span: Option<Range<usize>>, path: &str) {
        if let Some(span) = &span {
            self.tables.push((span.clone(), path.to_owned()));
        }
        self.note(span, path);
    }

    fn table(&mut self, t: &Table, path: &str) {
        for (k, item) in t.iter() {
            let p = join(path, k);
            if let Some((key, _)) = t.get_key_value(k) {
                self.note(key.span(), &p);
            }
            self.item(item, &p);
        }
    }

    fn item(&mut self, item: &Item, path: &str) {
        match item {
            Item::None => {}
            Item::Value(v) => self.value(v, path),
            Item::Table(t) => {
                self.note_table(t.span(), path);
                self.table(t, path);
            }
            Item::ArrayOfTables(a) => {
                for (i, t) in a.iter().enumerate() {
                    let p = format!("{path}[{i}]");
                    self.note_table(t.span(), &p);
                    self.table(t, &p);
                }
            }
        }
    }

    fn value(&mut self, v: &Value, path: &str) {
        self.note(v.span(), path);
        match v {
            Value::Array(a) => {
                for (i, e) in a.iter().enumerate() {
                    self.value(e, &format!("{path}[{i}]"));
                }
            }
            Value::InlineTable(t) => {
                if let Some(span) = v.span() {
                    self.tables.push((span, path.to_owned()));
                }
                for (k, e) in t.iter() {
                    let p = join(path, k);
                    if let Some((key, _)) = t.get_key_value(k) {
                        self.note(key.span(), &p);
                    }
                    self.value(e, &p);
                }
            }
            _ => {}
        }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}
