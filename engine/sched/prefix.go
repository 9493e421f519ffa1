package sched

import (
	"crypto/sha256"
	"hash"

	"github.com/meshnet/shardd/internal/lru"
	"github.com/meshnet/shardd/kvcache"
)

// The prefix cache: a shard's KV cells and output rows for prompt prefixes
// it has computed, found again by content.
//
// A prompt is cut into blocks of PrefixBlock positions from position 0.
// Block k's key is SHA-256(key of block k-1, the block's input bytes), and
// block 0 chains from the worker's identity (fingerprint, recipe, range,
// boundary dtype), so a key names the shard's inputs at every position
// before its block's end, and an entry never crosses an identity: token ids
// on the first shard, the hidden-state bytes the wire carried on the
// others. A shard's output for a position depends only on its inputs at
// that position and before (every operation of the forward is
// batch-invariant, TestOpVariance), so cells and outputs found under a key
// are the bits a forward would compute.
//
// An entry is made when a prompt's last chunk completes, and again when the
// session's state is dropped (its generated tokens too, which a
// conversation's next turn resends): the sequence's KV state
// (backend.SeqStater) and, on a shard that produces hidden states, the
// output rows of its whole blocks as they went out. It is indexed
// under every one of its block keys. A prefill chunk whose session's
// prompt so far matches the cache takes the deepest entry that matches
// past the chunk's start: the entry's state replaces the sequence's (the
// same bits up to where the sequence was), is trimmed to the matched
// blocks, and the chunk's rows up to there are answered from the entry;
// only the rest run. The last shard keeps no logits, so the rows from the
// first that must produce logits always run (the entry's cells are
// trimmed there). Entries are copies: a session's own state,
// its release, eviction, TTL and CACHE_MISS are what they were. Entries are
// bounded in bytes, least recently used out first.
type prefixCache struct {
	block    int
	seed     [32]byte
	rowBytes int // output bytes a position; 0 on a logit-producing shard
	maxRows  int // positions whose outputs a session keeps while it prefills
	entries  *lru.Cache[[32]byte, *prefixEntry]
	index    map[[32]byte]*prefixEntry
	chains   map[string]*Chain

	hits, tokens int64 // lookups that found rows, rows they answered
	// misfits counts loads that found no room in the KV cache (the rows
	// ran instead).
	misfits int64
	// unordered counts entries made shorter than asked, or not at all,
	// because the sequence's cells past some position were missing or out
	// of position order (backend.SeqStater.SeqInOrder).
	unordered int64
}

// prefixEntry is a cached prefix: blocks whole blocks, the KV state of a
// sequence that holds at least them, and their output rows.
type prefixEntry struct {
	keys  [][32]byte // block k's key at k
	state []byte
	out   []byte // rowBytes * blocks * block
}

func (e *prefixEntry) blocks() int { return len(e.keys) }

// Chain is a session's prompt as the prefix cache sees it: the key of each
// whole block fed so far, the running hash of the block being fed, and
// (hidden-state shards) the outputs of the rows so far.
type Chain struct {
	keys  [][32]byte
	h     hash.Hash
	fed   int  // positions fed
	valid bool // every position from 0 was fed, in order
	out   []byte
}

func newPrefixCache(maxBytes int64, block, rowBytes, maxRows int, seed [32]byte) *prefixCache {
	c := &prefixCache{block: block, seed: seed, rowBytes: rowBytes, maxRows: maxRows,
		index: map[[32]byte]*prefixEntry{}, chains: map[string]*Chain{}}
	c.entries = lru.New(maxBytes, func(_ [32]byte, e *prefixEntry) { c.unindex(e) })
	return c
}

// chain returns session id's chain; first == 0 starts it afresh.
func (c *prefixCache) chain(id string, first int) *Chain {
	ch := c.chains[id]
	if ch == nil {
		ch = &Chain{h: sha256.New()}
		c.chains[id] = ch
	}
	if first == 0 {
		ch.keys, ch.fed, ch.valid, ch.out = ch.keys[:0], 0, true, ch.out[:0]
		ch.h.Reset()
		ch.h.Write(c.seed[:])
	}
	if ch.fed != first {
		ch.valid = false // a chunk the cache did not see, or a rewind
	}
	return ch
}

// feed adds rows (row bytes each, in position order) to the chain.
func (c *prefixCache) feed(ch *Chain, rows []byte, row int) {
	if !ch.valid || row == 0 {
		return
	}
	for off := 0; off+row <= len(rows); off += row {
		ch.h.Write(rows[off : off+row])
		ch.fed++
		if ch.fed%c.block == 0 {
			var k [32]byte
			ch.h.Sum(k[:0])
			ch.keys = append(ch.keys, k)
			ch.h.Reset()
			ch.h.Write(k[:])
		}
	}
}

// match is the deepest entry holding the chain's blocks up to some block
// end in (from, to], and that end; nil when there is none.
func (c *prefixCache) match(ch *Chain, from, to int) (*prefixEntry, int) {
	if !ch.valid {
		return nil, 0
	}
	for k := min(to/c.block, len(ch.keys)); k*c.block > from; k-- {
		if e, ok := c.index[ch.keys[k-1]]; ok && e.blocks() >= k && e.keys[k-1] == ch.keys[k-1] {
			c.entries.Get(e.keys[e.blocks()-1])
			return e, k * c.block
		}
	}
	return nil, 0
}

// keep records a completed chunk's outputs (rows [first, first+n)) in the
// chain, up to maxRows positions.
func (c *prefixCache) keep(ch *Chain, first int, out []byte) {
	if c.rowBytes == 0 || !ch.valid || len(ch.out) != first*c.rowBytes {
		return
	}
	if first*c.rowBytes+len(out) > c.maxRows*c.rowBytes {
		out = out[:max(c.maxRows-first, 0)*c.rowBytes]
	}
	ch.out = append(ch.out, out...)
}

// wants reports whether a finished prompt's chain should become an entry:
// it has whole blocks (with their outputs) that no entry holds yet.
func (c *prefixCache) wants(ch *Chain) int {
	if ch == nil || !ch.valid {
		return 0
	}
	blocks := len(ch.keys)
	if c.rowBytes > 0 {
		blocks = min(blocks, len(ch.out)/(c.rowBytes*c.block))
	}
	if blocks == 0 {
		return 0
	}
	if e, ok := c.index[ch.keys[blocks-1]]; ok && e.blocks() >= blocks {
		return 0
	}
	return blocks
}

// insert makes an entry of the chain's first blocks with state.
func (c *prefixCache) insert(ch *Chain, blocks int, state []byte) {
	if _, ok := c.entries.Peek(ch.keys[blocks-1]); ok {
		return // two sessions finished the same prompt in one forward
	}
	e := &prefixEntry{keys: append([][32]byte(nil), ch.keys[:blocks]...), state: state}
	if c.rowBytes > 0 {
		e.out = append([]byte(nil), ch.out[:blocks*c.block*c.rowBytes]...)
	}
	for _, k := range e.keys {
		if _, ok := c.index[k]; !ok { // the entry found so far stays: its hits keep it
			c.index[k] = e
		}
	}
	c.entries.Put(e.keys[blocks-1], e, int64(len(e.state)+len(e.out)+32*blocks))
}

// unindex forgets an evicted entry's keys, pointing each to the most
// recently used other entry that holds the same block, if any: every
// finished session adds an entry, so the one a hot prefix's keys point to
// is often not the only one holding it.
func (c *prefixCache) unindex(e *prefixEntry) {
	lost := map[[32]byte]bool{}
	for _, k := range e.keys {
		if c.index[k] == e {
			delete(c.index, k)
			lost[k] = true
		}
	}
	if len(lost) == 0 {
		return
	}
	c.entries.All(func(_ [32]byte, o *prefixEntry) bool {
		for _, k := range o.keys {
			if lost[k] {
				c.index[k] = o
				delete(lost, k)
			}
		}
		return len(lost) > 0
	})
}

// forget drops a session's chain.
func (c *prefixCache) forget(id string) { delete(c.chains, id) }

// PrefixConfig turns the prefix cache on (Scheduler.EnablePrefix).
type PrefixConfig struct {
	Bytes int64 // the entries' bound
	Block int   // positions a block
	// RowBytes is a position's output bytes on a shard that produces
	// hidden states (0 on one that produces logits: none are kept).
	RowBytes int
	// Seed is the chains' start: the worker's identity, so entries of
	// another identity never match.
	Seed [32]byte
}

// EnablePrefix turns the prefix cache on; the driver does so only over a
// backend that can copy a sequence's KV state. A prefilling session keeps
// the outputs of up to its longest possible prompt's positions, at most
// 8,192.
func (s *Scheduler) EnablePrefix(pc PrefixConfig) {
	s.prefix = newPrefixCache(pc.Bytes, pc.Block, pc.RowBytes, min(s.info.CtxTokens, 8192), pc.Seed)
}

// PrefixBlock is the prefix cache's block in positions (0: the cache is
// off).
func (s *Scheduler) PrefixBlock() int {
	if s.prefix == nil {
		return 0
	}
	return s.prefix.block
}

// FlushPrefix drops every prefix cache entry (an operator's reset; the
// sessions' chains stay).
func (s *Scheduler) FlushPrefix() {
	if c := s.prefix; c != nil {
		for c.entries.EvictOldest() {
		}
	}
}

// SavePrefix makes the entry a Save asked for from state, a sequence's KV
// state holding its first blocks blocks (fewer than asked when the
// sequence's cells were not all in position order; 0: none, and state is
// nil). state becomes the entry's: the caller gives a copy of its own.
func (s *Scheduler) SavePrefix(sv Save, blocks int, state []byte) {
	c := s.prefix
	if c == nil {
		return
	}
	if blocks < sv.Blocks {
		c.unordered++
	}
	if blocks > 0 {
		c.insert(sv.Chain, blocks, state)
	}
}

// prefixHit feeds an admitted prefill chunk to its session's chain and,
// when the cache holds the chain past the chunk's start, answers the
// chunk's rows up to there from the entry: their outputs now, their cells
// by a load the driver runs before the forward (or undoes). Rows from the
// first that must produce logits on run (a chunk's last, on the last
// shard: one row of 128); a chunk answered whole completes here.
func (s *Scheduler) prefixHit(w *Item) admitResult {
	c := s.prefix
	if c == nil || w.Done != 0 {
		return admitRun
	}
	ch := s.prefixFeed(w)
	// Blocks are matched up to the chunk's end; rows are answered up to
	// the first that must produce logits (the entry's cells go further,
	// and the load trims them there).
	to := w.First + w.Tokens
	if s.info.LogitsOut {
		for r := range w.Tokens {
			if w.RowWantsOutput(r) {
				to = min(to, w.First+r)
				break
			}
		}
	}
	e, end := c.match(ch, w.First, w.First+w.Tokens)
	if end = min(end, to); e == nil || end <= w.First {
		return admitRun
	}
	n := end - w.First
	if c.rowBytes > 0 {
		w.Out = s.pool.Alloc(w.OutBytes)
		w.Out.SetLen(0)
		buf := append(w.Out.Bytes(), e.out[w.First*c.rowBytes:end*c.rowBytes]...)
		w.Out.SetLen(len(buf))
		w.OutRows = n
	}
	w.Done, w.PrefixRows = n, n
	c.hits++
	c.tokens += int64(n)
	id, sess, first := w.Session, w.Sess, w.First
	if w.Done == w.Tokens {
		// Answered whole: complete now (the reply goes out after the
		// load). Should the load not fit, the session is put back where
		// this chunk began, and its next chunk is a declared CACHE_MISS.
		s.fx.Loads = append(s.fx.Loads, Load{Seq: w.Seq, First: first, To: end, State: e.state, Undo: func() {
			c.misfits++
			c.drop(id)
			s.store.Truncate(sess, first)
		}})
		w.Started = s.at
		s.complete(w)
		return admitDone
	}
	// The rest runs in this plan's forward, after the load (the driver
	// runs no forward when a load does not fit, and the rows run whole in
	// the next).
	s.fx.Loads = append(s.fx.Loads, Load{Seq: w.Seq, First: first, To: end, State: e.state, Undo: func() {
		c.misfits++
		c.hits--
		c.tokens -= int64(n)
		w.Done, w.PrefixRows, w.OutRows = 0, 0, 0
		w.releaseOut()
		c.drop(id)
		s.loadFailed = true
	}})
	return admitRun
}

// prefixFeed adds an admitted item's inputs to its session's chain (a
// prefill chunk from position 0 starts it afresh) and returns the chain.
func (s *Scheduler) prefixFeed(w *Item) *Chain {
	c := s.prefix
	if c == nil {
		return nil
	}
	ch := c.chain(w.Session, w.First)
	c.feed(ch, w.Input, len(w.Input)/w.Tokens)
	return ch
}

// prefixKeep makes an entry of a session whose state is dropped (released,
// evicted, expired) from its whole blocks, prompt and generated tokens:
// the next turn of a conversation resends them all. The save runs before
// the sequence's cells are trimmed.
func (s *Scheduler) prefixKeep(sess *kvcache.Session) {
	c := s.prefix
	if c == nil {
		return
	}
	if ch := c.chains[sess.ID]; ch != nil {
		if blocks := c.wants(ch); blocks > 0 {
			s.fx.Saves = append(s.fx.Saves, Save{Seq: sess.Seq, Chain: ch, Blocks: blocks})
		}
	}
	c.forget(sess.ID)
}

// prefixDone takes a completed prefill chunk's or decode step's outputs
// into its chain and, at the prompt's end, asks for an entry of its whole
// blocks.
func (s *Scheduler) prefixDone(w *Item, out []byte) {
	c := s.prefix
	if c == nil {
		return
	}
	ch := c.chains[w.Session]
	if ch == nil {
		return
	}
	c.keep(ch, w.First, out)
	if w.Final && w.Mode == Prefill {
		if blocks := c.wants(ch); blocks > 0 {
			s.fx.Saves = append(s.fx.Saves, Save{Seq: w.Seq, Chain: ch, Blocks: blocks})
		}
	}
}

// prefixDrop stops a session's chain: its cells were rewound.
func (s *Scheduler) prefixDrop(id string) {
	if s.prefix != nil {
		s.prefix.drop(id)
	}
}

// drop marks session id's chain as broken until its next prompt.
func (c *prefixCache) drop(id string) {
	if ch := c.chains[id]; ch != nil {
		ch.valid = false
	}
}
