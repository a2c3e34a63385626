//! llama.cpp's GBNF grammars converted to llguidance's Lark dialect (llguidance reads
//! Lark only; its Python package converts GBNF the same way).
//!
//! GBNF: rules `name ::= alternatives`, `root` first to match; a rule ends at a
//! newline unless inside parentheses; items are `"literals"`, `[character classes]`,
//! `(groups)`, `.` (any character) and rule names, each optionally followed by `*`,
//! `+`, `?`, `{m}`, `{m,}` or `{m,n}`; `#` starts a comment. Lark: `root` becomes
//! `start`, names take `_` for `-` and lower case, literals become JSON-escaped
//! strings, character classes regexes.
use std::collections::BTreeMap;

/// Converts a GBNF grammar to Lark; the error names the problem and its line.
pub fn gbnf_to_lark(text: &str) -> Result<String, String> {
    let mut p = Parser {
        s: text.chars().collect(),
        pos: 0,
    };
    let mut rules: Vec<(String, String)> = Vec::new();
    p.skip(true);
    while !p.at_end() {
        let name = p.name()?;
        p.skip(false);
        if !p.eat_str("::=") {
            return Err(p.err("expected `::=` after the rule name"));
        }
        p.skip(true);
        let body = p.alternatives(false)?;
        rules.push((name, body));
        p.skip(true);
    }
    let names: BTreeMap<&str, String> = rules
        .iter()
        .map(|(n, _)| (n.as_str(), lark_name(n)))
        .collect();
    if !names.contains_key("root") {
        return Err("the grammar has no `root` rule".into());
    }
    let mut seen = std::collections::BTreeSet::new();
    for (n, _) in &rules {
        if !seen.insert(names[n.as_str()].clone()) {
            return Err(format!("rule `{n}` is defined twice"));
        }
    }
    let mut out = String::from("%llguidance {}\n\n");
    for (n, body) in &rules {
        let body = resolve(body, &names)?;
        out.push_str(&format!("{}: {}\n", names[n.as_str()], body));
    }
    Ok(out)
}

/// Rule references are written as `\u{1}name\u{1}` while parsing, then resolved.
const REF: char = '\u{1}';

fn resolve(body: &str, names: &BTreeMap<&str, String>) -> Result<String, String> {
    let mut out = String::with_capacity(body.len());
    let mut parts = body.split(REF);
    out.push_str(parts.next().unwrap_or(""));
    while let Some(name) = parts.next() {
        let lark = names
            .get(name)
            .ok_or_else(|| format!("rule `{name}` is used but not defined"))?;
        out.push_str(lark);
        out.push_str(parts.next().unwrap_or(""));
    }
    Ok(out)
}

fn lark_name(n: &str) -> String {
    if n == "root" {
        return "start".into();
    }
    // A leading digit or a clash with `start` gets a prefix.
    let base = n.replace('-', "_").to_lowercase();
    if base == "start" || base.starts_with(|c: char| c.is_ascii_digit()) {
        format!("r_{base}")
    } else {
        base
    }
}

struct Parser {
    s: Vec<char>,
    pos: usize,
}

impl Parser {
    fn at_end(&self) -> bool {
        self.pos >= self.s.len()
    }

    fn peek(&self) -> Option<char> {
        self.s.get(self.pos).copied()
    }

    fn err(&self, msg: &str) -> String {
        let line = self.s[..self.pos.min(self.s.len())]
            .iter()
            .filter(|&&c| c == '\n')
            .count()
            + 1;
        let near: String = self.s[self.pos.min(self.s.len())..]
            .iter()
            .take(20)
            .collect();
        format!("{msg} at line {line}, near {near:?}")
    }

    fn eat_str(&mut self, t: &str) -> bool {
        let n = t.chars().count();
        if self.s.len() >= self.pos + n
            && self.s[self.pos..self.pos + n].iter().copied().eq(t.chars())
        {
            self.pos += n;
            true
        } else {
            false
        }
    }

    /// Skips spaces and comments (and newlines when `newlines`).
    fn skip(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            if c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r')) {
                self.pos += 1;
            } else if c == '#' {
                while self.peek().is_some_and(|c| c != '\n' && c != '\r') {
                    self.pos += 1;
                }
            } else {
                break;
            }
        }
    }

    fn word_char(c: char) -> bool {
        c.is_alphanumeric() || c == '-' || c == '_'
    }

    fn name(&mut self) -> Result<String, String> {
        let start = self.pos;
        while self.peek().is_some_and(Self::word_char) {
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.err("expected a rule name"));
        }
        Ok(self.s[start..self.pos].iter().collect())
    }

    fn alternatives(&mut self, nested: bool) -> Result<String, String> {
        let mut alts = vec![self.sequence(nested)?];
        loop {
            self.skip(nested);
            if self.peek() != Some('|') {
                break;
            }
            self.pos += 1;
            self.skip(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts.join(" | "))
    }

    fn sequence(&mut self, nested: bool) -> Result<String, String> {
        let mut items: Vec<String> = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' || (!nested && (c == '\n' || c == '\r')) {
                break;
            }
            let item = match c {
                '"' => self.literal()?,
                '[' => self.class()?,
                '(' => {
                    self.pos += 1;
                    self.skip(true);
                    let inner = self.alternatives(true)?;
                    if self.peek() != Some(')') {
                        return Err(self.err("expected `)`"));
                    }
                    self.pos += 1;
                    format!("({inner})")
                }
                '.' => {
                    self.pos += 1;
                    "/(?s:.)/".to_string()
                }
                c if Self::word_char(c) => format!("{REF}{}{REF}", self.name()?),
                _ => return Err(self.err(&format!("unexpected character {c:?}"))),
            };
            self.skip(nested);
            let item = self.repetition(item)?;
            items.push(item);
            self.skip(nested);
        }
        Ok(if items.is_empty() {
            "\"\"".into()
        } else {
            items.join(" ")
        })
    }

    fn repetition(&mut self, item: String) -> Result<String, String> {
        Ok(match self.peek() {
            Some(c @ ('*' | '+' | '?')) => {
                self.pos += 1;
                format!("{item}{c}")
            }
            Some('{') => {
                self.pos += 1;
                self.skip(true);
                let min = self.int()?;
                self.skip(true);
                let max = if self.peek() == Some(',') {
                    self.pos += 1;
                    self.skip(true);
                    if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                        Some(self.int()?.to_string())
                    } else {
                        Some(String::new())
                    }
                } else {
                    None
                };
                self.skip(true);
                if self.peek() != Some('}') {
                    return Err(self.err("expected `}` after a repetition count"));
                }
                self.pos += 1;
                match max {
                    None => format!("{item}{{{min}}}"),
                    Some(m) => format!("{item}{{{min},{m}}}"),
                }
            }
            _ => item,
        })
    }

    fn int(&mut self) -> Result<u64, String> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let digits: String = self.s[start..self.pos].iter().collect();
        digits
            .parse()
            .map_err(|_| self.err("expected a repetition count"))
    }

    /// One character of a literal or class: the char and whether it was escaped.
    fn char(&mut self) -> Result<(char, bool), String> {
        let Some(c) = self.peek() else {
            return Err(self.err("unexpected end of the grammar"));
        };
        self.pos += 1;
        if c != '\\' {
            return Ok((c, false));
        }
        let Some(e) = self.peek() else {
            return Err(self.err("incomplete escape sequence"));
        };
        self.pos += 1;
        let hex = |p: &mut Parser, n: usize| -> Result<char, String> {
            let digits: String = p.s.get(p.pos..p.pos + n).unwrap_or(&[]).iter().collect();
            let v = (digits.len() == n)
                .then(|| u32::from_str_radix(&digits, 16).ok())
                .flatten()
                .and_then(char::from_u32)
                .ok_or_else(|| p.err("invalid hexadecimal escape"))?;
            p.pos += n;
            Ok(v)
        };
        let ch = match e {
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            '\\' | '"' | '[' | ']' | '-' | '^' => e,
            'x' => hex(self, 2)?,
            'u' => hex(self, 4)?,
            'U' => hex(self, 8)?,
            _ => return Err(self.err(&format!("invalid escape sequence \\{e}"))),
        };
        Ok((ch, true))
    }

    fn literal(&mut self) -> Result<String, String> {
        self.pos += 1; // the opening quote
        let mut text = String::new();
        loop {
            match self.char()? {
                ('"', false) => break,
                (c, _) => text.push(c),
            }
        }
        Ok(crate::constrain::lark_string(&text))
    }

    fn class(&mut self) -> Result<String, String> {
        self.pos += 1; // `[`
        let mut rx = String::from("[");
        let mut first = true;
        loop {
            let (c, escaped) = self.char()?;
            if c == ']' && !escaped {
                break;
            }
            if c == '^' && !escaped && first {
                rx.push('^');
            } else if c == '-' && !escaped {
                rx.push('-');
            } else {
                rx.push_str(&regex_char(c));
            }
            first = false;
        }
        rx.push(']');
        Ok(format!("/{rx}/"))
    }
}

/// A character inside a regex class, escaped as needed (also `/`, Lark's delimiter).
fn regex_char(c: char) -> String {
    match c {
        '\n' => "\\n".into(),
        '\r' => "\\r".into(),
        '\t' => "\\t".into(),
        '\\' | '[' | ']' | '^' | '-' | '/' | '&' | '~' => format!("\\{c}"),
        c if c.is_control() => format!("\\x{{{:X}}}", c as u32),
        c => c.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::gbnf_to_lark;

    #[test]
    fn gbnf_rules_become_lark_rules() {
        let g = "root ::= answer\nanswer ::= (\"yes\" | \"no\") [.!]? # end\n";
        let lark = gbnf_to_lark(g).unwrap();
        assert!(lark.contains("start: answer\n"), "{lark}");
        assert!(
            lark.contains("answer: (\"yes\" | \"no\") /[.!]/?\n"),
            "{lark}"
        );
    }

    #[test]
    fn gbnf_without_root_is_an_error() {
        let e = gbnf_to_lark("a ::= \"x\"\n").unwrap_err();
        assert!(e.contains("root"), "{e}");
    }

    #[test]
    fn gbnf_undefined_rule_is_an_error() {
        let e = gbnf_to_lark("root ::= missing\n").unwrap_err();
        assert!(e.contains("missing"), "{e}");
    }
}
