#!/usr/bin/env python3
"""Records tests/fixtures/official/<CASE> with the unmodified official CosyVoice code.

This is our own script; it holds no official code. It imports the official checkout given by
$COSY_OFFICIAL_SRC (FunAudioLLM/CosyVoice at ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40 with
third_party/Matcha-TTS at dd9105b34bf2be2230f4aa1e4769fb586a3c824e, unpacked outside this
repository) and runs it on $COSY_SHARED/reference/tiny-official (default ../shared), in a venv with
the official requirements (see tests/fixtures/official/README.md for the versions).

usage: record_official.py CASE OUT_DIR      (one case per process: a fresh model, token_hop_len 25)
       record_official.py --split TEXT      (print how text_normalize(split=True) splits TEXT)
Cases: cross_lingual, instruct, speed, multi_sentence_stream.
"""
import hashlib
import json
import os
import sys
import threading
import time
import traceback

OFFICIAL = os.environ['COSY_OFFICIAL_SRC']
sys.path.insert(0, OFFICIAL)
sys.path.insert(0, os.path.join(OFFICIAL, 'third_party/Matcha-TTS'))
REF = os.path.join(os.environ.get('COSY_SHARED', os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../../shared')),
                   'reference')
MODEL = os.path.join(REF, 'tiny-official')

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from cosyvoice.cli.cosyvoice import CosyVoice3  # noqa: E402
from cosyvoice.utils.common import set_all_random_seed  # noqa: E402

PROMPT_TEXT = 'You are a helpful assistant.<|endofprompt|>Good evening, this recording captures my natural voice.'

CASES = {
    'cross_lingual': dict(
        mode='cross_lingual', stream=False, speed=1.0, text_frontend=False,
        tts_text='You are a helpful assistant.<|endofprompt|>The fishermen turned their boats toward the shore.',
        prompt_wav='prompts/prompt_24k.wav',
        note='inference_cross_lingual: no prompt text, no LLM prompt speech; the system prompt and '
             '<|endofprompt|> go in front of the tts text (official CosyVoice3 usage, example.py)'),
    'instruct': dict(
        mode='instruct2', stream=False, speed=1.0, text_frontend=False,
        tts_text='The fishermen turned their boats toward the shore.',
        instruct_text='You are a helpful assistant. Please say a sentence as loudly as possible.<|endofprompt|>',
        prompt_wav='prompts/prompt_24k.wav',
        note='inference_instruct2 with one of the instructions of cosyvoice/utils/common.py instruct_list; '
             'no LLM prompt speech'),
    'speed': dict(
        mode='zero_shot', stream=False, speed=1.5, text_frontend=False,
        tts_text='The old lighthouse blinked twice before the fog rolled in.',
        prompt_text=PROMPT_TEXT, prompt_wav='prompts/prompt_24k.wav',
        note='zero-shot, speed 1.5: the final token2wav call linearly interpolates the mel to '
             'int(frames / 1.5) frames before HiFT (non-stream only)'),
    'multi_sentence_stream': dict(
        mode='zero_shot', stream=True, speed=1.0, text_frontend=True,
        tts_text=('A cold wind swept across the bay as the fishermen turned their boats toward the shore '
                  'and the old lighthouse blinked twice. Somewhere a dog barked, and a door closed softly in the dark.'),
        prompt_text=PROMPT_TEXT, prompt_wav='prompts/prompt_24k.wav',
        note='zero-shot, stream=True, several sentences in one request. text_frontend=False never '
             'splits (text_normalize returns [text]), so this case uses text_frontend=True with '
             'neither ttsfrd nor wetext installed: text_normalize then only strips, spells out '
             'digits (there are none) and splits with split_paragraph (en, token_max_n 80, '
             'token_min_n 60, merge_len 20). The first sentence streams 3 chunks and leaves the '
             'model\'s token_hop_len at 100 (never reset), so the second one (67 tokens) gets no '
             'streaming chunk, only the final one (a hop of 25 would have cut one at 51 tokens)'),
}


def sha256(path):
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    if sys.argv[1] == '--split':
        cv = CosyVoice3(MODEL)
        print(cv.frontend.text_frontend or '(none)')
        for t in cv.frontend.text_normalize(sys.argv[2], split=True, text_frontend=True):
            print(len(cv.frontend.tokenizer.encode(t, allowed_special=cv.frontend.allowed_special)), repr(t))
        return
    name, out = sys.argv[1], sys.argv[2]
    case = CASES[name]
    os.makedirs(out, exist_ok=True)

    cv = CosyVoice3(MODEL)
    model = cv.model
    llm = model.llm

    # --- read-only hooks: every wrapper calls the original and only records what passes ---
    calls = []          # one entry per LLM call (= per sentence)
    orig_inference = llm.inference

    def inference(*args, **kw):
        call = dict(text_token=kw['text'].flatten().tolist(), prompt_text_token=kw['prompt_text'].flatten().tolist(),
                    llm_prompt_speech_token_len=int(kw['prompt_speech_token'].shape[1]),
                    yielded=[], sampled=[])
        calls.append(call)
        for tok in orig_inference(*args, **kw):
            call['yielded'].append(int(tok))
            yield tok
    llm.inference = inference

    orig_sampling_ids = llm.sampling_ids

    def sampling_ids(*args, **kw):
        top = orig_sampling_ids(*args, **kw)
        calls[-1]['sampled'].append(int(top))
        return top
    llm.sampling_ids = sampling_ids

    flow_calls = []
    orig_token2wav = model.token2wav

    def token2wav(*args, **kw):
        speech = orig_token2wav(*args, **kw)
        flow_calls.append(dict(tokens=kw['token'].flatten().tolist(), token_offset=kw['token_offset'],
                               finalize=kw['finalize'], stream=kw.get('stream', False),
                               speed=kw.get('speed', 1.0), samples=int(speech.shape[1])))
        return speech
    model.token2wav = token2wav

    thread_errors = []
    orig_excepthook = threading.excepthook

    def excepthook(a):
        thread_errors.append(dict(thread=a.thread.name if a.thread else None, type=a.exc_type.__name__,
                                  msg=str(a.exc_value),
                                  tb=''.join(traceback.format_exception(a.exc_type, a.exc_value, a.exc_traceback))))
        orig_excepthook(a)
    threading.excepthook = excepthook

    prompt_wav = os.path.join(REF, case['prompt_wav'])
    set_all_random_seed(0)
    kw = dict(stream=case['stream'], speed=case['speed'], text_frontend=case['text_frontend'])
    if case['mode'] == 'zero_shot':
        gen = cv.inference_zero_shot(case['tts_text'], case['prompt_text'], prompt_wav, **kw)
    elif case['mode'] == 'cross_lingual':
        gen = cv.inference_cross_lingual(case['tts_text'], prompt_wav, **kw)
    elif case['mode'] == 'instruct2':
        gen = cv.inference_instruct2(case['tts_text'], case['instruct_text'], prompt_wav, **kw)
    sentences = cv.frontend.text_normalize(case['tts_text'], split=True, text_frontend=case['text_frontend'])
    t0 = time.time()
    chunks = [o['tts_speech'].numpy().reshape(-1).astype(np.float32) for o in gen]
    wall = time.time() - t0
    wave = np.concatenate(chunks)

    stop_ids = set(llm.stop_token_ids)
    per_sentence = []
    for c in calls:
        last = c['sampled'][-1] if c['sampled'] else None
        n_text = len(c['text_token'])
        max_len = int(n_text * 20)
        if last is not None and last in stop_ids:
            term = dict(termination='stop_token', stop_token=last)
        else:
            term = dict(termination='max_len', stop_token=None)
        per_sentence.append(dict(text_token=c['text_token'], prompt_text_token=c['prompt_text_token'],
                                 llm_prompt_speech_token_len=c['llm_prompt_speech_token_len'],
                                 n_llm_token=len(c['yielded']), llm_min_len=int(n_text * 2), llm_max_len=max_len, **term))
    if len(calls) == 1:
        np.save(os.path.join(out, 'llm_token.npy'), np.array(calls[0]['yielded'], dtype=np.int32))
    else:
        for i, c in enumerate(calls):
            np.save(os.path.join(out, 'llm_token_{:03d}.npy'.format(i)), np.array(c['yielded'], dtype=np.int32))
    np.save(os.path.join(out, 'waveform.npy'), wave)

    meta = dict(case=name, mode=case['mode'], tts_text=case['tts_text'])
    if 'prompt_text' in case:
        meta['prompt_text'] = case['prompt_text']
    if 'instruct_text' in case:
        meta['instruct_text'] = case['instruct_text']
    meta.update(prompt_wav=case['prompt_wav'], prompt_wav_sha256=sha256(prompt_wav),  # exact: hashes the input file (metadata), not numeric output
                stream=case['stream'], speed=case['speed'], seed=0, text_frontend=case['text_frontend'],
                text_frontend_engine=cv.frontend.text_frontend or None,
                torch_threads=torch.get_num_threads(), note=case['note'],
                sentences=sentences if isinstance(sentences, list) else [sentences],
                llm_calls=per_sentence, llm_thread_errors=thread_errors,
                flow_calls=[{k: v for k, v in f.items() if k != 'tokens'} | dict(n_tokens=len(f['tokens'])) for f in flow_calls],
                chunk_samples=[int(len(c)) for c in chunks], n_samples=int(len(wave)), wall_s=round(wall, 2),
                versions=dict(python=sys.version.split()[0], torch=torch.__version__, numpy=np.__version__,
                              transformers=__import__('transformers').__version__,
                              onnxruntime=__import__('onnxruntime').__version__,
                              official='FunAudioLLM/CosyVoice ace7c47f41bbd303aa6bf1ea80e6f9fbd595cd40',
                              matcha='shivammehta25/Matcha-TTS dd9105b34bf2be2230f4aa1e4769fb586a3c824e'))
    with open(os.path.join(out, 'meta.json'), 'w') as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write('\n')
    print(json.dumps({k: meta[k] for k in ('case', 'sentences', 'chunk_samples', 'n_samples', 'llm_thread_errors')}, ensure_ascii=False))
    for p in per_sentence:
        print(' ', p['n_llm_token'], p['termination'], p['stop_token'], 'min', p['llm_min_len'], 'max', p['llm_max_len'])


if __name__ == '__main__':
    main()
