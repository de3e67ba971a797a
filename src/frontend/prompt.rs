//! Prompt modes of CosyVoice3 and the `<|endofprompt|>` rules (§3.3, §3.5).
//!
//! `CosyVoice3LM` asserts that `<|endofprompt|>` occurs in `prompt_text ++ tts_text`. Where the
//! official call would hit that assert because the caller left the marker out, we add the
//! training-time system prompt instead (see each mode). Text that already holds the marker is
//! used unchanged.
//!
//! | mode | LLM prompt text | LLM prompt speech | flow prompt |
//! |---|---|---|---|
//! | zero-shot | system prompt + transcript | yes | prompt mel, tokens, embedding |
//! | cross-lingual | none (system prompt goes in front of the tts text) | no | same |
//! | instruct | system prompt + instruction + marker | no | same |
//! | raw | as given | as chosen | same |

use crate::frontend::text::bypasses_frontend;
use crate::frontend::tokenizer::ENDOFPROMPT;

/// The system prompt CosyVoice3 was trained with, marker included.
pub const SYSTEM_PROMPT: &str = "You are a helpful assistant.<|endofprompt|>";

/// The 26 instructions the model knows (`instruct_list` in `cosyvoice/utils/common.py`).
pub const KNOWN_INSTRUCTIONS: [&str; 26] = [
    "You are a helpful assistant. 请用广东话表达。<|endofprompt|>",
    "You are a helpful assistant. 请用东北话表达。<|endofprompt|>",
    "You are a helpful assistant. 请用甘肃话表达。<|endofprompt|>",
    "You are a helpful assistant. 请用贵州话表达。<|endofprompt|>",
    "You are a helpful assistant. 请用河南话表达。<|endofprompt|>",
    "You are a helpful assistant. 请用湖北话表达。<|endofprompt|>",
    "You are a helpful assistant. 请用湖南话表达。<|endofprompt|>",
    "You are a helpful assistant. 请用江西话表达。<|endofprompt|>",
    "You are a helpful assistant. 请用闽南话表达。<|endofprompt|>",
    "You are a helpful assistant. 请用宁夏话表达。<|endofprompt|>",
    "You are a helpful assistant. 请用山西话表达。<|endofprompt|>",
    "You are a helpful assistant. 请用陕西话表达。<|endofprompt|>",
    "You are a helpful assistant. 请用山东话表达。<|endofprompt|>",
    "You are a helpful assistant. 请用上海话表达。<|endofprompt|>",
    "You are a helpful assistant. 请用四川话表达。<|endofprompt|>",
    "You are a helpful assistant. 请用天津话表达。<|endofprompt|>",
    "You are a helpful assistant. 请用云南话表达。<|endofprompt|>",
    "You are a helpful assistant. Please say a sentence as loudly as possible.<|endofprompt|>",
    "You are a helpful assistant. Please say a sentence in a very soft voice.<|endofprompt|>",
    "You are a helpful assistant. 请用尽可能慢地语速说一句话。<|endofprompt|>",
    "You are a helpful assistant. 请用尽可能快地语速说一句话。<|endofprompt|>",
    "You are a helpful assistant. 请非常开心地说一句话。<|endofprompt|>",
    "You are a helpful assistant. 请非常伤心地说一句话。<|endofprompt|>",
    "You are a helpful assistant. 请非常生气地说一句话。<|endofprompt|>",
    "You are a helpful assistant. 我想体验一下小猪佩奇风格，可以吗？<|endofprompt|>",
    "You are a helpful assistant. 你可以尝试用机器人的方式解答吗？<|endofprompt|>",
];

const INSTRUCT_PREFIX: &str = "You are a helpful assistant. ";

/// How the prompt is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptMode {
    /// Voice cloning from a prompt recording and its transcript (`inference_zero_shot`).
    ZeroShot { transcript: String },
    /// Voice from the recording only; no prompt text or prompt speech in the LLM
    /// (`inference_cross_lingual`).
    CrossLingual,
    /// Style/dialect instruction plus the recording's voice (`inference_instruct2`). Free text or
    /// one of [`KNOWN_INSTRUCTIONS`] (with or without its prefix and marker).
    Instruct { instruction: String },
    /// Everything as given: `prompt_text` verbatim, prompt speech to the LLM when asked.
    Raw { prompt_text: String, llm_prompt_speech: bool },
}

/// What the rest of the pipeline needs from the prompt mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptPlan {
    /// Text tokenized as the LLM prompt text (may be empty).
    pub prompt_text: String,
    /// Text to synthesise (goes to the text frontend when `text_frontend` is true).
    pub tts_text: String,
    /// Whether the prompt speech tokens go to the LLM (the flow always gets them).
    pub llm_prompt_speech: bool,
    /// Whether the text frontend (normalisation and sentence splitting) runs on `tts_text`.
    /// False when `tts_text` holds `<|…|>` markup, as in the official code.
    pub text_frontend: bool,
}

/// Returns the official instruct string for `instruction` when it is one of the 26 known ones
/// (given whole, or as the bare sentence between the prefix and the marker).
pub fn known_instruction(instruction: &str) -> Option<&'static str> {
    let bare = instruction.trim();
    KNOWN_INSTRUCTIONS.iter().copied().find(|known| {
        *known == bare
            || known
                .strip_prefix(INSTRUCT_PREFIX)
                .and_then(|k| k.strip_suffix(ENDOFPROMPT))
                .is_some_and(|k| k == bare)
    })
}

/// Builds the plan for `mode` and the user's `tts_text`. `text_frontend` is the user's switch
/// (official `text_frontend=True` by default); markup in the final tts text turns it off.
pub fn plan(mode: &PromptMode, tts_text: &str, text_frontend: bool) -> PromptPlan {
    let has_marker = |s: &str| s.contains(ENDOFPROMPT);
    let (prompt_text, tts, llm_prompt_speech) = match mode {
        PromptMode::ZeroShot { transcript } => {
            let prompt = if has_marker(transcript) || has_marker(tts_text) {
                transcript.clone()
            } else {
                format!("{SYSTEM_PROMPT}{transcript}")
            };
            (prompt, tts_text.to_string(), true)
        }
        PromptMode::CrossLingual => {
            // The official usage puts the system prompt in front of the tts text, which also
            // bypasses the text frontend (the text holds `<|…|>`).
            let tts = if has_marker(tts_text) { tts_text.to_string() } else { format!("{SYSTEM_PROMPT}{tts_text}") };
            (String::new(), tts, false)
        }
        PromptMode::Instruct { instruction } => {
            let prompt = match known_instruction(instruction) {
                Some(known) => known.to_string(),
                None if has_marker(instruction) || has_marker(tts_text) => instruction.clone(),
                None => format!("{INSTRUCT_PREFIX}{}{ENDOFPROMPT}", instruction.trim()),
            };
            (prompt, tts_text.to_string(), false)
        }
        PromptMode::Raw { prompt_text, llm_prompt_speech } => {
            let prompt = if has_marker(prompt_text) || has_marker(tts_text) {
                prompt_text.clone()
            } else {
                format!("{SYSTEM_PROMPT}{prompt_text}")
            };
            (prompt, tts_text.to_string(), *llm_prompt_speech)
        }
    };
    let text_frontend = text_frontend && !bypasses_frontend(&tts);
    PromptPlan { prompt_text, tts_text: tts, llm_prompt_speech, text_frontend }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_shot_adds_system_prompt_once() {
        let p = plan(&PromptMode::ZeroShot { transcript: "Good evening.".into() }, "Hello there.", true);
        assert_eq!(p.prompt_text, "You are a helpful assistant.<|endofprompt|>Good evening.");
        assert_eq!(p.tts_text, "Hello there.");
        assert!(p.llm_prompt_speech && p.text_frontend);
        let given = "You are a helpful assistant.<|endofprompt|>大家好。";
        let p = plan(&PromptMode::ZeroShot { transcript: given.into() }, "晚安。", false);
        assert_eq!(p.prompt_text, given);
        assert!(!p.text_frontend);
    }

    #[test]
    fn cross_lingual_puts_marker_in_tts_text_and_bypasses_frontend() {
        let p = plan(&PromptMode::CrossLingual, "Hello [breath] world.", true);
        assert_eq!(p.prompt_text, "");
        assert_eq!(p.tts_text, "You are a helpful assistant.<|endofprompt|>Hello [breath] world.");
        assert!(!p.llm_prompt_speech);
        assert!(!p.text_frontend);
        let already = "You are a helpful assistant.<|endofprompt|>Hi.";
        assert_eq!(plan(&PromptMode::CrossLingual, already, true).tts_text, already);
    }

    #[test]
    fn instruct_known_and_free_text() {
        assert_eq!(KNOWN_INSTRUCTIONS.len(), 26);
        let p = plan(&PromptMode::Instruct { instruction: "请用广东话表达。".into() }, "你好。", true);
        assert_eq!(p.prompt_text, KNOWN_INSTRUCTIONS[0]);
        assert!(!p.llm_prompt_speech && p.text_frontend);
        let p = plan(&PromptMode::Instruct { instruction: KNOWN_INSTRUCTIONS[20].into() }, "你好。", true);
        assert_eq!(p.prompt_text, KNOWN_INSTRUCTIONS[20]);
        let p = plan(&PromptMode::Instruct { instruction: "Speak like a pirate.".into() }, "Ahoy.", true);
        assert_eq!(p.prompt_text, "You are a helpful assistant. Speak like a pirate.<|endofprompt|>");
        let own = "Be calm.<|endofprompt|>";
        assert_eq!(plan(&PromptMode::Instruct { instruction: own.into() }, "x", true).prompt_text, own);
    }

    #[test]
    fn raw_keeps_text_unless_marker_missing_everywhere() {
        let p = plan(&PromptMode::Raw { prompt_text: "abc".into(), llm_prompt_speech: true }, "<|endofprompt|>xyz", true);
        assert_eq!(p.prompt_text, "abc");
        assert!(p.llm_prompt_speech && !p.text_frontend);
        let p = plan(&PromptMode::Raw { prompt_text: "abc".into(), llm_prompt_speech: false }, "xyz", true);
        assert_eq!(p.prompt_text, "You are a helpful assistant.<|endofprompt|>abc");
        assert!(!p.llm_prompt_speech && p.text_frontend);
    }
}
