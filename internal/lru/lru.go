// Package lru is a strict least-recently-used list with a cost budget.
//
// It is not safe for concurrent use: each user (the session store, the
// idempotency results cache) is owned by one goroutine. Unlike an
// admission-controlled cache (ristretto's TinyLFU), it never refuses an
// entry: inserting always succeeds and the least recently used entries go
// first, which is what a session table and a cache of the newest results
// need.
package lru

import "container/list"

// Cache maps K to V, ordered by use.
type Cache[K comparable, V any] struct {
	ll      *list.List // front: most recently used
	items   map[K]*list.Element
	cost    int64
	budget  int64 // 0: unbounded
	onEvict func(K, V)
}

type entry[K comparable, V any] struct {
	key  K
	val  V
	cost int64
}

// New returns a cache that evicts least recently used entries once the sum of
// costs exceeds budget (0: never by cost). onEvict, if set, is called for
// every entry that leaves the cache other than through Remove's return.
func New[K comparable, V any](budget int64, onEvict func(K, V)) *Cache[K, V] {
	return &Cache[K, V]{ll: list.New(), items: map[K]*list.Element{}, budget: budget, onEvict: onEvict}
}

// Get returns the value for k and marks it most recently used.
func (c *Cache[K, V]) Get(k K) (V, bool) {
	if e, ok := c.items[k]; ok {
		c.ll.MoveToFront(e)
		return e.Value.(*entry[K, V]).val, true
	}
	var zero V
	return zero, false
}

// Peek returns the value for k without touching its recency.
func (c *Cache[K, V]) Peek(k K) (V, bool) {
	if e, ok := c.items[k]; ok {
		return e.Value.(*entry[K, V]).val, true
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
		old := e.Value.(*entry[K, V])
		c.cost += cost - old.cost
		oldVal := old.val
		old.val, old.cost = v, cost
		c.ll.MoveToFront(e)
		if c.onEvict != nil {
			c.onEvict(k, oldVal)
		}
	} else {
		c.items[k] = c.ll.PushFront(&entry[K, V]{key: k, val: v, cost: cost})
		c.cost += cost
	}
	for c.budget > 0 && c.cost > c.budget && c.ll.Len() > 0 {
		c.evict(c.ll.Back())
	}
}

// Remove deletes k and returns its value without calling onEvict.
func (c *Cache[K, V]) Remove(k K) (V, bool) {
	e, ok := c.items[k]
	if !ok {
		var zero V
		return zero, false
	}
	en := c.remove(e)
	return en.val, true
}

// Oldest returns the least recently used entry.
func (c *Cache[K, V]) Oldest() (K, V, bool) {
	if e := c.ll.Back(); e != nil {
		en := e.Value.(*entry[K, V])
		return en.key, en.val, true
	}
	var k K
	var v V
	return k, v, false
}

// EvictOldest evicts the least recently used entry through onEvict.
func (c *Cache[K, V]) EvictOldest() bool {
	if e := c.ll.Back(); e != nil {
		c.evict(e)
		return true
	}
	return false
}

// Len is the number of entries; Cost their summed cost.
func (c *Cache[K, V]) Len() int    { return c.ll.Len() }
func (c *Cache[K, V]) Cost() int64 { return c.cost }

// All calls f for every entry from most to least recently used, stopping
// when f returns false. f must not modify the cache.
func (c *Cache[K, V]) All(f func(K, V) bool) {
	for e := c.ll.Front(); e != nil; e = e.Next() {
		en := e.Value.(*entry[K, V])
		if !f(en.key, en.val) {
			return
		}
	}
}

func (c *Cache[K, V]) evict(e *list.Element) {
	en := c.remove(e)
	if c.onEvict != nil {
		c.onEvict(en.key, en.val)
	}
}

func (c *Cache[K, V]) remove(e *list.Element) *entry[K, V] {
	en := e.Value.(*entry[K, V])
	c.ll.Remove(e)
	delete(c.items, en.key)
	c.cost -= en.cost
	return en
}
