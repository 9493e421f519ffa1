package llamacpp

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Plain is the baseline the benchmarks hold the backend to: llama.cpp
// driven the plain way on the same GGUF, with its default context
// parameters as ollama's Go wrapper sets them, one sequence, and
// llama_decode on a batch of one embedding row. It is not used to serve.
type Plain struct {
	model *C.struct_llama_model
	ctx   *C.struct_llama_context
	batch C.struct_llama_batch
	embd  int
}

// OpenPlain loads path with a context of nCtx tokens and threads threads.
func OpenPlain(path string, nCtx, threads int) (*Plain, error) {
	initOnce.Do(func() { backendInit(false) })
	model := loadModel(path, nil, 0)
	if model == nil {
		return nil, fmt.Errorf("llamacpp: load %s failed", path)
	}
	ctx := C.shardd_plain_context(model, C.uint32_t(nCtx), 1, C.int32_t(threads))
	if ctx == nil {
		C.llama_model_free(model)
		return nil, errors.New("llamacpp: plain context failed")
	}
	embd := int(C.llama_model_n_embd(model))
	return &Plain{model: model, ctx: ctx, batch: C.llama_batch_init(1, C.int32_t(embd), 1), embd: embd}, nil
}

// Hidden is the model's embedding width.
func (p *Plain) Hidden() int { return p.embd }

// Decode runs one row (len(emb) == Hidden()) at position pos of sequence 0.
func (p *Plain) Decode(emb []float32, pos int) error {
	if len(emb) != p.embd {
		return fmt.Errorf("llamacpp: plain decode: %d floats, want %d", len(emb), p.embd)
	}
	if rc := C.shardd_plain_decode_embd(p.ctx, &p.batch, (*C.float)(unsafe.Pointer(&emb[0])), C.int32_t(p.embd), C.int32_t(pos)); rc != 0 {
		return fmt.Errorf("llamacpp: plain decode returned %d", int(rc))
	}
	return nil
}

// Rewind drops sequence 0's cells.
func (p *Plain) Rewind() {
	C.llama_memory_seq_rm(C.llama_get_memory(p.ctx), 0, -1, -1)
}

// Close frees the context and the model.
func (p *Plain) Close() {
	C.llama_batch_free(p.batch)
	C.llama_free(p.ctx)
	C.llama_model_free(p.model)
}
