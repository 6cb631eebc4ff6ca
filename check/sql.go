package check

import (
	"context"
	"errors"
)

// sqlCounter is the fenced SQL counter of a run. It needs the fenced SQL
// store; until that is wired in, a run with a DSN fails to start.
type sqlCounter struct{}

func openSQLCounter(ctx context.Context, dsn, prefix string) (*sqlCounter, error) {
	return nil, errors.New("--postgres is not supported yet")
}

func (s *sqlCounter) value(ctx context.Context) (int64, error) { return 0, nil }

func (s *sqlCounter) Close() error { return nil }

// OpenSQLTarget opens the fenced SQL counter for a worker.
func OpenSQLTarget(ctx context.Context, dsn, prefix string) (SQLTarget, error) {
	return nil, errors.New("--postgres is not supported yet")
}
