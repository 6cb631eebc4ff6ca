package k8sleader

import "time"

// SetNow replaces the clock that decides when a Lock that lost its lease
// may take a new one, so that a test need not wait a lease duration.
func SetNow(l *Lock, now func() time.Time) { l.now = now }
