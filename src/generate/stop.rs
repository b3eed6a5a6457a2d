//! Stop strings in streamed text: what may be the start of one is held back until the next
//! piece tells.

/// Holds back text that may be the start of a stop string.
pub(super) struct StopStrings {
    stops: Vec<String>,
    held: String,
    pub(super) hit: bool,
}

impl StopStrings {
    pub(super) fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            hit: false,
        }
    }

    /// Add a piece; returns the text safe to emit and whether a stop string was found.
    pub(super) fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            let out = self.held[..at].to_string();
            self.held.clear();
            self.hit = true;
            return (out, true);
        }
        // Keep the longest suffix of `held` that is a proper prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| s.char_indices().skip(1).map(move |(i, _)| &s[..i]))
            .filter(|p| self.held.ends_with(p))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }

    /// Everything still held, plus `tail`.
    pub(super) fn finish(&mut self, tail: &str) -> String {
        let mut s = std::mem::take(&mut self.held);
        s.push_str(tail);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::StopStrings;

    #[test]
    fn stop_strings_hold_back_prefixes() {
        let mut s = StopStrings::new(vec!["\n\nUser:".into()]);
        assert_eq!(s.push("Hello"), ("Hello".into(), false));
        assert_eq!(s.push(" world\n"), (" world".into(), false));
        assert_eq!(s.push("\nUs"), (String::new(), false));
        assert_eq!(s.push("er: hi"), (String::new(), true));
        let mut s = StopStrings::new(vec!["STOP".into()]);
        assert_eq!(s.push("ST"), (String::new(), false));
        assert_eq!(s.push("ay"), ("STay".into(), false));
        assert_eq!(s.finish("x"), "x");
    }
}
