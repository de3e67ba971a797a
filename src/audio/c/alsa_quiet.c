/* ALSA prints its own errors ("ALSA lib pcm.c:...: Unknown PCM default", eight lines on a
 * machine without sound) to stderr through a C-variadic handler before cpal hands cosy the error
 * that it reports in one line. A variadic function cannot be written in stable Rust, so the quiet
 * handler is this one C function. */
#include <alsa/asoundlib.h>

static void cosy_alsa_quiet_handler(const char *file, int line, const char *function, int err,
                                    const char *fmt, ...) {
  (void)file; (void)line; (void)function; (void)err; (void)fmt;
}

int cosy_alsa_silence_errors(void) { return snd_lib_error_set_handler(cosy_alsa_quiet_handler); }
