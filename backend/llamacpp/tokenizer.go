package llamacpp

/*
#include <stdlib.h>
#include "llama.h"

static struct llama_model *shardd_load_vocab(const char *path) {
	struct llama_model_params p = llama_model_default_params();
	p.vocab_only = true;
	return llama_model_load_from_file(path, p);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/meshnet/shardd/gguf"
)

// ErrNoChatTemplate: the GGUF carries no chat template, or one llama.cpp
// has no renderer for.
var ErrNoChatTemplate = errors.New("llamacpp: the model has no chat template llama.cpp can apply")

// Tokenizer is a GGUF's vocabulary and chat template, loaded without
// weights (a whole model, or the first or last shard of one: split keeps
// the tokenizer metadata there).
type Tokenizer struct {
	m     *C.struct_llama_model
	vocab *C.struct_llama_vocab
}

// OpenTokenizer loads the vocabulary of a real GGUF (any llama.cpp
// architecture with a tokenizer).
func OpenTokenizer(path string) (*Tokenizer, error) {
	meta, err := gguf.Read(path)
	if err != nil && meta.Arch == "" {
		return nil, err
	}
	if meta.Tokenizer == "" || meta.Tokenizer == "none" {
		return nil, fmt.Errorf("llamacpp: %s carries no tokenizer (a generated model or a middle shard); pass token ids, or the whole model or its first shard", shortName(path))
	}
	initOnce.Do(func() { backendInit(false) })
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	m := C.shardd_load_vocab(cpath)
	if m == nil {
		return nil, fmt.Errorf("llamacpp: could not load the vocabulary of %s", shortName(path))
	}
	return &Tokenizer{m: m, vocab: C.llama_model_get_vocab(m)}, nil
}

// Encode tokenizes text, adding the model's special tokens (BOS where the
// model wants one) and parsing special-token text such as "<|im_start|>".
func (t *Tokenizer) Encode(text string) ([]int32, error) {
	ctext := C.CString(text)
	defer C.free(unsafe.Pointer(ctext))
	n := len(text) + 8
	for range 2 {
		out := make([]int32, n)
		got := C.llama_tokenize(t.vocab, ctext, C.int32_t(len(text)), (*C.llama_token)(unsafe.Pointer(&out[0])), C.int32_t(n), true, true)
		if got >= 0 {
			return out[:got], nil
		}
		n = int(-got) // too small: -got is the size needed
	}
	return nil, errors.New("llamacpp: could not tokenize the text")
}

// Piece is the text of one token: raw bytes, which may be part of a UTF-8
// character that the next token completes. Control tokens (end of turn and
// the like) have no text.
func (t *Tokenizer) Piece(id int32) string {
	var buf [256]C.char
	n := C.llama_token_to_piece(t.vocab, C.llama_token(id), &buf[0], C.int32_t(len(buf)), 0, false)
	if n <= 0 {
		return ""
	}
	return C.GoStringN(&buf[0], n)
}

// EndOfGeneration reports whether id ends a generation (end of text, end
// of turn: every token the model's vocabulary marks so).
func (t *Tokenizer) EndOfGeneration(id int32) bool {
	return bool(C.llama_vocab_is_eog(t.vocab, C.llama_token(id)))
}

// Message is one turn of a chat.
type Message struct {
	Role    string // "system", "user" or "assistant"
	Content string
}

// Chat renders messages with the model's own chat template
// (tokenizer.chat_template, through llama.cpp's built-in template
// renderers) and opens the assistant's turn, ready for Encode. A non-empty
// template overrides the model's: one of llama.cpp's template names
// ("chatml", "gemma", "llama3", ...) or a template text it recognises; a
// base model's GGUF often carries none.
func (t *Tokenizer) Chat(msgs []Message, template string) (string, error) {
	var tmpl *C.char
	if template != "" {
		tmpl = C.CString(template)
		defer C.free(unsafe.Pointer(tmpl))
	} else if tmpl = C.llama_model_chat_template(t.m, nil); tmpl == nil {
		return "", fmt.Errorf("%w: the file carries no tokenizer.chat_template (a base model?); name one of llama.cpp's templates", ErrNoChatTemplate)
	}
	cmsgs := make([]C.struct_llama_chat_message, len(msgs))
	total := 0
	for i, m := range msgs {
		role, content := C.CString(m.Role), C.CString(m.Content)
		defer C.free(unsafe.Pointer(role))
		defer C.free(unsafe.Pointer(content))
		cmsgs[i] = C.struct_llama_chat_message{role: role, content: content}
		total += len(m.Role) + len(m.Content)
	}
	n := 2*total + 256
	for range 2 {
		buf := make([]byte, n)
		var first *C.struct_llama_chat_message
		if len(cmsgs) > 0 {
			first = &cmsgs[0]
		}
		got := C.llama_chat_apply_template(tmpl, first, C.size_t(len(cmsgs)), true, (*C.char)(unsafe.Pointer(&buf[0])), C.int32_t(n))
		if got < 0 {
			return "", ErrNoChatTemplate
		}
		if int(got) <= n {
			return string(buf[:got]), nil
		}
		n = int(got)
	}
	return "", ErrNoChatTemplate
}

// VocabSize is the number of tokens in the vocabulary.
func (t *Tokenizer) VocabSize() int { return int(C.llama_vocab_n_tokens(t.vocab)) }

// HasChatTemplate reports whether the file carries a chat template
// (tokenizer.chat_template); base models usually do not.
func (t *Tokenizer) HasChatTemplate() bool { return C.llama_model_chat_template(t.m, nil) != nil }

// Close frees the vocabulary.
func (t *Tokenizer) Close() {
	if t.m != nil {
		C.llama_model_free(t.m)
		t.m = nil
	}
}
