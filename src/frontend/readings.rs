//! Readings of plain English text that the official frontend does not make on its own when its
//! normaliser is not run (`text.normalizer = "none"`, or numbers turned off): phone numbers read
//! digit by digit in groups, and unit abbreviations after a number read as words (issue 32,
//! point 2; docs/text.md). Both take only unambiguous patterns (a strict phone pattern; a unit
//! from a closed table, right after a number) and leave Chinese sentences to the normaliser
//! (wetext reads measures and numbers in Chinese its own way).
//!
//! The Markdown layer (`frontend::markdown`) applies them to each run of plain text it reads;
//! SSML's `<say-as interpret-as="telephone">` uses [`telephone`] too: one reading of a phone
//! number.

use std::borrow::Cow;
use std::sync::OnceLock;

use regex::Regex;

use crate::frontend::text::contains_chinese;

/// A phone number read digit by digit in groups: each run of digits a group, its digits apart,
/// the groups joined by ", ", `+` said "plus" ("+1 555-0123" → "plus 1, 5 5 5, 0 1 2 3").
pub fn telephone(text: &str) -> String {
    let groups: Vec<String> = text
        .split(|c: char| !c.is_ascii_digit() && c != '+')
        .filter(|g| !g.is_empty())
        .map(|g| g.chars().map(|c| if c == '+' { "plus".to_string() } else { c.to_string() }).collect::<Vec<_>>().join(" "))
        .collect();
    groups.join(", ")
}

/// The unit table: what is written right after a number, and what is said for one and for
/// several. Case matters (`MB`, not `mb`). Left out on purpose, being ambiguous after a number:
/// `m` (metres, minutes, million), `s`, `h`, `g`, `in`, `L`, `W`, `V`, and `%` (the official
/// normaliser reads it already; a golden case holds one).
pub const UNITS: &[(&str, &str, &str)] = &[
    ("km/h", "kilometer per hour", "kilometers per hour"),
    ("kph", "kilometer per hour", "kilometers per hour"),
    ("mph", "mile per hour", "miles per hour"),
    ("m/s", "meter per second", "meters per second"),
    ("km", "kilometer", "kilometers"),
    ("cm", "centimeter", "centimeters"),
    ("mm", "millimeter", "millimeters"),
    ("mi", "mile", "miles"),
    ("ft", "foot", "feet"),
    ("kg", "kilogram", "kilograms"),
    ("mg", "milligram", "milligrams"),
    ("lb", "pound", "pounds"),
    ("lbs", "pound", "pounds"),
    ("oz", "ounce", "ounces"),
    ("ml", "milliliter", "milliliters"),
    ("mL", "milliliter", "milliliters"),
    ("°C", "degree Celsius", "degrees Celsius"),
    ("℃", "degree Celsius", "degrees Celsius"),
    ("°F", "degree Fahrenheit", "degrees Fahrenheit"),
    ("℉", "degree Fahrenheit", "degrees Fahrenheit"),
    ("°", "degree", "degrees"),
    ("KB", "kilobyte", "kilobytes"),
    ("kB", "kilobyte", "kilobytes"),
    ("MB", "megabyte", "megabytes"),
    ("GB", "gigabyte", "gigabytes"),
    ("TB", "terabyte", "terabytes"),
    ("MB/s", "megabyte per second", "megabytes per second"),
    ("GB/s", "gigabyte per second", "gigabytes per second"),
    ("Mbps", "megabit per second", "megabits per second"),
    ("Gbps", "gigabit per second", "gigabits per second"),
    ("ms", "millisecond", "milliseconds"),
    ("min", "minute", "minutes"),
    ("mins", "minute", "minutes"),
    ("hr", "hour", "hours"),
    ("hrs", "hour", "hours"),
    ("Hz", "hertz", "hertz"),
    ("kHz", "kilohertz", "kilohertz"),
    ("MHz", "megahertz", "megahertz"),
    ("GHz", "gigahertz", "gigahertz"),
    ("kW", "kilowatt", "kilowatts"),
    ("kWh", "kilowatt hour", "kilowatt hours"),
    ("mAh", "milliamp hour", "milliamp hours"),
];

fn phone_pattern() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        // `+` and a country code, then groups (one may be in brackets) with at most one
        // separator between them; or a North American number, `(415) 555-0198`, `415-555-0198`.
        Regex::new(r"\+\d{1,3}(?:[ .\-]?(?:\(\d{1,4}\)|\d{1,4})){2,6}|\(\d{3}\) ?\d{3}-\d{4}|\d{3}-\d{3}-\d{4}").expect("static regex")
    })
}

fn unit_pattern() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        let mut units: Vec<&str> = UNITS.iter().map(|(written, _, _)| *written).collect();
        // The longest first: "km/h" before "km", "°C" before "°".
        units.sort_by_key(|u| std::cmp::Reverse(u.len()));
        let alternatives: Vec<String> = units.iter().map(|u| regex::escape(u)).collect();
        Regex::new(&format!(r"(\d+(?:[.,]\d+)*)[ \u{{00A0}}]?({})", alternatives.join("|"))).expect("static regex")
    })
}

/// What may stand right before a phone number or a number with a unit: nothing, a blank, an
/// opening bracket or quote, a sign.
fn opens(before: Option<char>) -> bool {
    before.is_none_or(|c| c.is_whitespace() || matches!(c, '(' | '[' | '"' | '\'' | '“' | '‘' | '~' | '≈' | '-' | '−'))
}

/// What may stand right after one: nothing, a blank, punctuation that ends a word (a `.` or `,`
/// not followed by a digit).
fn closes(after: &str) -> bool {
    let mut chars = after.chars();
    match chars.next() {
        None => true,
        Some(c) if c.is_whitespace() => true,
        Some('.' | ',') => !chars.next().is_some_and(|n| n.is_ascii_digit()),
        Some(c) => matches!(c, ';' | ':' | '!' | '?' | ')' | ']' | '"' | '\'' | '”' | '’'),
    }
}

/// `text` with its phone numbers (`phone`) and units (`units`) read, in sentences without
/// Chinese. Decided sentence by sentence (a sentence ends after `. ! ? ;` and a blank, after
/// `。！？；` or at a line break), so text cut at a sentence end reads as it does whole.
pub fn read(text: &str, phone: bool, units: bool) -> Cow<'_, str> {
    if !(phone || units) || !text.bytes().any(|b| b.is_ascii_digit()) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for sentence in sentences(text) {
        if contains_chinese(sentence) || !sentence.bytes().any(|b| b.is_ascii_digit()) {
            out.push_str(sentence);
            continue;
        }
        let read = if phone { read_phones(sentence) } else { Cow::Borrowed(sentence) };
        let read = if units { Cow::Owned(read_units(&read).into_owned()) } else { read };
        out.push_str(&read);
    }
    Cow::Owned(out)
}

/// `text` cut after each sentence end (with the blanks after it) and line break.
fn sentences(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let mut end = i + c.len_utf8();
        match c {
            '。' | '！' | '？' | '；' | '\n' | '\r' => {}
            '.' | '!' | '?' | ';' if chars.peek().is_some_and(|(_, n)| n.is_whitespace()) => {
                while let Some((j, n)) = chars.peek().copied().filter(|(_, n)| n.is_whitespace()) {
                    end = j + n.len_utf8();
                    chars.next();
                }
            }
            _ => continue,
        }
        pieces.push(&text[start..end]);
        start = end;
    }
    if start < text.len() {
        pieces.push(&text[start..]);
    }
    pieces
}

fn read_phones(text: &str) -> Cow<'_, str> {
    replace_bounded(text, phone_pattern(), |m| telephone(m.get(0).map_or("", |w| w.as_str())))
}

fn read_units(text: &str) -> Cow<'_, str> {
    replace_bounded(text, unit_pattern(), |m| {
        let number = m.get(1).map_or("", |n| n.as_str());
        let written = m.get(2).map_or("", |u| u.as_str());
        let (one, many) = UNITS.iter().find(|(w, _, _)| *w == written).map_or((written, written), |(_, one, many)| (*one, *many));
        format!("{number} {}", if number == "1" { one } else { many })
    })
}

/// `text` with each match of `pattern` that stands on its own ([`opens`], [`closes`]) replaced.
fn replace_bounded<'t>(text: &'t str, pattern: &Regex, reading: impl Fn(&regex::Captures<'_>) -> String) -> Cow<'t, str> {
    let mut out = String::new();
    let mut last = 0;
    for captures in pattern.captures_iter(text) {
        let Some(whole) = captures.get(0) else { continue };
        if !opens(text[..whole.start()].chars().next_back()) || !closes(&text[whole.end()..]) {
            continue;
        }
        out.push_str(&text[last..whole.start()]);
        out.push_str(&reading(&captures));
        last = whole.end();
    }
    if last == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[last..]);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phone_numbers_are_read_in_groups() {
        let phone = |t: &str| read(t, true, false).into_owned();
        assert_eq!(phone("Call +1 555-0123 now."), "Call plus 1, 5 5 5, 0 1 2 3 now.");
        assert_eq!(phone("Call +1 (415) 555-0198 before six."), "Call plus 1, 4 1 5, 5 5 5, 0 1 9 8 before six.");
        assert_eq!(phone("Ring (415) 555-0198, or 415-555-0198."), "Ring 4 1 5, 5 5 5, 0 1 9 8, or 4 1 5, 5 5 5, 0 1 9 8.");
        assert_eq!(phone("UK: +44 20 7946 0958"), "UK: plus 4 4, 2 0, 7 9 4 6, 0 9 5 8");
        // Not phone numbers: dates, ranges, versions, sums, numbers in words or addresses.
        for plain in ["On 2024-03-05 at 6:30.", "Pages 10-20 and 1990-2000.", "Version 1.2.3", "It is 555-0123 maybe", "1+1 = 2", "id555-123-4567", "x.com/+15550123456", "+1 5"] {
            assert_eq!(phone(plain), plain);
        }
        // Chinese sentences are the normaliser's.
        assert_eq!(phone("请拨打+86 138 1234 5678。Call +1 555-0123."), "请拨打+86 138 1234 5678。Call plus 1, 5 5 5, 0 1 2 3.");
    }

    #[test]
    fn units_after_a_number_are_read() {
        let units = |t: &str| read(t, false, true).into_owned();
        assert_eq!(units("I ran 5 km and 1 km more."), "I ran 5 kilometers and 1 kilometer more.");
        assert_eq!(units("It was 20°C (68 °F) today"), "It was 20 degrees Celsius (68 degrees Fahrenheit) today");
        assert_eq!(units("A 3 MB file at 100 km/h, 2.5kg, 90°."), "A 3 megabytes file at 100 kilometers per hour, 2.5 kilograms, 90 degrees.");
        assert_eq!(units("-5°C"), "-5 degrees Celsius");
        // Not units: no number right before, an ambiguous or unknown abbreviation, a longer word.
        for plain in ["km is a unit", "3.5 m long", "5 kms", "A4 mm", "example.com/5km", "15% off", "5 mbps", "50 Min", "3 in 4", "5 kmx", "5 km/s"] {
            assert_eq!(units(plain), plain);
        }
        assert_eq!(units("我跑了5 km。"), "我跑了5 km。", "a Chinese sentence is the normaliser's");
    }

    #[test]
    fn off_reads_nothing_and_telephone_is_ssmls_rule() {
        assert_eq!(read("Call +1 555-0123, 5 km", false, false), "Call +1 555-0123, 5 km");
        assert_eq!(telephone("+1 555-0123"), "plus 1, 5 5 5, 0 1 2 3");
    }
}
