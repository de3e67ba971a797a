//! The SSML subset (docs/text.md), read only when a text starts with `<speak` (never guessed
//! from a stray `<`): it becomes plain text for the same text layer, breaks as pause tags
//! (`frontend::pause`), phonemes as CosyVoice3's phoneme tokens (`frontend::lexicon`).
//!
//! `<speak>`, `<break time="500ms"/>` (or `strength`), `<sub alias="…">`,
//! `<say-as interpret-as="characters|cardinal|telephone">`, `<phoneme alphabet="cmu|pinyin" ph="…">`.
//! Anything else, or markup that is not well-formed XML, is one error naming its line and column.

use roxmltree::{Document, Node};

use crate::error::{Error, Result};
use crate::frontend::lexicon::{is_pinyin_syllable, Pronunciation};

/// Whether `text` is SSML: it starts with a `<speak>` element.
pub fn is_ssml(text: &str) -> bool {
    let start = text.trim_start();
    start.starts_with("<speak>") || start.starts_with("<speak ") || start.starts_with("<?xml")
}

/// The text an SSML document says, with its breaks as pause tags.
pub fn to_text(ssml: &str) -> Result<String> {
    let doc = Document::parse(ssml).map_err(|e| Error::invalid(format!("invalid SSML: {e}")))?;
    let root = doc.root_element();
    if root.tag_name().name() != "speak" {
        return Err(at(&doc, root, format!("the root element is <{}>, not <speak>", root.tag_name().name())));
    }
    let mut out = String::new();
    children(&doc, root, &mut out)?;
    Ok(out.trim().to_string())
}

fn at(doc: &Document<'_>, node: Node<'_, '_>, msg: String) -> Error {
    let pos = doc.text_pos_at(node.range().start);
    Error::invalid(format!("invalid SSML at line {}, column {}: {msg}", pos.row, pos.col))
}

fn children(doc: &Document<'_>, node: Node<'_, '_>, out: &mut String) -> Result<()> {
    for child in node.children() {
        if child.is_text() {
            out.push_str(child.text().unwrap_or(""));
        } else if child.is_element() {
            element(doc, child, out)?;
        }
    }
    Ok(())
}

/// All the text inside `node`.
fn inner_text(node: Node<'_, '_>) -> String {
    node.descendants().filter(|n| n.is_text()).filter_map(|n| n.text()).collect()
}

fn element(doc: &Document<'_>, node: Node<'_, '_>, out: &mut String) -> Result<()> {
    let name = node.tag_name().name();
    let attr = |key: &str| node.attribute(key);
    let need = |key: &str| attr(key).ok_or_else(|| at(doc, node, format!("<{name}> needs a {key} attribute")));
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
                    other => return Err(at(doc, node, format!("<break strength={other:?}>: allowed: none, x-weak, weak, medium, strong, x-strong"))),
                }
                .to_string(),
            };
            if !crate::frontend::pause::is_pause_length(&time) {
                return Err(at(doc, node, format!("<break time={time:?}>: give seconds or milliseconds up to 10 s, as \"0.5s\" or \"500ms\"")));
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
                other => return Err(at(doc, node, format!("<say-as interpret-as={other:?}>: allowed: characters, cardinal, telephone"))),
            }
        }
        "phoneme" => {
            let ph: Vec<String> = need("ph")?.split_whitespace().map(str::to_string).collect();
            if ph.is_empty() {
                return Err(at(doc, node, "<phoneme> has an empty ph".into()));
            }
            let pronunciation = match need("alphabet")? {
                "cmu" => Pronunciation::Cmu(ph),
                "pinyin" => {
                    if let Some(bad) = ph.iter().find(|s| !is_pinyin_syllable(s)) {
                        return Err(at(doc, node, format!("<phoneme> pinyin {bad:?}: a syllable is letters, then a tone digit 1-5 or none")));
                    }
                    Pronunciation::Pinyin(ph)
                }
                other => return Err(at(doc, node, format!("<phoneme alphabet={other:?}>: allowed: cmu, pinyin"))),
            };
            out.push_str(&pronunciation.spoken());
        }
        other => return Err(at(doc, node, format!("<{other}> is not in the SSML cosy reads (speak, break, sub, say-as, phoneme)"))),
    }
    Ok(())
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
        assert!(err("<speak>Hi <break time=\"5\"></speak>").starts_with("invalid SSML: "), "{}", err("<speak>Hi <break time=\"5\"></speak>"));
        assert!(err("<speak>Hi <break time=\"5\"></speak>").contains("1:"));
        assert_eq!(err("<speak>Hi\n <break time=\"11s\"/></speak>"), "invalid SSML at line 2, column 2: <break time=\"11s\">: give seconds or milliseconds up to 10 s, as \"0.5s\" or \"500ms\"");
        assert_eq!(err("<speak><prosody rate=\"slow\">x</prosody></speak>"), "invalid SSML at line 1, column 8: <prosody> is not in the SSML cosy reads (speak, break, sub, say-as, phoneme)");
        assert_eq!(err("<speak><sub>x</sub></speak>"), "invalid SSML at line 1, column 8: <sub> needs a alias attribute");
        assert_eq!(err("<speak><say-as interpret-as=\"date\">x</say-as></speak>"), "invalid SSML at line 1, column 8: <say-as interpret-as=\"date\">: allowed: characters, cardinal, telephone");
    }
}
