// Package boltfence is a fencing.Store in a local bbolt file: the highest
// token of each key survives restarts, and a write made through AdmitTx
// commits in the same bbolt transaction as the token it was admitted with.
package boltfence

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/fencing"
)

var bucket = []byte("fence_tokens")

// Store is a fencing.Store backed by bbolt. It is safe for concurrent use;
// bbolt allows one process to open the file at a time.
type Store struct {
	db *bbolt.DB
}

var _ fencing.Store = (*Store)(nil)

// Open opens (or creates) the store in the file at path.
func Open(path string) (*Store, error) {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("boltfence: opening %s: %w", path, err)
	}
	return New(db)
}

// New uses an open bbolt database, so that the application's own buckets
// and the tokens share transactions.
func New(db *bbolt.DB) (*Store, error) {
	err := db.Update(func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucket)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("boltfence: %w", err)
	}
	return &Store{db: db}, nil
}

// DB returns the underlying database.
func (s *Store) DB() *bbolt.DB { return s.db }

// AdmitTx applies the fenced write rule for key and runs write in the same
// read-write transaction, which commits the write and the new highest token
// together, or neither.
func (s *Store) AdmitTx(ctx context.Context, key string, token uint64, write func(tx *bbolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucket)
		if err := fence.CheckToken(key, token, decode(b.Get([]byte(key)))); err != nil {
			return err
		}
		if err := write(tx); err != nil {
			return err
		}
		return b.Put([]byte(key), encode(token))
	})
}

// Admit implements fencing.Store. write can reach the transaction with Tx(ctx).
func (s *Store) Admit(ctx context.Context, key string, token uint64, write func(ctx context.Context) error) error {
	return s.AdmitTx(ctx, key, token, func(tx *bbolt.Tx) error {
		return write(context.WithValue(ctx, txKey{}, tx))
	})
}

type txKey struct{}

// Tx returns the transaction of the Admit that ctx was passed to, or nil.
func Tx(ctx context.Context) *bbolt.Tx {
	tx, _ := ctx.Value(txKey{}).(*bbolt.Tx)
	return tx
}

// Highest implements fencing.Store.
func (s *Store) Highest(ctx context.Context, key string) (uint64, error) {
	var highest uint64
	err := s.db.View(func(tx *bbolt.Tx) error {
		highest = decode(tx.Bucket(bucket).Get([]byte(key)))
		return nil
	})
	return highest, err
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func encode(token uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, token)
}

func decode(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}
