// Package lru is a strict least-recently-used list with a cost budget.
//
// It is not safe for concurrent use: each user (the session store, the
// idempotency results cache) is owned by one goroutine. Unlike an
// admission-controlled cache (ristretto's TinyLFU), it never refuses an
// entry: inserting always succeeds and the least recently used entries go
// first, which is what a session table and a cache of the newest results
// need.
//
// Entries are nodes of an intrusive list, and a removed node is kept for
// the next insert, so a cache whose size holds steady (the results of
// sessions that decode, one in and one out per step) allocates nothing.
// The nodes kept are at most the most entries the cache ever held.
package lru

// Cache maps K to V, ordered by use.
type Cache[K comparable, V any] struct {
	root    node[K, V] // root.next: most recently used; root.prev: least
	n       int
	items   map[K]*node[K, V]
	free    *node[K, V] // removed nodes, linked through next
	cost    int64
	budget  int64 // 0: unbounded
	onEvict func(K, V)
}

type node[K comparable, V any] struct {
	prev, next *node[K, V]
	key        K
	val        V
	cost       int64
}

// New returns a cache that evicts least recently used entries once the sum of
// costs exceeds budget (0: never by cost). onEvict, if set, is called for
// every entry that leaves the cache other than through Remove's return.
func New[K comparable, V any](budget int64, onEvict func(K, V)) *Cache[K, V] {
	c := &Cache[K, V]{items: map[K]*node[K, V]{}, budget: budget, onEvict: onEvict}
	c.root.prev, c.root.next = &c.root, &c.root
	return c
}

// Get returns the value for k and marks it most recently used.
func (c *Cache[K, V]) Get(k K) (V, bool) {
	if e, ok := c.items[k]; ok {
		c.toFront(e)
		return e.val, true
	}
	var zero V
	return zero, false
}

// Peek returns the value for k without touching its recency.
func (c *Cache[K, V]) Peek(k K) (V, bool) {
	if e, ok := c.items[k]; ok {
		return e.val, true
	}
	var zero V
	return zero, false
}

// Put inserts or replaces k (replacing evicts the old value through
// onEvict), marks it most recently used, then evicts from the back until the
// budget holds again. An entry costlier than the whole budget is evicted at
// once.
func (c *Cache[K, V]) Put(k K, v V, cost int64) {
	if e, ok := c.items[k]; ok {
		c.cost += cost - e.cost
		oldVal := e.val
		e.val, e.cost = v, cost
		c.toFront(e)
		if c.onEvict != nil {
			c.onEvict(k, oldVal)
		}
	} else {
		e := c.free
		if e != nil {
			c.free = e.next
		} else {
			e = new(node[K, V])
		}
		e.key, e.val, e.cost = k, v, cost
		c.link(e, &c.root)
		c.items[k] = e
		c.n++
		c.cost += cost
	}
	for c.budget > 0 && c.cost > c.budget && c.n > 0 {
		c.evict(c.root.prev)
	}
}

// Remove deletes k and returns its value without calling onEvict.
func (c *Cache[K, V]) Remove(k K) (V, bool) {
	e, ok := c.items[k]
	if !ok {
		var zero V
		return zero, false
	}
	_, v := c.remove(e)
	return v, true
}

// Oldest returns the least recently used entry.
func (c *Cache[K, V]) Oldest() (K, V, bool) {
	if c.n > 0 {
		e := c.root.prev
		return e.key, e.val, true
	}
	var k K
	var v V
	return k, v, false
}

// EvictOldest evicts the least recently used entry through onEvict.
func (c *Cache[K, V]) EvictOldest() bool {
	if c.n > 0 {
		c.evict(c.root.prev)
		return true
	}
	return false
}

// Len is the number of entries; Cost their summed cost.
func (c *Cache[K, V]) Len() int    { return c.n }
func (c *Cache[K, V]) Cost() int64 { return c.cost }

// All calls f for every entry from most to least recently used, stopping
// when f returns false. f must not modify the cache.
func (c *Cache[K, V]) All(f func(K, V) bool) {
	for e := c.root.next; e != &c.root; e = e.next {
		if !f(e.key, e.val) {
			return
		}
	}
}

func (c *Cache[K, V]) evict(e *node[K, V]) {
	k, v := c.remove(e)
	if c.onEvict != nil {
		c.onEvict(k, v)
	}
}

// remove unlinks e, forgets its key and keeps the node for the next Put.
func (c *Cache[K, V]) remove(e *node[K, V]) (K, V) {
	k, v := e.key, e.val
	c.unlink(e)
	delete(c.items, k)
	c.n--
	c.cost -= e.cost
	var zk K
	var zv V
	e.key, e.val, e.prev = zk, zv, nil // hold no references while free
	e.next, c.free = c.free, e
	return k, v
}

// link puts e after at.
func (c *Cache[K, V]) link(e, at *node[K, V]) {
	e.prev, e.next = at, at.next
	at.next.prev = e
	at.next = e
}

func (c *Cache[K, V]) unlink(e *node[K, V]) {
	e.prev.next = e.next
	e.next.prev = e.prev
}

func (c *Cache[K, V]) toFront(e *node[K, V]) {
	if c.root.next == e {
		return
	}
	c.unlink(e)
	c.link(e, &c.root)
}
