//! The reading of Markdown and chat text: a table of inputs and the exact text each becomes,
//! whole and in random chunkings; plain text as written; deep nesting and long lines.

use super::*;

const ON: MarkdownSettings = MarkdownSettings::ON;

/// (input, what the model's frontend gets).
const TABLE: &[(&str, &str)] = &[
    // Plain text: as written.
    ("Hello world.", "Hello world."),
    ("1. Hello", "1. Hello"),
    ("a * b", "a * b"),
    ("C# and F#", "C# and F#"),
    ("it's 5 * 3", "it's 5 * 3"),
    ("snake_case_name", "snake_case_name"),
    ("Mr. Smith went to Washington. He said hi!", "Mr. Smith went to Washington. He said hi!"),
    ("It costs 3.5 dollars! And more", "It costs 3.5 dollars! And more"),
    ("Line one\nline two", "Line one\nline two"),
    ("你好，世界。今天天气很好！", "你好，世界。今天天气很好！"),
    ("Use Node.js and config.toml, e.g. here.", "Use Node.js and config.toml, e.g. here."),
    ("2 < 3 and 5 > 4", "2 < 3 and 5 > 4"),
    // The issue's reply.
    (
        "**Bold** claim: see [the docs](https://example.com/a_b?x=1) 😀 and `cargo build`. Then - item one\n- item two",
        "Bold claim: see the docs and cargo build. Then - item one.\nitem two",
    ),
    // Emphasis and headings.
    ("*Really* __great__ ~~bad~~ work", "Really great bad work"),
    ("# Title\n\nSome text.", "Title.\n\nSome text."),
    ("## 安装\n运行命令", "安装。\n运行命令"),
    ("Intro\n=====\nBody", "Intro.\n\nBody"),
    // Lists.
    ("- apples\n- pears\n- plums", "apples.\npears.\nplums"),
    ("* one\n* two", "one.\ntwo"),
    ("1. First step\n2. Second step", "1. First step.\n2. Second step"),
    ("3) c\n4) d", "3) c.\n4) d"),
    ("- outer\n  - inner\n- last", "outer.\ninner.\nlast"),
    ("Shopping:\n\n- milk\n- eggs", "Shopping:\n\nmilk.\neggs"),
    // Paragraphs end a sentence.
    ("First paragraph\n\nSecond paragraph", "First paragraph.\n\nSecond paragraph"),
    ("> Quoted wisdom\n\nReply", "Quoted wisdom.\n\nReply"),
    // Tables.
    ("| Name | Age |\n|------|-----|\n| Ann | 30 |\n| Bob | 41 |", "Name, Age.\n\nAnn, 30.\nBob, 41"),
    // Code.
    ("Run:\n\n```rust\nfn main() {}\n```\n\nDone.", "Run:\n\nrust code block.\n\nDone."),
    ("```\nls -la\n```", "code block"),
    ("看代码：\n```python\nprint(1)\n```", "看代码：\npython 代码块"),
    ("Type `a*b*c` now", "Type a*b*c now"),
    // Links, URLs, e-mails, paths.
    ("Read [the guide](https://x.org/guide).", "Read the guide."),
    ("See https://docs.rs/ort for more.", "See docs dot rs slash ort for more."),
    ("Visit www.example.com today", "Visit www dot example dot com today"),
    ("Mail jane.doe@example.com please", "Mail jane dot doe at example dot com please"),
    ("Open /etc/hosts and ~/notes/todo.txt", "Open slash etc slash hosts and tilde slash notes slash todo dot txt"),
    ("(see example.com).", "(see example dot com)."),
    ("<https://example.com/a-b>", "example dot com slash a dash b"),
    // Emoji and symbols.
    ("Great job 🎉", "Great job"),
    ("🎉 Done 👍🏽!", "Done!"),
    ("I ❤️ Rust", "I Rust"),
    // HTML and CosyVoice3's markup.
    ("Hello <b>world</b><br>again", "Hello worldagain"),
    ("<div>\nInside\n</div>", "\nInside"),
    ("A <!-- note --> b", "A  b"),
    ("[breath] Well, <strong>this</strong> is [laughter] fun.", "[breath] Well, <strong>this</strong> is [laughter] fun."),
    ("<laughter>哈哈</laughter>好的", "<laughter>哈哈</laughter>好的"),
    ("Read [R][IY1][D] now [quick_breath] ok", "Read [R][IY1][D] now [quick_breath] ok"),
    ("报道[j][ǐ]予", "报道[j][ǐ]予"),
    ("[AA1] and [ni3]", "[AA1] and [ni3]"),
    // Units after a number (text.units, on by default); phone numbers are left to the normaliser
    // by default (text.phone: `categories_switch_their_readings`).
    ("I ran 5 km in **30 min**. Then 1 km more at 20°C.", "I ran 5 kilometers in 30 minutes. Then 1 kilometer more at 20 degrees Celsius."),
    ("- 3 MB\n- 2 GB/s", "3 megabytes.\n2 gigabytes per second"),
    ("Call +1 555-0123 now.", "Call +1 555-0123 now."),
    ("我跑了5 km。", "我跑了5 km。"),
];

/// `text` cut at random places (never inside a character), seeded.
fn chunkings(text: &str, seed: u64, count: usize) -> Vec<Vec<String>> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).skip(1).collect();
    (0..count)
        .map(|k| {
            let mut cuts: Vec<usize> = match k {
                0 => bounds.clone(),
                _ => bounds.iter().copied().filter(|_| next() % 4 == 0).collect(),
            };
            cuts.push(text.len());
            let mut from = 0;
            cuts.into_iter()
                .map(|c| {
                    let piece = text[from..c].to_string();
                    from = c;
                    piece
                })
                .collect()
        })
        .collect()
}

fn streamed(pieces: &[String], settings: MarkdownSettings) -> String {
    let mut stream = MarkdownStream::new(settings);
    let mut out: String = pieces.iter().map(|p| stream.push(p)).collect();
    out.push_str(&stream.finish());
    out
}

#[test]
fn the_table_reads_as_written_down() {
    let mut wrong = Vec::new();
    for (input, expected) in TABLE {
        let got = to_speech(input, ON);
        if got != *expected {
            wrong.push(format!("{input:?}\n   got {got:?}\n  want {expected:?}"));
        }
    }
    assert!(wrong.is_empty(), "{} of {}:\n{}", wrong.len(), TABLE.len(), wrong.join("\n"));
    assert!(TABLE.len() >= 40);
}

#[test]
fn the_table_reads_the_same_in_any_chunking() {
    for (n, (input, _)) in TABLE.iter().enumerate() {
        let whole = to_speech(input, ON);
        for (k, pieces) in chunkings(input, n as u64, 12).iter().enumerate() {
            assert_eq!(streamed(pieces, ON), whole, "chunking {k} of {input:?}: {pieces:?}");
        }
    }
}

/// Constructs cut where they hurt: `**` in one piece and the rest in the next, a fence open over
/// many pieces, a list item split mid-line.
#[test]
fn constructs_split_across_pieces_read_as_whole() {
    let cases: &[&[&str]] = &[
        &["This is **", "bold", "** text. And more."],
        &["Intro. ", "```", "rust\nfn a() {}\n", "let x = 1;\n", "```", "\nAfter."],
        &["- item o", "ne\n- item", " two\n"],
        &["See the docs. *Really", "* they help. Then https://exa", "mple.com/x now."],
        &["A first sentence. Second **bold. still** bold. Third."],
    ];
    for pieces in cases {
        let pieces: Vec<String> = pieces.iter().map(|p| p.to_string()).collect();
        assert_eq!(streamed(&pieces, ON), to_speech(&pieces.concat(), ON), "{pieces:?}");
    }
    assert_eq!(to_speech("This is **bold** text. And more.", ON), "This is bold text. And more.");
}

/// A plain sentence goes out as soon as it is settled (not at the paragraph's end), so that
/// streamed speech starts early.
#[test]
fn a_plain_sentence_goes_out_before_its_paragraph_ends() {
    let mut stream = MarkdownStream::new(ON);
    assert_eq!(stream.push("Hello there. "), "", "the next words may be Markdown");
    assert_eq!(stream.push("Ho"), "Hello there. ");
    assert_eq!(stream.push("w are you? Fine"), "How are you? ");
    assert_eq!(stream.push("\n- item"), "", "the next line may yet be a paragraph's");
    assert_eq!(stream.push("\n- more\n"), "Fine.\nitem", "a block is owed its end mark once the next starts");
    assert_eq!(stream.finish(), ".\nmore");
    // Something that may be Markdown waits for its line.
    let mut stream = MarkdownStream::new(ON);
    assert_eq!(stream.push("A *b. C"), "");
    assert_eq!(stream.push("* d.\n\nNext"), "");
    assert_eq!(stream.push(" one\n"), "A b. C d.");
}

#[test]
fn settings_choose_code_blocks_and_symbols() {
    let text = "Look 😀:\n\n```sh\necho hi\n```";
    let with = |code_blocks, symbols| to_speech(text, MarkdownSettings { code_blocks, symbols, ..ON });
    assert_eq!(with(CodeBlocks::StandIn, Symbols::Drop), "Look:\n\nsh code block");
    assert_eq!(with(CodeBlocks::Skip, Symbols::Drop), "Look:\n\n");
    assert_eq!(with(CodeBlocks::Read, Symbols::Keep), "Look 😀:\n\necho hi");
    assert_eq!(with(CodeBlocks::Skip, Symbols::Name), "Look grinning face:\n\n");
    let named = |text: &str| to_speech(text, MarkdownSettings { symbols: Symbols::Name, ..ON });
    assert_eq!(named("Great job 🎉"), "Great job party popper");
    assert_eq!(named("I ❤️ Rust, 👍🏽!"), "I red heart Rust, thumbs up!");
    assert_eq!(named("Wow😀yes"), "Wow grinning face yes");
}

/// Deep nesting and a very long line: it returns (no panic, no stack overflow); time and memory
/// stay bounded (no clock is read: the test only has to end).
#[test]
fn deep_nesting_and_long_lines_return() {
    for text in [
        ">".repeat(10_000),
        "*".repeat(10_000),
        format!("{}x{}", "*".repeat(10_000), "*".repeat(10_000)),
        "- ".repeat(10_000),
        "[".repeat(10_000),
        format!("{}x", "  ".repeat(5_000)),
        "word ".repeat(40_000),
        "`".repeat(10_000),
    ] {
        let whole = to_speech(&text, ON);
        assert!(whole.len() <= text.len() * 4, "{}", whole.len());
        // Streamed text is bounded by `limits.max_text_chars` (the sessions refuse more), and a
        // paragraph's line is looked at again at each piece: a long one, not the longest.
        let streamed_text = &text[..text.len().min(20_000)];
        let pieces: Vec<String> = streamed_text.as_bytes().chunks(997).map(|c| String::from_utf8_lossy(c).into_owned()).collect();
        let _ = streamed(&pieces, ON);
    }
}

/// Each category of the layer switched on and off: off leaves that category's text as written,
/// and the new readings (phone numbers, units) read the same in any chunking.
#[test]
fn categories_switch_their_readings() {
    let text = "Mail jane@example.com or call +1 (415) 555-0198 🎉. It is 5 km away, 3 MB.\n\n**Done** at https://docs.rs/ort";
    let all = MarkdownSettings { phone: true, symbols: Symbols::Name, ..ON };
    assert_eq!(
        to_speech(text, all),
        "Mail jane at example dot com or call plus 1, 4 1 5, 5 5 5, 0 1 9 8 party popper. It is 5 kilometers away, 3 megabytes.\n\nDone at docs dot rs slash ort"
    );
    assert_eq!(
        to_speech(text, MarkdownSettings { urls: false, ..all }),
        "Mail jane@example.com or call plus 1, 4 1 5, 5 5 5, 0 1 9 8 party popper. It is 5 kilometers away, 3 megabytes.\n\nDone at https://docs.rs/ort"
    );
    assert_eq!(
        to_speech(text, MarkdownSettings { phone: false, units: false, symbols: Symbols::Keep, ..all }),
        "Mail jane at example dot com or call +1 (415) 555-0198 🎉. It is 5 km away, 3 MB.\n\nDone at docs dot rs slash ort"
    );
    for settings in [all, ON, MarkdownSettings { urls: false, units: false, ..all }] {
        let whole = to_speech(text, settings);
        for (k, pieces) in chunkings(text, 7, 24).iter().enumerate() {
            assert_eq!(streamed(pieces, settings), whole, "chunking {k} with {settings:?}: {pieces:?}");
        }
    }
}
