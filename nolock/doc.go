// Package nolock holds the lock-free alternatives to a distributed lock:
// one atomic operation of the database you already have, which stays
// correct however long a process pauses, because nothing depends on timing.
// The article fence grew from puts it so: often, skip the lock.
//
//	instead of locking...              use
//	read, modify, write a row          UpdateVersioned (and Optimistic to retry)
//	"only one job runs"                Once: a job key inserted once, in the job's transaction
//	"process each event once"          Idempotent: an idempotency key and the stored result
//	"serialise changes per account"    Serializer (one writer per key), Partition
//	inventory decrement                Decrement: UPDATE ... SET qty = qty - n WHERE qty >= n
//
// The SQL helpers work with database/sql on PostgreSQL (through
// github.com/jackc/pgx/v5/stdlib) and SQLite (modernc.org/sqlite); every
// table and column name is quoted, and every value is a parameter. For
// SQLite, open the database with a busy timeout and immediate transactions
// (sqlitefence.DSN does both), or concurrent writers get SQLITE_BUSY.
//
// Leader election, the article's last row, is fence's own: client.Election.
package nolock
