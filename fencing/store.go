package fencing

import (
	"context"
	"sync"

	"github.com/fencelock/fence"
)

// Store applies the fenced write rule for resource keys. Implementations
// are safe for concurrent use, also across processes where they are durable.
type Store interface {
	// Admit runs write if token is at least the highest token accepted for
	// key, and then records token as the highest, as one atomic step with
	// respect to every other Admit on key. A lower token gets a
	// *fence.StaleTokenError and write is not called. If write fails, the
	// highest token is left as it was and the error is returned.
	Admit(ctx context.Context, key string, token uint64, write func(ctx context.Context) error) error
	// Highest returns the highest token accepted for key, 0 if none.
	Highest(ctx context.Context, key string) (uint64, error)
	// Close releases the store's resources.
	Close() error
}

// Memory is a Store in this process's memory: for tests, and for resources
// that live in one process and need no durability. The zero value is not
// usable; call NewMemory.
type Memory struct {
	mu   sync.Mutex
	keys map[string]*memoryKey
}

type memoryKey struct {
	mu      sync.Mutex // held across the write, serializing writers of the key
	highest uint64
}

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory { return &Memory{keys: map[string]*memoryKey{}} }

func (m *Memory) key(key string) *memoryKey {
	m.mu.Lock()
	defer m.mu.Unlock()
	k, ok := m.keys[key]
	if !ok {
		k = &memoryKey{}
		m.keys[key] = k
	}
	return k
}

// Admit implements Store.
func (m *Memory) Admit(ctx context.Context, key string, token uint64, write func(ctx context.Context) error) error {
	k := m.key(key)
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := fence.CheckToken(key, token, k.highest); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := write(ctx); err != nil {
		return err
	}
	k.highest = token
	return nil
}

// Highest implements Store.
func (m *Memory) Highest(ctx context.Context, key string) (uint64, error) {
	k := m.key(key)
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.highest, nil
}

// Close implements Store; a Memory store needs no closing.
func (m *Memory) Close() error { return nil }
