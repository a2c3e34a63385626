//! A small reader of Python literals (`ast.literal_eval`) and of pythonic tool-call
//! lists (`[f(a=1), g.h(b="x")]`), producing JSON values.
use serde_json::{Map, Number, Value as Json};

struct Reader<'a> {
    s: &'a [u8],
    text: &'a str,
    pos: usize,
    /// Accept `true`/`false`/`null` (chat templates render nested values as JSON).
    json_names: bool,
}

type R<T> = Result<T, String>;

impl<'a> Reader<'a> {
    fn new(text: &'a str, json_names: bool) -> Reader<'a> {
        Reader {
            s: text.as_bytes(),
            text,
            pos: 0,
            json_names,
        }
    }

    fn ws(&mut self) {
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: u8) -> R<()> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("expected '{}' at {}", c as char, self.pos))
        }
    }

    fn ident(&mut self) -> String {
        self.ws();
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80 {
                self.pos += 1;
            } else {
                break;
            }
        }
        self.text[start..self.pos].to_string()
    }

    fn value(&mut self) -> R<Json> {
        self.ws();
        match self.peek().ok_or("unexpected end")? {
            b'[' => self.seq(b'[', b']'),
            b'(' => self.seq(b'(', b')'),
            b'{' => self.dict(),
            b'"' | b'\'' => self.string(false),
            b'r' | b'R' if matches!(self.s.get(self.pos + 1), Some(b'"' | b'\'')) => {
                self.pos += 1;
                self.string(true)
            }
            b'-' | b'+' | b'.' | b'0'..=b'9' => self.number(),
            _ => {
                let name = self.ident();
                match name.as_str() {
                    "True" => Ok(Json::Bool(true)),
                    "False" => Ok(Json::Bool(false)),
                    "None" => Ok(Json::Null),
                    "true" if self.json_names => Ok(Json::Bool(true)),
                    "false" if self.json_names => Ok(Json::Bool(false)),
                    "null" if self.json_names => Ok(Json::Null),
                    _ => Err(format!("not a literal: {name:?}")),
                }
            }
        }
    }

    fn seq(&mut self, open: u8, close: u8) -> R<Json> {
        self.expect(open)?;
        let mut items = Vec::new();
        loop {
            if self.eat(close) {
                return Ok(Json::Array(items));
            }
            items.push(self.value()?);
            if !self.eat(b',') {
                self.expect(close)?;
                return Ok(Json::Array(items));
            }
        }
    }

    fn dict(&mut self) -> R<Json> {
        self.expect(b'{')?;
        let mut m = Map::new();
        loop {
            if self.eat(b'}') {
                return Ok(Json::Object(m));
            }
            let key = match self.value()? {
                Json::String(s) => s,
                Json::Array(_) | Json::Object(_) => return Err("unhashable dict key".into()),
                other => other.to_string(),
            };
            self.expect(b':')?;
            let v = self.value()?;
            m.insert(key, v);
            if !self.eat(b',') {
                self.expect(b'}')?;
                return Ok(Json::Object(m));
            }
        }
    }

    fn number(&mut self) -> R<Json> {
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'+' | b'_') {
                // A sign is only part of the number at the start or after an exponent.
                if matches!(c, b'-' | b'+')
                    && self.pos > start
                    && !matches!(self.s[self.pos - 1], b'e' | b'E')
                {
                    break;
                }
                self.pos += 1;
            } else {
                break;
            }
        }
        let raw: String = self.text[start..self.pos]
            .chars()
            .filter(|c| *c != '_')
            .collect();
        let (neg, body) = match raw.strip_prefix('-') {
            Some(b) => (true, b),
            None => (false, raw.strip_prefix('+').unwrap_or(&raw)),
        };
        let radix = match body.get(..2).map(str::to_ascii_lowercase).as_deref() {
            Some("0x") => 16,
            Some("0o") => 8,
            Some("0b") => 2,
            _ => 10,
        };
        if radix != 10 {
            let v = i64::from_str_radix(&body[2..], radix)
                .map_err(|_| format!("not a number: {raw:?}"))?;
            return Ok(Json::from(if neg { -v } else { v }));
        }
        // Python has no leading zeros in decimal integers (`007`; `00` and `0.7` are fine).
        if body.len() > 1
            && body.starts_with('0')
            && body.bytes().all(|c| c.is_ascii_digit())
            && body.bytes().any(|c| c != b'0')
        {
            return Err(format!("leading zeros in {raw:?}"));
        }
        if let Ok(i) = raw.parse::<i64>() {
            return Ok(Json::from(i));
        }
        let f: f64 = raw.parse().map_err(|_| format!("not a number: {raw:?}"))?;
        Number::from_f64(f)
            .map(Json::Number)
            .ok_or_else(|| format!("not a finite number: {raw:?}"))
    }

    fn string(&mut self, raw: bool) -> R<Json> {
        let q = self.peek().ok_or("unexpected end")?;
        let triple = self.s.get(self.pos..self.pos + 3) == Some(&[q, q, q][..]);
        self.pos += if triple { 3 } else { 1 };
        let mut out = String::new();
        loop {
            let rest = &self.text[self.pos..];
            let c = rest.chars().next().ok_or("unterminated string")?;
            if c as u32 == q as u32 && (!triple || rest.as_bytes().starts_with(&[q, q, q])) {
                self.pos += if triple { 3 } else { 1 };
                return Ok(Json::String(out));
            }
            if c == '\n' && !triple {
                return Err("newline in string".into());
            }
            self.pos += c.len_utf8();
            if c != '\\' || raw {
                out.push(c);
                continue;
            }
            let e = self.text[self.pos..]
                .chars()
                .next()
                .ok_or("unterminated escape")?;
            self.pos += e.len_utf8();
            match e {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                '0' => out.push('\0'),
                'b' => out.push('\u{8}'),
                'f' => out.push('\u{c}'),
                '\\' | '\'' | '"' => out.push(e),
                '\n' => {}
                'x' | 'u' | 'U' => {
                    let n = match e {
                        'x' => 2,
                        'u' => 4,
                        _ => 8,
                    };
                    let hex = self
                        .text
                        .get(self.pos..self.pos + n)
                        .ok_or("short escape")?;
                    let cp = u32::from_str_radix(hex, 16).map_err(|_| "bad escape")?;
                    out.push(char::from_u32(cp).ok_or("bad code point")?);
                    self.pos += n;
                }
                other => {
                    out.push('\\');
                    out.push(other);
                }
            }
        }
    }

    fn end(&mut self) -> R<()> {
        self.ws();
        if self.pos == self.s.len() {
            Ok(())
        } else {
            Err(format!("trailing text at {}", self.pos))
        }
    }
}

/// `ast.literal_eval` of strings, numbers, `True`/`False`/`None`, lists, tuples, dicts.
pub fn literal(text: &str) -> Result<Json, String> {
    let mut r = Reader::new(text, false);
    let v = r.value()?;
    r.end()?;
    Ok(v)
}

/// A call: the (dotted) function name and its keyword arguments.
pub type Call = (String, Map<String, Json>);

/// A Python list of keyword-only calls: `[(name, kwargs), ...]`; names may be dotted,
/// values are literals where `true`/`false`/`null` are accepted.
pub fn call_list(text: &str) -> Result<Vec<Call>, String> {
    let mut r = Reader::new(text, true);
    r.expect(b'[')?;
    let mut calls = Vec::new();
    loop {
        if r.eat(b']') {
            break;
        }
        let mut name = r.ident();
        while r.eat(b'.') {
            let part = r.ident();
            name = format!("{name}.{part}");
        }
        if name.is_empty() || name.starts_with('.') || name.ends_with('.') {
            return Err("expected a function name".into());
        }
        r.expect(b'(')?;
        let mut args = Map::new();
        loop {
            if r.eat(b')') {
                break;
            }
            let key = r.ident();
            if key.is_empty() || !r.eat(b'=') {
                return Err("only keyword arguments are supported".into());
            }
            args.insert(key, r.value()?);
            if !r.eat(b',') {
                r.expect(b')')?;
                break;
            }
        }
        calls.push((name, args));
        if !r.eat(b',') {
            r.expect(b']')?;
            break;
        }
    }
    r.end()?;
    if calls.is_empty() {
        return Err("empty call list".into());
    }
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn literals_follow_python_syntax() {
        assert_eq!(
            literal("[1, -2.5, 'a\\nb', None, True, (3,)]").unwrap(),
            json!([1, -2.5, "a\nb", null, true, [3]])
        );
        assert_eq!(
            literal("{'k': {\"x\": 1e3}}").unwrap(),
            json!({"k": {"x": 1000.0}})
        );
        assert!(literal("true").is_err());
        assert!(literal("1 2").is_err());
        assert!(literal("'open").is_err());
        assert!(literal("007").is_err());
        assert_eq!(
            literal("[00, 0.5, 007.5, -0x1f, 0b11]").unwrap(),
            json!([0, 0.5, 7.5, -31, 3])
        );
    }

    #[test]
    fn call_lists_take_keyword_arguments_and_json_names() {
        let calls =
            call_list("[get_weather(city=\"Paris\", days=3), a.b(flag=true, x=[null])]").unwrap();
        assert_eq!(calls[0].0, "get_weather");
        assert_eq!(
            Json::Object(calls[0].1.clone()),
            json!({"city": "Paris", "days": 3})
        );
        assert_eq!(calls[1].0, "a.b");
        assert_eq!(
            Json::Object(calls[1].1.clone()),
            json!({"flag": true, "x": [null]})
        );
        assert!(call_list("[f(1)]").is_err());
        assert!(call_list("[]").is_err());
    }
}
