//! English cardinal number words with the output of `inflect.engine().number_to_words(digits)`
//! (default arguments) for a string of ASCII digits, as the official English text frontend uses
//! for every digit run.
//!
//! inflect's conventions: groups of three from the right named thousand, million, … decillion;
//! "hundred and …" inside a group; groups joined by ", "; when the lowest group is below 100 and
//! there are higher groups, it is joined with " and " instead ("one thousand and one"); tens are
//! hyphenated ("forty-two"); leading zeros are ignored; all zeros read "zero".

const UNITS: [&str; 10] = ["", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"];
const TEENS: [&str; 10] = [
    "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
];
const TENS: [&str; 10] = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"];
const SCALES: [&str; 12] = [
    "", " thousand", " million", " billion", " trillion", " quadrillion", " quintillion", " sextillion",
    " septillion", " octillion", " nonillion", " decillion",
];

fn below_hundred(tens: usize, units: usize) -> String {
    match tens {
        1 => TEENS[units].to_string(),
        0 => UNITS[units].to_string(),
        t if units == 0 => TENS[t].to_string(),
        t => format!("{}-{}", TENS[t], UNITS[units]),
    }
}

fn group_words(hundreds: usize, tens: usize, units: usize) -> String {
    if hundreds == 0 {
        return below_hundred(tens, units);
    }
    let mut s = format!("{} hundred", UNITS[hundreds]);
    if tens != 0 || units != 0 {
        s.push_str(" and ");
        s.push_str(&below_hundred(tens, units));
    }
    s
}

/// Words for a run of ASCII digits. Runs longer than inflect's range (36 digits; inflect raises
/// there) are read digit by digit.
pub fn digits_to_words(digits: &str) -> String {
    let values: Vec<usize> = digits.bytes().filter(u8::is_ascii_digit).map(|b| (b - b'0') as usize).collect();
    let significant: &[usize] = {
        let first = values.iter().position(|&d| d != 0).unwrap_or(values.len());
        &values[first..]
    };
    if significant.is_empty() {
        return "zero".to_string();
    }
    if significant.len() > 3 * SCALES.len() {
        return significant.iter().map(|&d| if d == 0 { "zero" } else { UNITS[d] }).collect::<Vec<_>>().join(" ");
    }
    // Groups of three digits from the right: (scale index, value digits).
    let mut groups: Vec<(usize, [usize; 3])> = Vec::new();
    let mut end = significant.len();
    let mut scale = 0;
    while end > 0 {
        let start = end.saturating_sub(3);
        let mut g = [0usize; 3];
        for (slot, &d) in g[3 - (end - start)..].iter_mut().zip(&significant[start..end]) {
            *slot = d;
        }
        groups.push((scale, g));
        end = start;
        scale += 1;
    }
    groups.reverse();
    let lowest_value = groups.last().map_or(0, |(_, g)| g[0] * 100 + g[1] * 10 + g[2]);
    let phrases: Vec<String> = groups
        .iter()
        .filter(|(_, g)| g.iter().any(|&d| d != 0))
        .map(|(s, g)| format!("{}{}", group_words(g[0], g[1], g[2]), SCALES[*s]))
        .collect();
    if phrases.len() > 1 && lowest_value != 0 && lowest_value < 100 {
        let (last, head) = phrases.split_last().expect("more than one phrase");
        format!("{} and {}", head.join(", "), last)
    } else {
        phrases.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::digits_to_words as w;

    #[test]
    fn inflect_cases() {
        let cases = [
            ("0", "zero"), ("00", "zero"), ("1", "one"), ("01", "one"), ("7", "seven"), ("10", "ten"),
            ("12", "twelve"), ("20", "twenty"), ("42", "forty-two"), ("100", "one hundred"),
            ("101", "one hundred and one"), ("110", "one hundred and ten"), ("415", "four hundred and fifteen"),
            ("0198", "one hundred and ninety-eight"), ("1000", "one thousand"), ("1001", "one thousand and one"),
            ("1010", "one thousand and ten"), ("1100", "one thousand, one hundred"),
            ("1204", "one thousand, two hundred and four"), ("1234", "one thousand, two hundred and thirty-four"),
            ("12345", "twelve thousand, three hundred and forty-five"), ("21000", "twenty-one thousand"),
            ("100000", "one hundred thousand"), ("1000000", "one million"), ("1000001", "one million and one"),
            ("1001000", "one million, one thousand"), ("2000000000", "two billion"),
        ];
        for (digits, words) in cases {
            assert_eq!(w(digits), words, "{digits}");
        }
    }
}
