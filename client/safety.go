package client

import (
	"fmt"
	"time"

	"github.com/fencelock/fence"
)

// safety is how much earlier than the leader a session or a lease counts
// itself lost: its "safe until" is shortened by a bound on clock drift
// between client and leader, and by a fixed margin (WithSafety,
// WithLeaseSafety).
type safety struct {
	drift  float64
	margin time.Duration
}

// defaultSafety allows 1% of drift and a 100ms margin.
var defaultSafety = safety{drift: 0.01, margin: 100 * time.Millisecond}

// check refuses a drift outside [0, 1) and a negative margin.
func (sf safety) check() error {
	if sf.drift < 0 || sf.drift >= 1 || sf.margin < 0 {
		return fmt.Errorf("%w: drift must be in [0, 1) and margin not negative", fence.ErrInvalidArgument)
	}
	return nil
}

// safeUntil is how long a grant of ttl, asked for by a call sent at sent,
// is safe to act on: sent + ttl*(1-drift) - margin.
func (sf safety) safeUntil(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(time.Duration(float64(ttl)*(1-sf.drift)) - sf.margin)
}
