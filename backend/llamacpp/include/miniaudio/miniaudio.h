/*
 * shardd's stand-in for miniaudio.h.
 *
 * llama.cpp's tools/mtmd/mtmd-helper.cpp includes miniaudio for audio input.
 * Go module zips drop nested vendor/ folders, so the real header is missing
 * from the module cache and Debian does not package it. shardd never feeds
 * audio to a model, so this header declares exactly the subset mtmd-helper.cpp
 * names and makes every call fail: audio input is unsupported.
 *
 * mtmd-helper.cpp defines MA_API as `static` before including this file.
 */
#ifndef SHARDD_MINIAUDIO_STUB_H
#define SHARDD_MINIAUDIO_STUB_H

#include <stddef.h>

#ifndef MA_API
#define MA_API static
#endif

typedef int ma_result;
typedef unsigned long long ma_uint64;
typedef unsigned int ma_uint32;

#define MA_SUCCESS 0
#define MA_NOT_IMPLEMENTED (-29)

typedef enum { ma_format_unknown = 0, ma_format_f32 = 5 } ma_format;
typedef enum { ma_encoding_format_unknown = 0, ma_encoding_format_wav = 1 } ma_encoding_format;

typedef struct { ma_format format; ma_uint32 channels; ma_uint32 sampleRate; } ma_decoder_config;
typedef struct { int unused; } ma_decoder;
typedef struct {
    ma_encoding_format encodingFormat;
    ma_format format;
    ma_uint32 channels;
    ma_uint32 sampleRate;
} ma_encoder_config;
typedef struct { int unused; } ma_encoder;

MA_API ma_decoder_config ma_decoder_config_init(ma_format f, ma_uint32 ch, ma_uint32 rate) {
    ma_decoder_config c; c.format = f; c.channels = ch; c.sampleRate = rate; return c;
}
MA_API ma_result ma_decoder_init_memory(const void *d, size_t n, const ma_decoder_config *c, ma_decoder *dec) {
    (void)d; (void)n; (void)c; (void)dec; return MA_NOT_IMPLEMENTED;
}
MA_API ma_result ma_decoder_get_length_in_pcm_frames(ma_decoder *dec, ma_uint64 *n) {
    (void)dec; if (n) { *n = 0; } return MA_NOT_IMPLEMENTED;
}
MA_API ma_result ma_decoder_read_pcm_frames(ma_decoder *dec, void *out, ma_uint64 n, ma_uint64 *read) {
    (void)dec; (void)out; (void)n; if (read) { *read = 0; } return MA_NOT_IMPLEMENTED;
}
MA_API ma_result ma_decoder_uninit(ma_decoder *dec) { (void)dec; return MA_SUCCESS; }

MA_API ma_encoder_config ma_encoder_config_init(ma_encoding_format e, ma_format f, ma_uint32 ch, ma_uint32 rate) {
    ma_encoder_config c; c.encodingFormat = e; c.format = f; c.channels = ch; c.sampleRate = rate; return c;
}
MA_API ma_result ma_encoder_init_file(const char *p, const ma_encoder_config *c, ma_encoder *enc) {
    (void)p; (void)c; (void)enc; return MA_NOT_IMPLEMENTED;
}
MA_API ma_result ma_encoder_write_pcm_frames(ma_encoder *enc, const void *in, ma_uint64 n, ma_uint64 *written) {
    (void)enc; (void)in; (void)n; if (written) { *written = 0; } return MA_NOT_IMPLEMENTED;
}
MA_API void ma_encoder_uninit(ma_encoder *enc) { (void)enc; }

#endif
