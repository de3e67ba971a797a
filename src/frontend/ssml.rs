//! The SSML subset (docs/text.md), read only when a text starts with `<speak` (never guessed
//! from a stray `<`): it becomes plain text for the same text layer, breaks as pause tags
//! (`frontend::pause`), phonemes as CosyVoice3's phoneme tokens (`frontend::lexicon`).
//!
//! `<speak>`, `<break time="500ms"/>` (or `strength`), `<sub alias="…">`,
//! `<say-as interpret-as="characters|cardinal|telephone">`, `<phoneme alphabet="cmu|pinyin" ph="…">`.
//! Anything else, or markup that is not well-formed XML, is one error naming its line and column.

use roxmltree::{Document, Node, TextPos};

use crate::error::{Error, InputCode, Result};
use crate::frontend::lexicon::{is_pinyin_syllable, Pronunciation};
use crate::frontend::tn::TnLang;

/// How an SSML text starts.
const SSML_STARTS: [&str; 3] = ["<speak>", "<speak ", "<?xml"];

/// Whether `text` is SSML: it starts with a `<speak>` element.
pub fn is_ssml(text: &str) -> bool {
    let start = text.trim_start();
    SSML_STARTS.iter().any(|s| start.starts_with(s))
}

/// What a request says its text is (HTTP `input_format`, the WebSocket's `session.config`,
/// `--ssml` on the command line). The one rule of which texts are SSML: [`InputFormat::ssml`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum InputFormat {
    /// SSML when it starts with `<speak>` ([`is_ssml`]), else text (Markdown, plain).
    #[default]
    Auto,
    /// SSML: a text without a leading `<speak>` is read as if it were inside one.
    Ssml,
    /// Text (Markdown, plain), a leading `<speak>` too.
    Text,
}

impl InputFormat {
    /// The names a front end takes: "auto", "ssml", "text".
    pub const NAMES: [&'static str; 3] = ["auto", "ssml", "text"];

    /// The format named `name` (see [`InputFormat::NAMES`]); another name is refused.
    pub fn parse(name: &str) -> Result<InputFormat> {
        match name.trim() {
            "auto" => Ok(InputFormat::Auto),
            "ssml" => Ok(InputFormat::Ssml),
            "text" => Ok(InputFormat::Text),
            other => Err(Error::input(
                InputCode::Invalid,
                Some("input_format"),
                format!("input_format {other:?}: use \"ssml\", \"text\" or \"auto\" (SSML only when the text starts with <speak>)"),
            )),
        }
    }

    /// Whether `text` is read as SSML in this format.
    pub fn is_ssml(self, text: &str) -> bool {
        match self {
            InputFormat::Auto => is_ssml(text),
            InputFormat::Ssml => true,
            InputFormat::Text => false,
        }
    }

    /// Whether a text that starts with `start` is SSML in this format; `None`: it cannot be told
    /// yet (auto, and `start` could still become `<speak>`: text that arrives in pieces waits).
    pub fn decided(self, start: &str) -> Option<bool> {
        let start = start.trim_start();
        let undecided = self == InputFormat::Auto && SSML_STARTS.iter().any(|s| s.len() > start.len() && s.starts_with(start));
        (!undecided).then(|| self.is_ssml(start))
    }

    /// What `text` says, if it is SSML in this format ([`to_stretches`]); `None`: it is text.
    pub fn ssml(self, text: &str) -> Option<Result<Vec<Stretch>>> {
        match self {
            InputFormat::Ssml if !is_ssml(text) => Some(read(&format!("{SPEAK_OPEN}{text}</speak>"), SPEAK_OPEN.len())),
            format => format.is_ssml(text).then(|| to_stretches(text)),
        }
    }

    /// Whether `text` may change its rate (SSML with a `<prosody>`): its audio is then made whole,
    /// sentence by sentence, as a speed's is (the streaming schedule cannot stretch it).
    pub fn may_change_rate(self, text: &str) -> bool {
        self.is_ssml(text) && text.contains("<prosody")
    }
}

/// The element an SSML text without one is read inside (`InputFormat::Ssml`).
const SPEAK_OPEN: &str = "<speak>";

/// The text an SSML document says, with its breaks as pause tags (its rates left out: see
/// [`to_stretches`]).
pub fn to_text(ssml: &str) -> Result<String> {
    read(ssml, 0).map(|stretches| text_of(&stretches))
}

/// What an SSML document says, stretch by stretch of one `<prosody rate>`.
pub fn to_stretches(ssml: &str) -> Result<Vec<Stretch>> {
    read(ssml, 0)
}

/// [`to_text`] of `ssml`, whose first `wrapped` bytes (on its first line) were put there by cosy:
/// positions are told in the text as the user wrote it.
fn read(ssml: &str, wrapped: usize) -> Result<Vec<Stretch>> {
    let place = |pos: TextPos| Place { row: pos.row, col: if pos.row == 1 { pos.col.saturating_sub(wrapped as u32).max(1) } else { pos.col } };
    let doc = Document::parse(ssml).map_err(|e| {
        // roxmltree ends its message with " at ROW:COL"; the place is told first, as for the rest.
        let message = e.to_string();
        let message = message.strip_suffix(&format!(" at {}", e.pos())).unwrap_or(&message).to_string();
        place(e.pos()).error(message)
    })?;
    let reader = Reader { doc: &doc, place: &place };
    let root = doc.root_element();
    if root.tag_name().name() != "speak" {
        return Err(reader.at(root, format!("the root element is <{}>, not <speak>", root.tag_name().name())));
    }
    let mut out = Out { stretches: Vec::new(), text: String::new(), rate: 1.0 };
    reader.children(root, &mut out)?;
    out.flush();
    Ok(out.stretches)
}

/// A stretch of an SSML text said at one rate (`<prosody rate>`): its text, with pause tags, and
/// its rate (1 = as the request says; 0.5 = half as fast, the audio twice as long).
#[derive(Debug, Clone, PartialEq)]
pub struct Stretch {
    pub text: String,
    pub rate: f64,
}

/// The text of `stretches`, one after another (their rates left out).
pub fn text_of(stretches: &[Stretch]) -> String {
    stretches.iter().map(|s| s.text.as_str()).collect::<Vec<_>>().join(" ")
}

/// What an SSML document says so far: the stretches done, and the one being read at `rate`.
struct Out {
    stretches: Vec<Stretch>,
    text: String,
    rate: f64,
}

impl Out {
    fn push_str(&mut self, text: &str) {
        self.text.push_str(text);
    }

    fn push(&mut self, c: char) {
        self.text.push(c);
    }

    /// The text so far is a stretch of its own (when it says anything).
    fn flush(&mut self) {
        let text = std::mem::take(&mut self.text);
        if !text.trim().is_empty() {
            self.stretches.push(Stretch { text: text.trim().to_string(), rate: self.rate });
        }
    }

    /// What follows is read at `rate`; returns the rate before.
    fn set_rate(&mut self, rate: f64) -> f64 {
        self.flush();
        std::mem::replace(&mut self.rate, rate)
    }
}

/// `<prosody rate>` as a factor of the speed: the named rates, or a percentage from 50% to 200%.
fn prosody_rate(rate: &str) -> std::result::Result<f64, String> {
    let factor = match rate.trim() {
        "x-slow" => 0.5,
        "slow" => 0.75,
        "medium" | "default" => 1.0,
        "fast" => 1.5,
        "x-fast" => 2.0,
        other => other.strip_suffix('%').and_then(|p| p.parse::<f64>().ok()).filter(|p| p.is_finite()).map_or(f64::NAN, |p| p / 100.0),
    };
    if (0.5..=2.0).contains(&factor) {
        Ok(factor)
    } else {
        Err("use x-slow, slow, medium, fast, x-fast or a percentage from 50% to 200%".into())
    }
}

/// A line and column (1 = the first) in the text as written.
struct Place {
    row: u32,
    col: u32,
}

impl Place {
    fn error(&self, message: String) -> Error {
        Error::invalid(format!("invalid SSML at line {}, column {}: {message}", self.row, self.col))
    }
}

/// A parsed document and how its positions are told.
struct Reader<'d, 'input, 'p> {
    doc: &'d Document<'input>,
    place: &'p dyn Fn(TextPos) -> Place,
}

impl Reader<'_, '_, '_> {
    fn at(&self, node: Node<'_, '_>, msg: String) -> Error {
        (self.place)(self.doc.text_pos_at(node.range().start)).error(msg)
    }

    fn children(&self, node: Node<'_, '_>, out: &mut Out) -> Result<()> {
        for child in node.children() {
            if child.is_text() {
                out.push_str(child.text().unwrap_or(""));
            } else if child.is_element() {
                self.element(child, out)?;
            }
        }
        Ok(())
    }

    fn element(&self, node: Node<'_, '_>, out: &mut Out) -> Result<()> {
        let name = node.tag_name().name();
        let attr = |key: &str| node.attribute(key);
        let at = |msg: String| self.at(node, msg);
        let need = |key: &str| attr(key).ok_or_else(|| at(format!("<{name}> needs a {key} attribute")));
        match name {
            "break" => {
                let time = match (attr("time"), attr("strength")) {
                    (Some(time), _) => time.trim().to_string(),
                    (None, strength) => match strength.unwrap_or("medium") {
                        "none" => "0ms",
                        "x-weak" => "100ms",
                        "weak" => "250ms",
                        "medium" => "500ms",
                        "strong" => "750ms",
                        "x-strong" => "1s",
                        other => return Err(at(format!("<break strength={other:?}>: allowed: none, x-weak, weak, medium, strong, x-strong"))),
                    }
                    .to_string(),
                };
                if !crate::frontend::pause::is_pause_length(&time) {
                    return Err(at(format!("<break time={time:?}>: give seconds or milliseconds up to 10 s, as \"0.5s\" or \"500ms\"")));
                }
                let tag = format!("[pause:{time}]");
                out.push(' ');
                out.push_str(&tag);
                out.push(' ');
            }
            "sub" => out.push_str(need("alias")?),
            "say-as" => {
                let text = inner_text(node);
                match need("interpret-as")? {
                    "characters" | "spell-out" => {
                        let spelled: Vec<String> = text.chars().filter(|c| !c.is_whitespace()).map(String::from).collect();
                        out.push_str(&spelled.join(" "));
                    }
                    "cardinal" | "number" => out.push_str(&text.replace([',', '_'], "")),
                    "telephone" => out.push_str(&crate::frontend::readings::telephone(&text)),
                    "date" => {
                        let format = attr("format").unwrap_or("ymd");
                        // Written out as the official frontend reads a date in the text's language
                        // (its own choice of grammars: `TnLang::for_text` of the whole document).
                        let chinese = TnLang::for_text(&inner_text(self.doc.root_element())) == TnLang::Zh;
                        let said = date(&text, format, chinese).map_err(|why| at(format!("<say-as interpret-as=\"date\" format={format:?}>: {why}")))?;
                        out.push_str(&said);
                    }
                    other => return Err(at(format!("<say-as interpret-as={other:?}>: allowed: characters, cardinal, date, telephone"))),
                }
            }
            "phoneme" => {
                let ph: Vec<String> = need("ph")?.split_whitespace().map(str::to_string).collect();
                if ph.is_empty() {
                    return Err(at("<phoneme> has an empty ph".into()));
                }
                let pronunciation = match need("alphabet")? {
                    "cmu" => Pronunciation::Cmu(ph),
                    "pinyin" => {
                        if let Some(bad) = ph.iter().find(|s| !is_pinyin_syllable(s)) {
                            return Err(at(format!("<phoneme> pinyin {bad:?}: a syllable is letters, then a tone digit 1-5 or none")));
                        }
                        Pronunciation::Pinyin(ph)
                    }
                    other => return Err(at(format!("<phoneme alphabet={other:?}>: allowed: cmu, pinyin"))),
                };
                out.push_str(&pronunciation.spoken());
            }
            "prosody" => {
                // Only the rate is read: a pitch or volume cosy would drop is refused, not ignored.
                if let Some(other) = node.attributes().map(|a| a.name()).find(|a| *a != "rate") {
                    return Err(at(format!("<prosody {other}>: cosy reads only the rate of <prosody>")));
                }
                let rate = need("rate")?;
                let factor = prosody_rate(rate).map_err(|why| at(format!("<prosody rate={rate:?}>: {why}")))?;
                let outer = out.set_rate(out.rate * factor);
                self.children(node, out)?;
                out.set_rate(outer);
            }
            other => return Err(at(format!("<{other}> is not in the SSML cosy reads (speak, break, sub, say-as, phoneme, prosody)"))),
        }
        Ok(())
    }
}

/// The formats of `<say-as interpret-as="date">`: which fields the text gives, in order.
const DATE_FORMATS: [&str; 10] = ["mdy", "dmy", "ymd", "md", "dm", "ym", "my", "y", "m", "d"];

const MONTHS: [&str; 12] = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];

/// A date written in digits in `format` ("03/05/2024" in "mdy"), written out as a person says it:
/// "March 5, 2024" (English), "2024年3月5日" (`chinese`); the official frontend then reads it as
/// it reads such a date in the text. `Err`: why it is not a date.
fn date(text: &str, format: &str, chinese: bool) -> std::result::Result<String, String> {
    if !DATE_FORMATS.contains(&format) {
        return Err(format!("the format is one of {}", DATE_FORMATS.join(", ")));
    }
    let text = text.trim();
    let fields: Vec<&str> = text.split(['-', '/', '.', ' ']).filter(|f| !f.is_empty()).collect();
    let digits = |f: &&str| !f.is_empty() && f.len() <= 4 && f.bytes().all(|b| b.is_ascii_digit());
    if fields.len() != format.len() || !fields.iter().all(digits) {
        return Err(format!("{text:?} is not a date written {format} in digits (as \"2024-03-05\" for ymd, \"03/05/2024\" for mdy)"));
    }
    let (mut year, mut month, mut day) = (None, None, None);
    for (field, value) in format.chars().zip(&fields) {
        // At most four digits each (checked above): the parse cannot fail.
        let value: u32 = value.parse().unwrap_or(0);
        match field {
            'y' => year = Some(value),
            'm' => month = Some(value),
            _ => day = Some(value),
        }
    }
    if let Some(m) = month.filter(|m| !(1..=12).contains(m)) {
        return Err(format!("{text:?}: month {m} is not 1-12"));
    }
    if let Some(d) = day {
        let leap = year.is_none_or(|y| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0);
        let last = match month {
            Some(2) if leap => 29,
            Some(2) => 28,
            Some(4 | 6 | 9 | 11) => 30,
            _ => 31,
        };
        if !(1..=last).contains(&d) {
            return Err(format!("{text:?}: day {d} is not 1-{last}"));
        }
    }
    if chinese {
        let parts = [(year, "年"), (month, "月"), (day, "日")];
        return Ok(parts.iter().filter_map(|(v, unit)| v.map(|v| format!("{v}{unit}"))).collect());
    }
    let month = month.map(|m| MONTHS[m as usize - 1]);
    Ok(match (year, month, day) {
        (Some(y), Some(m), Some(d)) => format!("{m} {d}, {y}"),
        (None, Some(m), Some(d)) => format!("{m} {d}"),
        (Some(y), Some(m), None) => format!("{m} {y}"),
        (y, m, d) => [y.map(|y| y.to_string()), m.map(str::to_string), d.map(|d| d.to_string())].into_iter().flatten().collect::<Vec<_>>().join(" "),
    })
}

/// All the text inside `node`.
fn inner_text(node: Node<'_, '_>) -> String {
    node.descendants().filter(|n| n.is_text()).filter_map(|n| n.text()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subset_becomes_text() {
        let ssml = r#"<speak>Call <sub alias="the World Wide Web Consortium">W3C</sub> on <say-as interpret-as="telephone">555-0123</say-as>.<break time="500ms"/>Spell <say-as interpret-as="characters">TTS</say-as>, count <say-as interpret-as="cardinal">1,024</say-as>, say <phoneme alphabet="cmu" ph="T AH0 M EY1 T OW2">tomato</phoneme> and <phoneme alphabet="pinyin" ph="hang2">行</phoneme>.<break/>End &amp; done.</speak>"#;
        assert_eq!(
            to_text(ssml).unwrap(),
            "Call the World Wide Web Consortium on 5 5 5, 0 1 2 3. [pause:500ms] Spell T T S, count 1024, say [T][AH0][M][EY1][T][OW2] and [h][áng]. [pause:500ms] End & done."
        );
    }

    #[test]
    fn only_a_leading_speak_is_ssml() {
        assert!(is_ssml("  <speak>Hi</speak>"));
        assert!(is_ssml("<speak xml:lang=\"en\">Hi</speak>"));
        assert!(!is_ssml("2 < 3 and <speak>"));
        assert!(!is_ssml("<speaker> says hi"));
    }

    #[test]
    fn bad_markup_names_its_place() {
        let err = |t: &str| to_text(t).expect_err("refused").to_string();
        // XML that is not well-formed: roxmltree's words, the place told first as for the rest.
        assert_eq!(err("<speak>Hi <break time=\"5\"></speak>"), "invalid SSML at line 1, column 27: expected 'break' tag, not 'speak'");
        assert_eq!(
            err("<speak>Hi\n <break time=\"11s\"/></speak>"),
            "invalid SSML at line 2, column 2: <break time=\"11s\">: give seconds or milliseconds up to 10 s, as \"0.5s\" or \"500ms\""
        );
        assert_eq!(
            err("<speak><emphasis>x</emphasis></speak>"),
            "invalid SSML at line 1, column 8: <emphasis> is not in the SSML cosy reads (speak, break, sub, say-as, phoneme, prosody)"
        );
        assert_eq!(err("<speak><sub>x</sub></speak>"), "invalid SSML at line 1, column 8: <sub> needs a alias attribute");
        assert_eq!(
            err("<speak><say-as interpret-as=\"ordinal\">x</say-as></speak>"),
            "invalid SSML at line 1, column 8: <say-as interpret-as=\"ordinal\">: allowed: characters, cardinal, date, telephone"
        );
    }

    #[test]
    fn a_prosody_rate_is_a_stretch_of_its_own() {
        let stretches = |body: &str| to_stretches(&format!("<speak>{body}</speak>")).expect("valid SSML");
        let s = |text: &str, rate: f64| Stretch { text: text.into(), rate };
        assert_eq!(
            stretches(r#"One. <prosody rate="50%">Two <prosody rate="fast">three</prosody>.</prosody> Four."#),
            vec![s("One.", 1.0), s("Two", 0.5), s("three", 0.75), s(".", 0.5), s("Four.", 1.0)]
        );
        assert_eq!(stretches(r#"<prosody rate="x-slow">A</prosody><prosody rate="x-fast">B</prosody><prosody rate="medium">C</prosody>"#), vec![s("A", 0.5), s("B", 2.0), s("C", 1.0)]);
        assert_eq!(to_text(r#"<speak>One. <prosody rate="slow">Two.</prosody></speak>"#).unwrap(), "One. Two.");
        let err = |body: &str| to_stretches(&format!("<speak>{body}</speak>")).expect_err("refused").to_string();
        assert_eq!(
            err(r#"<prosody rate="300%">x</prosody>"#),
            "invalid SSML at line 1, column 8: <prosody rate=\"300%\">: use x-slow, slow, medium, fast, x-fast or a percentage from 50% to 200%"
        );
        assert_eq!(err(r#"<prosody pitch="high">x</prosody>"#), "invalid SSML at line 1, column 8: <prosody pitch>: cosy reads only the rate of <prosody>");
        assert_eq!(err("<prosody>x</prosody>"), "invalid SSML at line 1, column 8: <prosody> needs a rate attribute");
        assert!(InputFormat::Auto.may_change_rate("<speak><prosody rate=\"slow\">x</prosody></speak>"));
        assert!(!InputFormat::Auto.may_change_rate("<prosody rate=\"slow\">x</prosody>"));
        assert!(InputFormat::Ssml.may_change_rate("<prosody rate=\"slow\">x</prosody>"));
    }

    #[test]
    fn a_date_is_written_out_as_said() {
        let said = |body: &str| to_text(&format!("<speak>{body}</speak>"));
        let ok = |body: &str| said(body).expect("a date");
        assert_eq!(ok(r#"On <say-as interpret-as="date" format="mdy">03/05/2024</say-as>."#), "On March 5, 2024.");
        assert_eq!(ok(r#"On <say-as interpret-as="date" format="dmy">5.3.2024</say-as>."#), "On March 5, 2024.");
        assert_eq!(ok(r#"On <say-as interpret-as="date">2024-03-05</say-as>."#), "On March 5, 2024.");
        assert_eq!(ok(r#"On <say-as interpret-as="date" format="md">12/31</say-as>."#), "On December 31.");
        assert_eq!(ok(r#"In <say-as interpret-as="date" format="my">02/2024</say-as>."#), "In February 2024.");
        assert_eq!(ok(r#"In <say-as interpret-as="date" format="y">1999</say-as>."#), "In 1999.");
        assert_eq!(ok(r#"On <say-as interpret-as="date" format="md">2/29</say-as>."#), "On February 29.");
        // Chinese text: the date as Chinese writes it.
        assert_eq!(ok(r#"我们在<say-as interpret-as="date" format="ymd">2024-03-05</say-as>见面。"#), "我们在2024年3月5日见面。");
        assert_eq!(ok(r#"在<say-as interpret-as="date" format="md">3/5</say-as>。"#), "在3月5日。");
        let err = |body: &str| said(body).expect_err("not a date").to_string();
        assert_eq!(
            err("Hi\n<say-as interpret-as=\"date\" format=\"mdy\">13/05/2024</say-as>"),
            "invalid SSML at line 2, column 1: <say-as interpret-as=\"date\" format=\"mdy\">: \"13/05/2024\": month 13 is not 1-12"
        );
        assert_eq!(
            err("<say-as interpret-as=\"date\" format=\"ymd\">2023-02-29</say-as>"),
            "invalid SSML at line 1, column 8: <say-as interpret-as=\"date\" format=\"ymd\">: \"2023-02-29\": day 29 is not 1-28"
        );
        assert_eq!(
            err("<say-as interpret-as=\"date\" format=\"mdy\">March 5</say-as>"),
            "invalid SSML at line 1, column 8: <say-as interpret-as=\"date\" format=\"mdy\">: \"March 5\" is not a date written mdy in digits (as \"2024-03-05\" for ymd, \"03/05/2024\" for mdy)"
        );
        assert_eq!(
            err("<say-as interpret-as=\"date\" format=\"yy\">2024</say-as>"),
            "invalid SSML at line 1, column 8: <say-as interpret-as=\"date\" format=\"yy\">: the format is one of mdy, dmy, ymd, md, dm, ym, my, y, m, d"
        );
    }

    #[test]
    fn the_input_format_says_what_is_ssml() {
        let said = |format: InputFormat, text: &str| format.ssml(text).map(|r| text_of(&r.expect("valid SSML")));
        // Auto: only a leading <speak>.
        assert_eq!(said(InputFormat::Auto, "<speak>A <sub alias=\"b\">c</sub></speak>").as_deref(), Some("A b"));
        assert_eq!(said(InputFormat::Auto, "A <sub alias=\"b\">c</sub>"), None);
        // Ssml: a text without <speak> is read as if inside one; one with it as it is.
        assert_eq!(said(InputFormat::Ssml, "A <sub alias=\"b\">c</sub> &amp; d").as_deref(), Some("A b & d"));
        assert_eq!(said(InputFormat::Ssml, "<speak>A</speak>").as_deref(), Some("A"));
        assert_eq!(said(InputFormat::Ssml, "2 &lt; 3").as_deref(), Some("2 < 3"));
        // Text: never SSML, a leading <speak> too.
        assert_eq!(said(InputFormat::Text, "<speak>A</speak>"), None);
        // A wrapped text's errors are placed in the text as written (not in the <speak> around it).
        let err = |text: &str| InputFormat::Ssml.ssml(text).expect("SSML").expect_err("refused").to_string();
        assert_eq!(err("Hi <b>x</b>"), "invalid SSML at line 1, column 4: <b> is not in the SSML cosy reads (speak, break, sub, say-as, phoneme, prosody)");
        assert_eq!(err("Hi\n<b>x</b>"), "invalid SSML at line 2, column 1: <b> is not in the SSML cosy reads (speak, break, sub, say-as, phoneme, prosody)");
        assert_eq!(err("2 < 3"), "invalid SSML at line 1, column 4: invalid name token");
        // Text in pieces: auto waits while the start could still be <speak>.
        assert_eq!(InputFormat::Auto.decided(" <spe"), None);
        assert_eq!(InputFormat::Auto.decided(""), None);
        assert_eq!(InputFormat::Auto.decided("<speak>"), Some(true));
        assert_eq!(InputFormat::Auto.decided("<b"), Some(false));
        assert_eq!(InputFormat::Auto.decided("Hi"), Some(false));
        assert_eq!(InputFormat::Ssml.decided(""), Some(true));
        assert_eq!(InputFormat::Text.decided("<spe"), Some(false));
        assert_eq!(InputFormat::parse("ssml").unwrap(), InputFormat::Ssml);
        assert_eq!(InputFormat::parse(" text ").unwrap(), InputFormat::Text);
        assert_eq!(InputFormat::parse("auto").unwrap(), InputFormat::Auto);
        let bad = InputFormat::parse("xml").expect_err("refused");
        assert!(matches!(bad, Error::Input { param: Some("input_format"), .. }), "{bad:?}");
        assert_eq!(bad.to_string(), "input_format \"xml\": use \"ssml\", \"text\" or \"auto\" (SSML only when the text starts with <speak>)");
    }
}
