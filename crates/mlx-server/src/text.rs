//! Output text routing: mlx-lm's `TextStateMachine` (reasoning / tool-call sections
//! found by their text markers, which are stripped) with stop words. (Its token-level
//! `StopSequences` are matched in the engine: `mlx_engine::batch::StopMatcher`.)

/// Which part of the answer text belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// The visible answer.
    Normal,
    /// Between think markers.
    Reasoning,
    /// Inside a tool-call section.
    Tool,
}

/// What a marker does when it is seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Goto(Channel),
    Stop(usize),
}

/// A piece of routed output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Text of a channel (markers removed).
    Text(Channel, String),
    /// A tool-call section ended (its end marker was seen).
    ToolEnd,
    /// A stop word was seen (this one): the answer ends here.
    Stop(String),
}

/// The markers of one model and request.
#[derive(Debug, Clone, Default)]
pub struct Markers {
    /// Reasoning start/end (`<think>`, `</think>`).
    pub think: Option<(String, String)>,
    /// Tool-call start/end (end may be empty: the section runs to the end).
    pub tool: Option<(String, String)>,
    /// Stop words.
    pub stop_words: Vec<String>,
    /// The stop word that ends the answer stays in its text (vLLM's
    /// `include_stop_str_in_output`).
    pub include_stop: bool,
}

/// mlx-lm's text state machine: feed decoded text, get routed pieces. Text that may be
/// the start of a marker is held back until it is known not to be one.
#[derive(Debug, Clone)]
pub struct TextRouter {
    markers: Markers,
    state: Channel,
    buf: String,
    stopped: bool,
    stops_armed: bool,
}

impl TextRouter {
    /// A router starting in `initial` (reasoning when the prompt opened a think section).
    pub fn new(markers: Markers, initial: Channel) -> TextRouter {
        TextRouter {
            markers,
            state: initial,
            buf: String::new(),
            stopped: false,
            stops_armed: true,
        }
    }

    /// Whether stop words end the answer yet (vLLM's `min_tokens`: not before the
    /// answer has that many tokens). A word wholly fed while disarmed passes as text; one
    /// whose beginning was held back then and whose end comes once armed stops it.
    pub fn arm_stops(&mut self, armed: bool) {
        self.stops_armed = armed;
    }

    /// The current channel.
    pub fn channel(&self) -> Channel {
        self.state
    }

    /// The markers to look for; stop words only when `stops` (a disarmed router still
    /// holds back a stop word's beginning, which the next text may complete once armed).
    fn patterns(&self, stops: bool) -> Vec<(&str, Action)> {
        let mut p: Vec<(&str, Action)> = Vec::new();
        let m = &self.markers;
        match self.state {
            Channel::Normal => {
                if let Some((s, _)) = &m.think {
                    p.push((s, Action::Goto(Channel::Reasoning)));
                }
                if let Some((s, _)) = &m.tool {
                    p.push((s, Action::Goto(Channel::Tool)));
                }
            }
            Channel::Reasoning => {
                if let Some((_, e)) = &m.think {
                    p.push((e, Action::Goto(Channel::Normal)));
                }
                if let Some((s, _)) = &m.tool {
                    p.push((s, Action::Goto(Channel::Tool)));
                }
            }
            Channel::Tool => {
                if let Some((_, e)) = &m.tool {
                    p.push((e, Action::Goto(Channel::Normal)));
                }
            }
        }
        if stops {
            for (i, w) in m.stop_words.iter().enumerate() {
                p.push((w, Action::Stop(i)));
            }
        }
        p.retain(|(s, _)| !s.is_empty());
        p
    }

    /// The earliest-ending complete marker in `buf` (longest on ties): (start, end, action).
    fn find_match(&self) -> Option<(usize, usize, Action)> {
        let pats = self.patterns(self.stops_armed);
        let mut best: Option<(usize, usize, Action)> = None;
        for (pat, action) in pats {
            if let Some(start) = self.buf.find(pat) {
                let end = start + pat.len();
                let better = match best {
                    None => true,
                    Some((bs, be, _)) => end < be || (end == be && start < bs),
                };
                if better {
                    best = Some((start, end, action));
                }
            }
        }
        best
    }

    /// Length of the longest suffix of `buf` that is a proper prefix of a marker.
    fn held_back(&self) -> usize {
        let mut keep = 0;
        for (pat, _) in self.patterns(true) {
            for (i, _) in pat.char_indices().skip(1) {
                if i > keep && self.buf.ends_with(&pat[..i]) {
                    keep = i;
                }
            }
        }
        keep
    }

    /// Routes newly decoded text.
    pub fn feed(&mut self, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        if self.stopped {
            return out;
        }
        self.buf.push_str(text);
        while let Some((start, end, action)) = self.find_match() {
            if start > 0 {
                out.push(Piece::Text(self.state, self.buf[..start].to_string()));
            }
            self.buf.drain(..end);
            match action {
                Action::Stop(i) => {
                    self.stopped = true;
                    self.buf.clear();
                    let word = self.markers.stop_words.get(i).cloned().unwrap_or_default();
                    if self.markers.include_stop && !word.is_empty() {
                        out.push(Piece::Text(self.state, word.clone()));
                    }
                    out.push(Piece::Stop(word));
                    return out;
                }
                Action::Goto(next) => {
                    if self.state == Channel::Tool && next != Channel::Tool {
                        out.push(Piece::ToolEnd);
                    }
                    self.state = next;
                }
            }
        }
        let keep = self.held_back();
        let emit = self.buf.len() - keep;
        if emit > 0 {
            out.push(Piece::Text(self.state, self.buf[..emit].to_string()));
            self.buf.drain(..emit);
        }
        out
    }

    /// Emits the held-back text (generation ended by length).
    pub fn flush(&mut self) -> Vec<Piece> {
        if self.buf.is_empty() {
            return Vec::new();
        }
        vec![Piece::Text(self.state, std::mem::take(&mut self.buf))]
    }

    /// Drops the held-back text (generation ended by a stop token).
    pub fn discard(&mut self) {
        self.buf.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen_markers(stop: &[&str]) -> Markers {
        Markers {
            think: Some(("<think>".into(), "</think>".into())),
            tool: Some(("<tool_call>".into(), "</tool_call>".into())),
            stop_words: stop.iter().map(|s| s.to_string()).collect(),
            include_stop: false,
        }
    }

    fn collect(r: &mut TextRouter, chunks: &[&str]) -> Vec<Piece> {
        let mut all = Vec::new();
        for c in chunks {
            all.extend(r.feed(c));
        }
        all.extend(r.flush());
        // Merge adjacent text of the same channel to compare independent of chunking.
        let mut merged: Vec<Piece> = Vec::new();
        for p in all {
            if let (Some(Piece::Text(c0, t0)), Piece::Text(c1, t1)) = (merged.last_mut(), &p) {
                if c0 == c1 {
                    t0.push_str(t1);
                    continue;
                }
            }
            merged.push(p);
        }
        merged
    }

    #[test]
    fn markers_split_across_chunks_are_stripped_and_routed() {
        let mut r = TextRouter::new(qwen_markers(&[]), Channel::Normal);
        let pieces = collect(
            &mut r,
            &[
                "<thi",
                "nk>why</th",
                "ink>Hi <tool",
                "_call>{}</tool_call> ok",
            ],
        );
        assert_eq!(
            pieces,
            vec![
                Piece::Text(Channel::Reasoning, "why".into()),
                Piece::Text(Channel::Normal, "Hi ".into()),
                Piece::Text(Channel::Tool, "{}".into()),
                Piece::ToolEnd,
                Piece::Text(Channel::Normal, " ok".into()),
            ]
        );
    }

    #[test]
    fn partial_marker_text_is_released_when_it_diverges() {
        let mut r = TextRouter::new(qwen_markers(&[]), Channel::Normal);
        assert_eq!(
            r.feed("a <th"),
            vec![Piece::Text(Channel::Normal, "a ".into())]
        );
        assert_eq!(
            r.feed("e end"),
            vec![Piece::Text(Channel::Normal, "<the end".into())]
        );
    }

    #[test]
    fn stop_word_ends_output_and_drops_the_rest() {
        let mut r = TextRouter::new(qwen_markers(&["END"]), Channel::Normal);
        let pieces = collect(&mut r, &["one E", "ND two"]);
        assert_eq!(
            pieces,
            vec![
                Piece::Text(Channel::Normal, "one ".into()),
                Piece::Stop("END".into())
            ]
        );
        assert!(r.feed("more").is_empty());
    }

    #[test]
    fn a_kept_stop_word_closes_the_text_and_a_disarmed_one_is_plain_text() {
        let mut m = qwen_markers(&["END"]);
        m.include_stop = true;
        let mut r = TextRouter::new(m.clone(), Channel::Normal);
        let pieces = collect(&mut r, &["one E", "ND two"]);
        assert_eq!(
            pieces,
            vec![
                Piece::Text(Channel::Normal, "one END".into()),
                Piece::Stop("END".into())
            ]
        );
        // Disarmed (min_tokens not reached), the word passes; armed, the next one stops,
        // even where its first letter came while disarmed.
        let mut r = TextRouter::new(qwen_markers(&["END"]), Channel::Normal);
        r.arm_stops(false);
        let mut pieces = r.feed("a END b E");
        r.arm_stops(true);
        pieces.extend(r.feed("ND c"));
        assert_eq!(
            pieces,
            vec![
                Piece::Text(Channel::Normal, "a END b ".into()),
                Piece::Stop("END".into())
            ]
        );
    }

    #[test]
    fn router_can_start_inside_reasoning() {
        let mut r = TextRouter::new(qwen_markers(&[]), Channel::Reasoning);
        let pieces = collect(&mut r, &["hmm</think>answer"]);
        assert_eq!(
            pieces,
            vec![
                Piece::Text(Channel::Reasoning, "hmm".into()),
                Piece::Text(Channel::Normal, "answer".into())
            ]
        );
    }
}
