package sched

import (
	"sync/atomic"
	"time"

	"github.com/meshnet/shardd/bufpool"
	"github.com/meshnet/shardd/internal/wireerr"
	"github.com/meshnet/shardd/kvcache"
)

// Mode is a unit of work's cache mode (the contract's CacheMode).
type Mode uint8

const (
	ModeUnknown Mode = iota
	Prefill          // a prompt chunk, appended to the session's state
	Decode           // one decode step of a prefilled session
	Stateless        // no session state: runs in the scratch sequence
)

// Refusals the scheduler decides. The engine names them too (engine's
// errors.go), so a peer sees one text and code for each.
var (
	ErrCacheMiss = wireerr.New(wireerr.CodeCacheMiss, "engine: session cache is not where the sender expects")
	ErrCancelled = wireerr.New(wireerr.CodeCancelled, "engine: work cancelled")
	ErrDeadline  = wireerr.New(wireerr.CodeDeadlineExceeded, "engine: deadline passed before the work ran")
	// ErrEnvelope: a malformed envelope; here an item whose mode is none
	// of the three (the engine refuses such a chunk on receipt; this is
	// the scheduler's own guard).
	ErrEnvelope = wireerr.New(wireerr.CodePayloadCorrupt, "engine: envelope is malformed")
)

// Item is one unit of work as the scheduler sees it: a prefill chunk or a
// decode step, from its submission to its reply. The fields above the line
// are the submitter's, set before Enqueue and not changed after; the rest
// belong to the scheduler, and the submitter reads them only between the
// scheduler's calls (on its goroutine).
type Item struct {
	// Owner is the submitter's handle for the item; the scheduler hands it
	// back in Effects and never looks inside.
	Owner any
	// Gone is set by the submitter when the item's stream stops taking
	// replies; the scheduler then drops the item quietly at admission. It
	// is read, never written, here.
	Gone     *atomic.Bool
	Session  string // route session id
	WorkID   string
	Step     uint64
	Epoch    uint64
	Mode     Mode
	Expected uint64 // expected_past_len (Decode)
	First    int    // first position
	Tokens   int
	Final    bool // last chunk of a prefill (or a single-chunk prefill)
	// PromptEnd bounds where the prompt of a chunk that is not its last
	// ends: its first position plus its tokens times the chunks left,
	// this one included (0: unknown). A scheduling hint (crowd), not
	// trusted for anything else.
	PromptEnd int
	Deadline  int64 // unix nanoseconds; 0: none
	Length    int   // session_tokens: the session's stated length (0: not stated)
	// OutPos are the positions that produce logits (absolute; nil: the
	// last row only), on a shard that produces logits.
	OutPos []int32
	// OutBytes is the size of the item's whole output.
	OutBytes int
	// Input is the rows' input bytes in position order (token ids or
	// hidden states, as the wire carried them): what the prefix cache
	// hashes.
	Input []byte

	// --- the scheduler's ---
	admitted bool
	// Sess is the session the item runs in (admitted, not Stateless).
	Sess *kvcache.Session
	pin  *kvcache.Session // the session this item pins (queued or running)
	// Seq is the backend sequence the item's rows go to (admitted).
	Seq int
	// Done is how many rows have run (or were answered from the prefix
	// cache).
	Done int
	// Out is the output so far, OutRows its rows; the submitter appends
	// each forward's rows (Scheduler.Advance's caller), the prefix cache
	// the rows it answers.
	Out     *bufpool.Buffer
	OutRows int
	// Hit: the item continued state the session held.
	Hit bool
	// PrefixRows are the rows answered from the prefix cache.
	PrefixRows int
	// Queued and Started are when the item was queued and first planned,
	// by the times the scheduler was given.
	Queued, Started time.Time
}

// Admitted reports whether the item passed admission (it holds a sequence).
func (it *Item) Admitted() bool { return it.admitted }

// RowWantsOutput reports whether row r (0-based within the item) produces
// logits on a shard that produces them.
func (it *Item) RowWantsOutput(r int) bool {
	if it.OutPos == nil {
		return r == it.Tokens-1
	}
	p := int32(it.First + r)
	for _, q := range it.OutPos {
		if q == p {
			return true
		}
	}
	return false
}

// OutputRows is how many rows produce logits.
func (it *Item) OutputRows() int {
	if it.OutPos == nil {
		return 1
	}
	return len(it.OutPos)
}

// releaseOut drops the output so far.
func (it *Item) releaseOut() {
	if it.Out != nil {
		it.Out.Release()
		it.Out = nil
	}
}

// Output is a completed item's reply as the submitter made it
// (Hooks.Complete): the results cache holds it for duplicates, and every
// holder releases its reference.
type Output interface {
	Retain() // a reference for another holder
	Release()
	Cost() int64 // bytes, as the results cache counts them
}

// Hooks are the submitter's part of completing an item.
type Hooks struct {
	// Complete makes the reply of an item whose rows have all run (or
	// were answered), at now; pastLen is the session's length after it (0
	// for Stateless). It takes over it.Out. It does no I/O: the reply goes
	// out with the effects.
	Complete func(it *Item, now time.Time, pastLen uint64) Output
}
